//! The agent's memory breakdown in words, for `memprof report` and `memprof
//! profile`'s summary (through [`super::agent_sections`]): what holds
//! the memory of the job's heaviest rank (parameters, gradients, optimizer
//! state, per-sample gradients, activations), by module type, its largest
//! parameters and layers, DP-SGD's norms and temporary matrices, and what
//! the agent flagged.

use memprof_analysis::breakdown::weight;
use memprof_api::agent::RowsLeftOut;
use memprof_api::{format_bytes, MemoryBreakdown};
use std::fmt::Write;

/// Appends the breakdown to `out`, indented as the rest of `memprof report`.
pub fn render_breakdown(out: &mut String, b: &MemoryBreakdown) {
    header(out, b);
    parts(out, b);
    parameters(out, b);
    module_types(out, b);
    parameter_rows(out, b);
    layer_rows(out, b);
    dp_sgd(out, b);
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
/// how much of it holds gradients (trainable, as measured).
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

/// The header of a list of rows: how many of how many, and what the rest
/// adds up to, so that rows left out are never silently lost.
fn rows_header(out: &mut String, what: &str, shown: usize, left: Option<&RowsLeftOut>) {
    match left.filter(|l| l.rows > 0) {
        Some(l) => {
            let _ = writeln!(
                out,
                "    largest {what} ({shown} of {}; the other {}: {} parameters, {}):",
                shown as u64 + l.rows,
                l.rows,
                count(l.parameters),
                format_bytes(l.bytes)
            );
        }
        None => {
            let _ = writeln!(out, "    {what} (all {shown}):");
        }
    }
}

/// The name column's width: the longest name shown, at most 48 (a longer
/// name pushes its row, never cut).
fn name_width<'a>(names: impl Iterator<Item = &'a str>) -> usize {
    names.map(str::len).max().unwrap_or(0).clamp(8, 48)
}

fn parameter_rows(out: &mut String, b: &MemoryBreakdown) {
    if b.parameter_rows.is_empty() {
        return;
    }
    rows_header(
        out,
        "parameters",
        b.parameter_rows.len(),
        b.parameters_left_out.as_ref(),
    );
    let w = name_width(b.parameter_rows.iter().map(|r| r.name.as_str()));
    let _ = writeln!(
        out,
        "      {:<w$} {:>14} {:>9} {:>10}  TRAINABLE",
        "NAME", "SHAPE", "DTYPE", "BYTES"
    );
    for r in &b.parameter_rows {
        let shape: Vec<String> = r.shape.iter().map(u64::to_string).collect();
        let _ = writeln!(
            out,
            "      {:<w$} {:>14} {:>9} {:>10}  {}",
            r.name,
            if shape.is_empty() {
                "scalar".to_string()
            } else {
                shape.join("x")
            },
            r.dtype,
            format_bytes(r.bytes),
            if r.trainable { "yes" } else { "no" }
        );
    }
}

fn layer_rows(out: &mut String, b: &MemoryBreakdown) {
    if b.layer_rows.is_empty() {
        return;
    }
    rows_header(
        out,
        "layers",
        b.layer_rows.len(),
        b.layers_left_out.as_ref(),
    );
    let w = name_width(b.layer_rows.iter().map(|r| r.name.as_str()));
    let _ = writeln!(
        out,
        "      {:<w$} {:>9} {:>10} {:>10}",
        "LAYER", "PARAMS", "TRAINABLE", "BYTES"
    );
    for r in &b.layer_rows {
        let _ = writeln!(
            out,
            "      {:<w$} {:>9} {:>10} {:>10}",
            r.name,
            count(r.parameters),
            count(r.trainable_parameters),
            format_bytes(r.bytes)
        );
    }
}

/// DP-SGD's memory beside the per-sample gradients (seed 004), each
/// number with whether it was measured or modelled.
fn dp_sgd(out: &mut String, b: &MemoryBreakdown) {
    let Some(d) = &b.dp_sgd else {
        return;
    };
    let samples = d
        .samples
        .map(|s| format!("{s} samples, "))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "    DP-SGD ({samples}{} parameters with per-sample state):",
        d.parameters
    );
    let how = if d.norms_source == "measured" {
        "measured: the parameters' _norm_sample"
    } else {
        "modelled: what the optimizer's clipping allocates"
    };
    let _ = writeln!(
        out,
        "      {:<29} {:>10}  {how}",
        "per-sample gradient norms",
        format_bytes(d.norms_bytes)
    );
    match (d.temp_matrices_bytes, d.sequence_length) {
        (Some(t), Some(len)) => {
            let _ = writeln!(
                out,
                "      {:<29} {:>10}  modelled: ghost clipping's ggT + aaT, 2 x {} x {len}^2 elements",
                "temporary matrices (peak)",
                format_bytes(t),
                d.samples.unwrap_or(0)
            );
        }
        _ => {
            let _ = writeln!(
                out,
                "      {:<29} {:>10}  (ghost clipping only; pass sequence_length to breakdown())",
                "temporary matrices (peak)", "-"
            );
        }
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
    use memprof_api::agent::{DpSgd, LayerRow, ParameterRow};
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

    fn with_rows() -> MemoryBreakdown {
        let mut b = lora();
        b.parameter_rows = vec![
            ParameterRow {
                name: "lm_head.weight".into(),
                shape: vec![4000, 256],
                dtype: "float32".into(),
                bytes: 4_096_000,
                trainable: false,
            },
            ParameterRow {
                name: "layers.0.attn.q_proj.lora_A.default.weight".into(),
                shape: vec![8, 256],
                dtype: "bfloat16".into(),
                bytes: 4096,
                trainable: true,
            },
        ];
        b.parameters_left_out = Some(RowsLeftOut {
            rows: 50,
            parameters: 2_000_000,
            bytes: 8 * M,
        });
        b.layer_rows = vec![LayerRow {
            name: "layers.0".into(),
            parameters: 1_000_000,
            trainable_parameters: 8192,
            bytes: 4 * M,
        }];
        b
    }

    #[test]
    fn parameter_and_layer_rows_with_what_they_leave_out() {
        let mut out = String::new();
        render_breakdown(&mut out, &with_rows());
        for want in [
            "largest parameters (2 of 52; the other 50: 2.0M parameters, 8.0MiB):",
            "NAME                                                SHAPE     DTYPE      BYTES  TRAINABLE",
            "lm_head.weight                                   4000x256   float32     3.9MiB  no",
            "layers.0.attn.q_proj.lora_A.default.weight          8x256  bfloat16     4.0KiB  yes",
            "layers (all 1):",
            "LAYER       PARAMS  TRAINABLE      BYTES",
            "layers.0      1.0M       8192     4.0MiB",
        ] {
            assert!(out.contains(want), "{want:?} not in:\n{out}");
        }
        assert!(!out.contains("DP-SGD"), "{out}");
    }

    #[test]
    fn dp_sgd_says_what_was_measured_and_what_modelled() {
        let mut b = lora();
        b.dp_sgd = Some(DpSgd {
            samples: Some(32),
            parameters: 12,
            norms_bytes: 1536,
            norms_source: "measured".into(),
            temp_matrices_bytes: Some(4 << 30),
            sequence_length: Some(4096),
        });
        let mut out = String::new();
        render_breakdown(&mut out, &b);
        assert!(
            out.contains("DP-SGD (32 samples, 12 parameters with per-sample state):"),
            "{out}"
        );
        assert!(
            out.contains(
                "per-sample gradient norms         1.5KiB  measured: the parameters' _norm_sample"
            ),
            "{out}"
        );
        assert!(out.contains("temporary matrices (peak)         4.0GiB  modelled: ghost clipping's ggT + aaT, 2 x 32 x 4096^2 elements"), "{out}");
        let d = b.dp_sgd.as_mut().unwrap();
        d.norms_source = "modelled".into();
        d.temp_matrices_bytes = None;
        let mut out = String::new();
        render_breakdown(&mut out, &b);
        assert!(
            out.contains("modelled: what the optimizer's clipping allocates"),
            "{out}"
        );
        assert!(
            out.contains("temporary matrices (peak)              -  (ghost clipping only"),
            "{out}"
        );
    }
}
