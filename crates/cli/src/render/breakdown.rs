//! The agent's memory breakdown in words, for `memprof report` and `memprof
//! profile`'s summary (through [`super::agent_sections`]): what holds
//! the memory of the job's heaviest rank (parameters, gradients, optimizer
//! state, per-sample gradients, activations), by module type, and what the
//! agent flagged.

use memprof_analysis::breakdown::weight;
use memprof_api::{format_bytes, MemoryBreakdown};
use std::fmt::Write;

/// Appends the breakdown to `out`, indented as the rest of `memprof report`.
pub fn render_breakdown(out: &mut String, b: &MemoryBreakdown) {
    header(out, b);
    parts(out, b);
    parameters(out, b);
    module_types(out, b);
    flags(out, b);
    phases(out, b);
}

fn header(out: &mut String, b: &MemoryBreakdown) {
    let mut about = Vec::new();
    if let Some(r) = b.rank {
        about.push(format!("rank {r}"));
    }
    if let Some(p) = &b.pod {
        about.push(format!("pod {p}"));
    }
    if let Some(s) = b.step {
        about.push(format!("step {s}"));
    }
    if let Some(n) = b.batch_size {
        about.push(format!("batch {n}"));
    }
    let what = if b.activations_peak_bytes.is_some() {
        "at the step's peak"
    } else {
        "static, activations not measured"
    };
    let _ = writeln!(
        out,
        "  memory breakdown ({}): {} {what}",
        about.join(", "),
        format_bytes(weight(b))
    );
}

/// One line per part with its share of what must fit.
fn parts(out: &mut String, b: &MemoryBreakdown) {
    let whole = weight(b).max(1) as f64;
    let rows = [
        ("parameters", Some(b.parameters_bytes)),
        ("gradients", Some(b.gradients_bytes)),
        ("optimizer state", Some(b.optimizer_bytes)),
        ("per-sample gradients", b.per_sample_gradients_bytes),
        ("activations (peak)", b.activations_peak_bytes),
    ];
    for (name, bytes) in rows {
        match bytes {
            Some(v) => {
                let _ = writeln!(
                    out,
                    "    {name:<21} {:>10}  {:>5.1}%",
                    format_bytes(v),
                    100.0 * v as f64 / whole
                );
            }
            None => {
                let _ = writeln!(out, "    {name:<21} {:>10}", "-");
            }
        }
    }
    let other = b.static_bytes.saturating_sub(
        b.parameters_bytes
            .saturating_add(b.gradients_bytes)
            .saturating_add(b.optimizer_bytes)
            .saturating_add(b.per_sample_gradients_bytes.unwrap_or(0)),
    );
    if other > 0 {
        let _ = writeln!(
            out,
            "    {:<21} {:>10}  {:>5.1}%",
            "other static",
            format_bytes(other),
            100.0 * other as f64 / whole
        );
    }
}

fn parameters(out: &mut String, b: &MemoryBreakdown) {
    let share = 100.0 * b.trainable_parameters as f64 / b.total_parameters.max(1) as f64;
    let _ = writeln!(
        out,
        "    parameters: {} total, {} trainable ({share:.2}%)",
        count(b.total_parameters),
        count(b.trainable_parameters)
    );
}

/// One row per module type: what the agent sends (its parameters and
/// their weights, gradients and optimizer state), and what follows from it:
/// the share of the model, the width of a weight (bytes per parameter) and
/// how much of it holds gradients (trainable, as measured). The agent sends
/// no per-parameter or per-layer rows (docs/cli.md says what field would).
fn module_types(out: &mut String, b: &MemoryBreakdown) {
    if b.by_module_type.is_empty() {
        return;
    }
    let _ = writeln!(out, "    by module type:");
    let _ = writeln!(
        out,
        "      {:<10} {:>9} {:>6} {:>7} {:>10} {:>10} {:>10}  TRAINABLE",
        "TYPE", "PARAMS", "SHARE", "WIDTH", "WEIGHTS", "GRADIENTS", "OPTIMIZER"
    );
    let all = b
        .total_parameters
        .max(b.by_module_type.iter().map(|m| m.parameters).sum())
        .max(1);
    for m in &b.by_module_type {
        let _ = writeln!(
            out,
            "      {:<10} {:>9} {:>5.1}% {:>7} {:>10} {:>10} {:>10}  {}",
            m.type_.as_str(),
            count(m.parameters),
            100.0 * m.parameters as f64 / all as f64,
            width(m.parameters_bytes, m.parameters),
            format_bytes(m.parameters_bytes),
            format_bytes(m.gradients_bytes),
            format_bytes(m.optimizer_bytes),
            trainable(m.gradients_bytes, m.parameters_bytes)
        );
    }
    let _ = writeln!(
        out,
        "      (WIDTH: bytes per parameter; TRAINABLE: the share of the weights holding gradients when measured, none before the first backward)"
    );
}

/// The width of a weight from bytes per parameter: `16-bit` for 2 bytes
/// (within 6 %: a module type's count includes a few odd buffers), else
/// the bytes themselves (`3.1 B`: mixed precisions).
fn width(bytes: u64, params: u64) -> String {
    if params == 0 {
        return "-".into();
    }
    let per = bytes as f64 / params as f64;
    for b in [1.0, 2.0, 4.0, 8.0] {
        if (per - b).abs() <= 0.06 * b {
            return format!("{}-bit", b as u32 * 8);
        }
    }
    format!("{per:.1} B")
}

/// How much of a module type's weights have gradients, as gradient bytes
/// against weight bytes (gradients take their parameter's dtype).
fn trainable(gradients: u64, weights: u64) -> String {
    if gradients == 0 {
        return "none".into();
    }
    let share = gradients as f64 / weights.max(1) as f64;
    if share >= 0.95 {
        "all".into()
    } else {
        format!("~{:.0}%", 100.0 * share)
    }
}

fn flags(out: &mut String, b: &MemoryBreakdown) {
    for f in &b.flags {
        let note = if f.note.is_empty() {
            String::new()
        } else {
            format!(": {}", f.note)
        };
        let _ = writeln!(
            out,
            "    flag {}: {}{note}",
            f.kind.as_str(),
            if f.parameter.is_empty() {
                "-"
            } else {
                &f.parameter
            }
        );
    }
}

fn phases(out: &mut String, b: &MemoryBreakdown) {
    if !b.phases.is_empty() {
        let _ = writeln!(
            out,
            "    by top-level module (kept after forward / backward peak above its start):"
        );
        for p in &b.phases {
            let _ = writeln!(
                out,
                "      {:<24} {:>10} / +{}",
                p.module,
                format!("+{}", format_bytes(p.forward_bytes)),
                format_bytes(p.backward_bytes)
            );
        }
    }
    if let Some(o) = b.optimizer_step_peak_bytes {
        let _ = writeln!(out, "    optimizer step peak: +{}", format_bytes(o));
    }
}

/// A parameter count for humans: `124.4M`, `800.0K`, `12`.
fn count(n: u64) -> String {
    match n {
        0..=9_999 => n.to_string(),
        10_000..=999_999 => format!("{:.1}K", n as f64 / 1e3),
        1_000_000..=999_999_999 => format!("{:.1}M", n as f64 / 1e6),
        _ => format!("{:.2}B", n as f64 / 1e9),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use memprof_api::{FlagKind, ModulePhase, ModuleType, ModuleTypeBytes, ParameterFlag};

    const M: u64 = 1 << 20;

    /// A LoRA fine-tune's breakdown, also shown by `memprof report`'s tests.
    pub(crate) fn lora() -> MemoryBreakdown {
        MemoryBreakdown {
            pod: Some("train-2".into()),
            rank: Some(2),
            step: Some(3),
            batch_size: Some(16),
            total_parameters: 124_440_000,
            trainable_parameters: 811_000,
            parameters_bytes: 500 * M,
            gradients_bytes: 3 * M,
            optimizer_bytes: 6 * M,
            static_bytes: 509 * M,
            activations_peak_bytes: Some(1491 * M),
            by_module_type: vec![
                ModuleTypeBytes {
                    type_: ModuleType::Attention,
                    parameters: 28_000_000,
                    parameters_bytes: 112 * M,
                    ..Default::default()
                },
                ModuleTypeBytes {
                    type_: ModuleType::Lora,
                    parameters: 811_000,
                    parameters_bytes: 3 * M,
                    gradients_bytes: 3 * M,
                    optimizer_bytes: 6 * M,
                },
            ],
            flags: vec![ParameterFlag {
                kind: FlagKind::Nan,
                parameter: "h.3.mlp.c_fc.weight".into(),
                note: "2 NaN".into(),
            }],
            phases: vec![ModulePhase {
                module: "transformer".into(),
                forward_bytes: 1200 * M,
                backward_bytes: 300 * M,
            }],
            optimizer_step_peak_bytes: Some(12 * M),
            ..Default::default()
        }
    }

    #[test]
    fn parts_with_shares_module_types_trainable_flags_and_phases() {
        let mut out = String::new();
        render_breakdown(&mut out, &lora());
        for want in [
            "memory breakdown (rank 2, pod train-2, step 3, batch 16): 2.0GiB at the step's peak",
            "parameters                500MiB   25.0%",
            "optimizer state           6.0MiB    0.3%",
            "per-sample gradients           -",
            "activations (peak)        1.5GiB   74.5%",
            "parameters: 124.4M total, 811.0K trainable (0.65%)",
            "TYPE          PARAMS  SHARE   WIDTH    WEIGHTS  GRADIENTS  OPTIMIZER  TRAINABLE",
            "lora          811.0K   0.7%  32-bit     3.0MiB     3.0MiB     6.0MiB  all",
            "attention      28.0M  22.5%  32-bit     112MiB         0B         0B  none",
            "flag nan: h.3.mlp.c_fc.weight: 2 NaN",
            "transformer                 +1.2GiB / +300MiB",
            "optimizer step peak: +12.0MiB",
        ] {
            assert!(out.contains(want), "{want:?} not in:\n{out}");
        }
        assert!(!out.contains("other static"), "{out}");
    }

    #[test]
    fn width_and_trainable_follow_from_the_bytes_the_agent_sends() {
        assert_eq!(width(2 * 1000, 1000), "16-bit");
        assert_eq!(width(4 * 1000 + 100, 1000), "32-bit", "a few buffers");
        assert_eq!(width(3 * 1000, 1000), "3.0 B", "mixed precisions");
        assert_eq!(width(0, 0), "-");
        assert_eq!(trainable(0, 100), "none");
        assert_eq!(trainable(100, 100), "all");
        assert_eq!(trainable(40, 100), "~40%");
    }

    #[test]
    fn without_activations_the_static_part_is_the_whole_and_extra_static_is_named() {
        let mut b = lora();
        b.activations_peak_bytes = None;
        b.per_sample_gradients_bytes = Some(100 * M);
        b.static_bytes = 609 * M + 91 * M;
        b.by_module_type.clear();
        b.phases.clear();
        b.optimizer_step_peak_bytes = None;
        let mut out = String::new();
        render_breakdown(&mut out, &b);
        assert!(
            out.contains("700MiB static, activations not measured"),
            "{out}"
        );
        assert!(
            out.contains("per-sample gradients      100MiB   14.3%"),
            "{out}"
        );
        assert!(out.contains("activations (peak)             -"), "{out}");
        assert!(
            out.contains("other static             91.0MiB   13.0%"),
            "{out}"
        );
        assert!(!out.contains("by module type") && !out.contains("optimizer step"));
    }
}
