//! Rolls MemoryReport specs (JSON files, as the standalone sidecar or
//! `nvml_probe monitor --report` writes them) up into a job's profile status,
//! as the operator does: `rollup_reports rank0.json rank1.json`.

use anyhow::Context;
use memprof::analysis::{rollup, validate_report, RollupInput};
use memprof::api::MemoryReportSpec;

fn main() -> anyhow::Result<()> {
    let paths: Vec<String> = std::env::args().skip(1).collect();
    anyhow::ensure!(!paths.is_empty(), "usage: rollup_reports REPORT.json...");
    let mut specs = Vec::new();
    for p in &paths {
        let text = std::fs::read(p).with_context(|| format!("cannot read {p}"))?;
        let v: serde_json::Value =
            serde_json::from_slice(&text).with_context(|| format!("{p} is not JSON"))?;
        // A whole MemoryReport object or just its spec.
        let spec: MemoryReportSpec = serde_json::from_value(v.get("spec").cloned().unwrap_or(v))
            .with_context(|| format!("{p} is not a MemoryReport spec"))?;
        validate_report(&spec).map_err(|e| anyhow::anyhow!("{p}: {e}"))?;
        specs.push(spec);
    }
    let inputs: Vec<RollupInput<'_>> = specs.iter().map(|spec| RollupInput { spec }).collect();
    let status = rollup(&inputs, Some(specs.len() as u32));
    println!("{}", serde_json::to_string_pretty(&status)?);
    Ok(())
}
