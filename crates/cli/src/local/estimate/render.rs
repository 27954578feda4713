//! `memprof estimate` for a person: the parts of rank 0's peak, what was
//! modelled and what measured, the verdict, the bisection and the error on
//! the recorded points; and `--accuracy`, the error table per point.

use super::calibration::{self, Accuracy, Calibration};
use super::verdict::{gib_down, gib_up};
use super::Estimate;
use crate::output::Table;
use memprof_api::format_bytes;
use std::fmt::Write as _;

fn parts(e: &Estimate, cal: &Calibration) -> Table {
    let r = &e.ranks[0];
    let on = format!("measured on {}", cal.gpu);
    let mut t = Table::new(["PART", "BYTES", "HOW"]).align_right([1]);
    let mut row = |name: &str, bytes: u64, how: &str| {
        t.row([name.to_string(), format_bytes(bytes), how.to_string()])
    };
    row("parameters", r.run.parameters_bytes, "fake run");
    row("gradients", r.run.gradients_bytes, "fake run");
    row("optimizer state", r.run.optimizer_bytes, "fake run");
    row("activations", r.run.activations_bytes, "fake run");
    row("temporaries", r.run.temporaries_bytes, "fake run");
    row(
        "buffers and other",
        r.run.buffers_bytes + r.run.other_bytes,
        "fake run",
    );
    row("cuBLAS workspace", r.workspace_bytes, &on);
    row(
        "allocator rounding",
        r.allocator_rounding_bytes,
        "modelled: 512 B blocks, unsplit remainders",
    );
    row(
        "allocator reserve",
        r.allocator_reserve_bytes,
        "modelled: 2 MiB / 20 MiB segments, cache",
    );
    row("CUDA context", r.context_bytes, &on);
    if e.world_size > 1 {
        row("NCCL buffers", r.nccl_bytes, &format!("{on}, 2 ranks"));
    }
    t
}

/// The estimate as text.
pub fn table(e: &Estimate, cal: &Calibration) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} ({} GiB), {} rank{}, torch {} ({}): rank 0 at its peak{}",
        e.gpu,
        gib_down(e.gpu_total_bytes),
        e.world_size,
        if e.world_size == 1 {
            ""
        } else {
            "s, each the same as rank 0"
        },
        e.torch.as_deref().unwrap_or("?"),
        e.tracker.as_deref().unwrap_or("?"),
        e.ranks[0]
            .run
            .value
            .as_ref()
            .map_or(String::new(), |v| format!(" (value {v})")),
    );
    s.push_str(&parts(e, cal).render());
    let v = &e.verdict;
    let _ = writeln!(s, "predicted peak   {} GiB", gib_up(v.predicted_bytes));
    let _ = writeln!(
        s,
        "with the margin  {} GiB (reserved part + {:.1} %, the worst under-estimate recorded)",
        gib_up(v.upper_bound_bytes),
        e.accuracy.worst_reserved_under_pct
    );
    let _ = writeln!(s, "verdict: {}", v.text);
    s.push_str(&annotations(e));
    if let Some(vary) = &e.vary {
        s.push_str(&vary_line(vary));
    }
    s.push_str(&expected_error(&e.accuracy));
    s
}

/// The Job annotations that carry this verdict to admission, where the
/// webhook warns when the peak exceeds the card (docs/install.md): the peak
/// judged (with the margin, rounded up) against the card's memory.
fn annotations(e: &Estimate) -> String {
    let v = &e.verdict;
    format!(
        "to be warned at admission, annotate the Job:\n  \
         memprof.dev/predicted-peak: \"{}GiB\"\n  \
         memprof.dev/gpu-memory: \"{}GiB\"\n  \
         memprof.dev/predicted-by: \"memprof estimate (with the calibration's worst under-estimate)\"\n",
        gib_up(v.upper_bound_bytes),
        gib_down(v.capacity_bytes),
    )
}

fn vary_line(vary: &serde_json::Value) -> String {
    let name = vary["name"].as_str().unwrap_or("?");
    let tried: Vec<String> = vary["tried"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            format!(
                "{} {}",
                t["value"].as_str().unwrap_or("?"),
                if t["fits"] == true {
                    "fits"
                } else {
                    "does not"
                }
            )
        })
        .collect();
    match vary["largest"].as_str() {
        Some(v) => format!(
            "largest {name} that fits: {v} (tried {})\n",
            tried.join(", ")
        ),
        None => format!("no {name} tried fits (tried {})\n", tried.join(", ")),
    }
}

/// One line: the expected error, from the recorded points.
pub fn expected_error(a: &Accuracy) -> String {
    let profiled = match a.profiled {
        0 => String::new(),
        n => format!(" ({n} of them profiled runs, --points)"),
    };
    format!(
        "expected error: median {:.1} % allocated, {:.1} % reserved on {} held-out runs{profiled} on {}; worst under-estimate {:.1} % allocated, {:.1} % reserved (memprof estimate --accuracy)\n",
        a.median_allocated_pct, a.median_reserved_pct, a.held_out, a.gpu, a.worst_allocated_under_pct, a.worst_reserved_under_pct
    )
}

/// `--accuracy`: each recorded point, then the summary.
pub fn accuracy_table(cal: &Calibration, a: &Accuracy) -> String {
    let mut t = Table::new([
        "RUN",
        "SPLIT",
        "ALLOCATED",
        "ESTIMATE",
        "ERROR",
        "RESERVED",
        "ESTIMATE",
        "ERROR",
    ])
    .align_right([2, 3, 4, 5, 6, 7]);
    for p in calibration::usable(cal) {
        let (ra, ea) = (p.real.allocated, p.estimate.allocated_peak_bytes);
        let (rr, er) = (p.real.reserved, p.estimate.reserved_peak_bytes);
        t.row([
            p.name.clone(),
            p.split.clone(),
            format_bytes(ra),
            format_bytes(ea),
            format!("{:+.1}%", calibration::error_pct(ea, ra)),
            format_bytes(rr),
            format_bytes(er),
            format!("{:+.1}%", calibration::error_pct(er, rr)),
        ]);
    }
    let mut s = format!("recorded on {} with torch {}\n", cal.gpu, cal.torch);
    s.push_str(&t.render());
    s.push_str(&expected_error(a));
    let oom = &a.would_oom_with_calibration_margin;
    let _ = writeln!(
        s,
        "a margin from the calibration runs alone would have called {} fitting on a card as small as its real peak; the margin used is the worst of all runs",
        if oom.is_empty() { "no held-out run".to_string() } else { oom.join(", ") }
    );
    s
}
