//! `memprof compare A B`: two configurations side by side. Two existing
//! files go to the sweep's file comparison (`compare_files`); otherwise A and
//! B are Jobs (`JOB` or `NAMESPACE/JOB`) and their MemoryProfiles are compared:
//! peak, risk, time to OOM, batch size, imbalance, GPUs. Rendering is pure
//! ([`render`]); [`run`] only fetches.

use crate::kube::client::{self as k, CliError, KubeArgs};
use crate::output::printer::{Kind, Output, OutputParser};
use crate::output::{self, Format, Table};
use k8s_openapi::api::batch::v1::Job;
use kube::api::Api;
use memprof_api::{format_bytes, format_duration, MemoryProfile};
use serde::Serialize;

/// Flags of `memprof compare`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// First: a Job (`JOB` or `NAMESPACE/JOB`), or a sweep result / report file.
    pub a: String,
    /// Second: same kind as the first.
    pub b: String,
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Output format: table, wide, json, yaml, jsonpath=TEMPLATE, jsonpath-file=FILE
    /// (the template reads what -o json prints).
    #[arg(short = 'o', long = "output", value_name = "FORMAT", default_value = "table", value_parser = OutputParser(FORMATS))]
    pub output: Output,
}

/// What `compare` prints: a comparison, not objects (so no `name` or
/// `custom-columns`).
pub const FORMATS: &[Kind] = &[
    Kind::Table,
    Kind::Wide,
    Kind::Json,
    Kind::Yaml,
    Kind::JsonPath,
];

/// The `-o` of a table or structured format (jsonpath: JSON, which the
/// template then reads).
pub fn format_of(o: &Output) -> Format {
    match o {
        Output::Wide => Format::Wide,
        Output::Yaml => Format::Yaml,
        Output::Table => Format::Table,
        _ => Format::Json,
    }
}

/// `text` (JSON, as printed for `-o json`) through the jsonpath template of
/// `o`, if it has one.
pub fn apply_template(o: &Output, text: String) -> String {
    match o {
        Output::JsonPath(t) => {
            let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            t.render(&crate::output::jsonpath::go_numbers(v))
        }
        _ => text,
    }
}

/// Compares two Jobs' profiles; returns the process exit code. (Two files
/// are compared by [`crate::local::compare_files`]; [`crate::compare`] picks.)
pub async fn run(args: Args) -> Result<i32, CliError> {
    let (client, ns) = args.kube.connect().await?;
    let mut sides = Vec::new();
    for arg in [&args.a, &args.b] {
        let (ns, job) = k::split_ref(arg, &ns);
        let profile = k::get_profile(&client, ns, job).await?;
        let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
        // The Job may be gone while its profile is not: batch size is then unknown.
        let job_obj = jobs.get_opt(&profile.spec.job_name).await.ok().flatten();
        sides.push(side(&profile, job_obj.as_ref()));
    }
    let text = render(&sides[0], &sides[1], format_of(&args.output));
    output::print(&apply_template(&args.output, text));
    Ok(0)
}

/// One Job's configuration and outcome.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Side {
    /// `namespace/job`.
    pub job: String,
    /// Highest peak of any GPU, bytes.
    pub peak_used_bytes: u64,
    /// That peak, percent of its GPU.
    pub peak_percent: f64,
    /// Worst risk.
    pub risk: String,
    /// Smallest time to OOM, seconds.
    pub time_to_oom_seconds: Option<f64>,
    /// What would cause the OOM (`leak`, `neighbour`, ...), when named.
    pub cause: Option<String>,
    /// BATCH_SIZE from the Job's env, else the batch-fit recommendation's `current`.
    pub batch_size: Option<String>,
    /// Max/mean of per-GPU peaks.
    pub imbalance: Option<f64>,
    /// GPUs reporting.
    pub gpus: u32,
    /// `reporting/expected`.
    pub ranks: String,
    /// GPU OOMs observed.
    pub ooms: usize,
    /// Leak suspected.
    pub leak_suspected: bool,
}

/// What compare shows of one Job (pure).
pub fn side(p: &MemoryProfile, job: Option<&Job>) -> Side {
    let st = p.status.clone().unwrap_or_default();
    let from_status = serde_json::to_value(&st).ok().and_then(|v| {
        let cur = &v["batchRecommendation"]["current"];
        cur.as_u64().map(|n| n.to_string())
    });
    Side {
        job: format!(
            "{}/{}",
            p.metadata.namespace.as_deref().unwrap_or("-"),
            p.spec.job_name
        ),
        peak_used_bytes: st.peak_used_bytes,
        peak_percent: st.peak_percent,
        risk: st.risk.to_string(),
        time_to_oom_seconds: st.time_to_oom_seconds,
        cause: st.cause.as_ref().map(|c| c.cause.to_string()),
        batch_size: job.and_then(batch_env).or(from_status),
        imbalance: st.imbalance,
        gpus: st.gpu_count,
        ranks: st.ranks,
        ooms: st.ooms.len(),
        leak_suspected: st.leak_suspected,
    }
}

/// The first `BATCH_SIZE` env value of the Job's containers.
fn batch_env(job: &Job) -> Option<String> {
    let spec = job.spec.as_ref()?.template.spec.as_ref()?;
    spec.containers
        .iter()
        .flat_map(|c| c.env.iter().flatten())
        .find(|e| e.name == "BATCH_SIZE")
        .and_then(|e| e.value.clone())
}

/// Side by side: one row per quantity, a column per Job (or both as objects).
pub fn render(a: &Side, b: &Side, format: Format) -> String {
    if format.is_structured() {
        return output::structured(&serde_json::json!({"a": a, "b": b}), format);
    }
    let peak = |s: &Side| {
        format!(
            "{} ({:.0}%)",
            format_bytes(s.peak_used_bytes),
            s.peak_percent
        )
    };
    let tto = |s: &Side| s.time_to_oom_seconds.map_or("-".into(), format_duration);
    let batch = |s: &Side| s.batch_size.clone().unwrap_or_else(|| "-".into());
    let imb = |s: &Side| s.imbalance.map_or("-".into(), |i| format!("{i:.2}"));
    let diff_peak = if a.peak_used_bytes > 0 {
        let d = (b.peak_used_bytes as f64 / a.peak_used_bytes as f64 - 1.0) * 100.0;
        format!("{d:+.0}%")
    } else {
        "-".into()
    };
    let mut t = Table::new(["", a.job.as_str(), b.job.as_str(), "B vs A"]);
    t.row(["PEAK".into(), peak(a), peak(b), diff_peak]);
    t.row(["RISK".into(), a.risk.clone(), b.risk.clone(), String::new()]);
    t.row(["TTO".into(), tto(a), tto(b), String::new()]);
    let cause = |s: &Side| s.cause.clone().unwrap_or_else(|| "-".into());
    t.row(["CAUSE".into(), cause(a), cause(b), String::new()]);
    t.row(["BATCH SIZE".into(), batch(a), batch(b), String::new()]);
    t.row(["IMBALANCE".into(), imb(a), imb(b), String::new()]);
    t.row([
        "GPUS".into(),
        a.gpus.to_string(),
        b.gpus.to_string(),
        String::new(),
    ]);
    t.row([
        "RANKS".into(),
        a.ranks.clone(),
        b.ranks.clone(),
        String::new(),
    ]);
    if format == Format::Wide {
        t.row([
            "OOMS".into(),
            a.ooms.to_string(),
            b.ooms.to_string(),
            String::new(),
        ]);
        let leak = |s: &Side| if s.leak_suspected { "yes" } else { "-" }.to_string();
        t.row(["LEAK".into(), leak(a), leak(b), String::new()]);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_per_quantity_columns_per_job_with_the_peak_change() {
        let a = Side {
            job: "ml/bs16".into(),
            peak_used_bytes: 40 << 30,
            peak_percent: 50.0,
            risk: "low".into(),
            batch_size: Some("16".into()),
            gpus: 4,
            ranks: "4/4".into(),
            ..Default::default()
        };
        let b = Side {
            job: "ml/bs32".into(),
            peak_used_bytes: 60 << 30,
            peak_percent: 75.0,
            risk: "high".into(),
            time_to_oom_seconds: Some(90.0),
            batch_size: Some("32".into()),
            imbalance: Some(1.25),
            gpus: 4,
            ranks: "4/4".into(),
            ..Default::default()
        };
        let out = render(&a, &b, Format::Table);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[0],
            "             ml/bs16         ml/bs32         B vs A"
        );
        assert_eq!(
            lines[1],
            "PEAK         40.0GiB (50%)   60.0GiB (75%)   +50%"
        );
        assert!(out.contains("BATCH SIZE   16"), "{out}");
        assert!(out.contains("TTO          -               1m30s"), "{out}");
    }
}
