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

fn module_types(out: &mut String, b: &MemoryBreakdown) {
    if b.by_module_type.is_empty() {
        return;
    }
    let _ = writeln!(out, "    by module type:");
    let _ = writeln!(
        out,
        "      {:<10} {:>9} {:>10} {:>10} {:>10}",
        "TYPE", "PARAMS", "WEIGHTS", "GRADIENTS", "OPTIMIZER"
    );
    for m in &b.by_module_type {
        let _ = writeln!(
            out,
            "      {:<10} {:>9} {:>10} {:>10} {:>10}",
            m.type_.as_str(),
            count(m.parameters),
            format_bytes(m.parameters_bytes),
            format_bytes(m.gradients_bytes),
            format_bytes(m.optimizer_bytes)
        );
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
            "lora          811.0K     3.0MiB     3.0MiB     6.0MiB",
            "attention      28.0M     112MiB         0B         0B",
            "flag nan: h.3.mlp.c_fc.weight: 2 NaN",
            "transformer                 +1.2GiB / +300MiB",
            "optimizer step peak: +12.0MiB",
        ] {
            assert!(out.contains(want), "{want:?} not in:\n{out}");
        }
        assert!(!out.contains("other static"), "{out}");
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
