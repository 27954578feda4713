//! `memprof compare A.json B.json` for files: two sweep results
//! (`memprof sweep --json`) or two reports (`memprof profile --output`, the
//! sidecar's `--output`, or a MemoryReport object): what grew, and where —
//! peaks, breakdown items, per configuration or per GPU. `compare.rs`
//! dispatches here when both arguments are files. Loading and comparing are
//! pure; [`run`] only reads the files and prints.

use crate::local::sweep::output::{SweepResult, KIND};
use crate::local::sweep::record::RunRecord;
use crate::output::{self, Format, Table};
use memprof_api::format_bytes;
use serde::Serialize;
use serde_json::Value;
use std::path::Path;

mod reports;
use reports::report_rows;

/// Why two files cannot be compared.
#[derive(Debug, thiserror::Error)]
pub enum CompareFilesError {
    /// A file could not be read.
    #[error("cannot read {path}: {error}; compare two files (memprof sweep --json, memprof profile --output) or two Jobs (JOB, NAMESPACE/JOB)")]
    Read {
        /// The file.
        path: String,
        /// Why.
        error: std::io::Error,
    },
    /// A file is neither a sweep result nor a report.
    #[error("{path} is not a sweep result (memprof sweep --json) nor a report (memprof profile --output): {why}")]
    Unknown {
        /// The file.
        path: String,
        /// What was wrong.
        why: LoadError,
    },
    /// One of each.
    #[error("{a} is a {ka} and {b} a {kb}: compare two sweep results or two reports")]
    Mixed {
        /// First file.
        a: String,
        /// Its kind.
        ka: &'static str,
        /// Second file.
        b: String,
        /// Its kind.
        kb: &'static str,
    },
}

/// A loaded file.
#[derive(Clone, Debug)]
pub enum Loaded {
    /// A `memprof sweep --json` result.
    Sweep(Box<SweepResult>),
    /// A report's spec, kept as JSON (older and newer reports alike).
    Report(Value),
}

impl Loaded {
    fn kind(&self) -> &'static str {
        match self {
            Loaded::Sweep(_) => "sweep result",
            Loaded::Report(_) => "report",
        }
    }
}

/// What a row's values measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Unit {
    /// Bytes.
    Bytes,
    /// Seconds.
    Seconds,
    /// Per second.
    PerSecond,
    /// A plain number.
    Number,
    /// Words (a status, a risk).
    Text,
}

/// One compared item.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    /// Where: a configuration (`BATCH_SIZE=8`), a GPU, a model, `report`.
    pub scope: String,
    /// What: `peak reserved`, `breakdown optimizerBytes`, `status`.
    pub item: String,
    /// Unit of `a` and `b`.
    pub unit: Unit,
    /// Value in the first file (null: absent there).
    pub a: Value,
    /// Value in the second file.
    pub b: Value,
    /// b − a, for numbers present in both.
    pub delta: Option<f64>,
    /// The change relative to a, percent.
    pub delta_percent: Option<f64>,
}

impl Row {
    fn changed(&self) -> bool {
        self.a != self.b
    }
}

/// The comparison of two files.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Comparison {
    /// `sweep` or `report`.
    pub kind: String,
    /// The first file.
    pub a: String,
    /// The second file.
    pub b: String,
    /// What grew most (bytes), and what changed state, in words.
    pub grew: Vec<String>,
    /// Every compared item.
    pub rows: Vec<Row>,
}

/// How many growths the headline names.
const HEADLINE: usize = 5;

/// Compares two files and prints the result; 0 when compared.
pub async fn run(a: &Path, b: &Path, format: Format) -> anyhow::Result<i32> {
    let c = compare_paths(a, b)?;
    output::print(&render(&c, format));
    Ok(0)
}

/// Whether a `compare` argument names a file rather than a Job: it exists,
/// or it ends as result files do (`.json`, `.yaml`, `.yml`). A missing
/// `r.json` is then a missing file, not a Job looked for in a cluster.
pub fn names_a_file(arg: &str) -> bool {
    let p = Path::new(arg);
    let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
    p.exists() || ["json", "yaml", "yml"].contains(&ext.to_ascii_lowercase().as_str())
}

/// Loads and compares two files.
pub fn compare_paths(a: &Path, b: &Path) -> Result<Comparison, CompareFilesError> {
    let (la, lb) = (load_path(a)?, load_path(b)?);
    compare(&a.display().to_string(), &la, &b.display().to_string(), &lb)
}

fn load_path(p: &Path) -> Result<Loaded, CompareFilesError> {
    let text = std::fs::read_to_string(p).map_err(|error| CompareFilesError::Read {
        path: p.display().to_string(),
        error,
    })?;
    load(&text).map_err(|why| CompareFilesError::Unknown {
        path: p.display().to_string(),
        why,
    })
}

/// Why a file is neither a sweep result nor a report (the file's error
/// says which two commands write the ones it takes).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Not JSON at all.
    #[error("not JSON ({0})")]
    NotJson(serde_json::Error),
    /// A sweep result of another memprof's format.
    #[error("a sweep result this memprof cannot read ({0})")]
    Sweep(serde_json::Error),
    /// JSON of something else.
    #[error("no \"kind\": \"memprofSweep\" and no \"gpus\" list")]
    Neither,
}

/// Recognises a sweep result (`"kind": "memprofSweep"`) or a report (a
/// spec with `gpus`, or an object with such a `spec`).
pub fn load(text: &str) -> Result<Loaded, LoadError> {
    let v: Value = serde_json::from_str(text).map_err(LoadError::NotJson)?;
    if v.get("kind").and_then(Value::as_str) == Some(KIND) {
        return serde_json::from_value(v)
            .map(|s| Loaded::Sweep(Box::new(s)))
            .map_err(LoadError::Sweep);
    }
    let spec = v.get("spec").filter(|s| s.is_object()).unwrap_or(&v);
    if spec.get("gpus").is_some_and(Value::is_array) {
        return Ok(Loaded::Report(spec.clone()));
    }
    Err(LoadError::Neither)
}

/// Compares two loaded files of the same kind.
pub fn compare(
    a_name: &str,
    a: &Loaded,
    b_name: &str,
    b: &Loaded,
) -> Result<Comparison, CompareFilesError> {
    let (kind, rows) = match (a, b) {
        (Loaded::Sweep(x), Loaded::Sweep(y)) => ("sweep", sweep_rows(x, y)),
        (Loaded::Report(x), Loaded::Report(y)) => ("report", report_rows(x, y)),
        _ => {
            return Err(CompareFilesError::Mixed {
                a: a_name.into(),
                ka: a.kind(),
                b: b_name.into(),
                kb: b.kind(),
            })
        }
    };
    Ok(Comparison {
        kind: kind.into(),
        a: a_name.into(),
        b: b_name.into(),
        grew: headline(&rows),
        rows,
    })
}

fn row(scope: &str, item: &str, unit: Unit, a: Value, b: Value) -> Row {
    let (delta, delta_percent) = match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => (Some(y - x), (x != 0.0).then(|| (y - x) / x.abs() * 100.0)),
        _ => (None, None),
    };
    Row {
        scope: scope.into(),
        item: item.into(),
        unit,
        a,
        b,
        delta,
        delta_percent,
    }
}

fn label(r: &RunRecord) -> String {
    let parts: Vec<String> = r.values.iter().map(|(k, v)| format!("{k}={v}")).collect();
    if parts.is_empty() {
        "(no variables)".into()
    } else {
        parts.join(" ")
    }
}

/// The breakdown's byte items compared; `byModuleType` per type.
const BREAKDOWN_ITEMS: [&str; 6] = [
    "parametersBytes",
    "gradientsBytes",
    "optimizerBytes",
    "perSampleGradientsBytes",
    "activationsPeakBytes",
    "staticBytes",
];

fn sweep_rows(a: &SweepResult, b: &SweepResult) -> Vec<Row> {
    let mut rows = vec![];
    let mut scopes: Vec<String> = a.runs.iter().map(label).collect();
    scopes.extend(
        b.runs
            .iter()
            .map(label)
            .filter(|l| !a.runs.iter().any(|r| &label(r) == l)),
    );
    for scope in scopes {
        let ra = a.runs.iter().find(|r| label(r) == scope);
        let rb = b.runs.iter().find(|r| label(r) == scope);
        rows.extend(run_rows(&scope, ra, rb));
    }
    for m in &a.models {
        let other = b
            .models
            .iter()
            .find(|n| n.variable == m.variable && n.fixed == m.fixed);
        let fixed: Vec<String> = m.fixed.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let scope = format!("model {} {}", m.variable, fixed.join(" "));
        let scope = scope.trim_end();
        let fit = |x: Option<&crate::local::sweep::model::Model>,
                   f: fn(&memprof_analysis::memmodel::Curve) -> f64| {
            x.and_then(|m| m.fit.as_ref())
                .map(|m| f(&m.curve))
                .map_or(Value::Null, Value::from)
        };
        rows.push(row(
            scope,
            "static",
            Unit::Bytes,
            fit(Some(m), |f| f.static_bytes),
            fit(other, |f| f.static_bytes),
        ));
        rows.push(row(
            scope,
            "per unit",
            Unit::Bytes,
            fit(Some(m), |f| f.per_unit_bytes),
            fit(other, |f| f.per_unit_bytes),
        ));
        let safe = |x: Option<&crate::local::sweep::model::Model>| {
            x.and_then(|m| m.largest_safe)
                .map_or(Value::Null, Value::from)
        };
        rows.push(row(
            scope,
            "largest safe",
            Unit::Number,
            safe(Some(m)),
            safe(other),
        ));
    }
    rows
}

fn run_rows(scope: &str, a: Option<&RunRecord>, b: Option<&RunRecord>) -> Vec<Row> {
    let get = |r: Option<&RunRecord>, f: &dyn Fn(&RunRecord) -> Value| r.map_or(Value::Null, f);
    let num = |o: Option<u64>| o.map_or(Value::Null, Value::from);
    let flo = |o: Option<f64>| o.map_or(Value::Null, Value::from);
    let mut rows = vec![
        row(
            scope,
            "status",
            Unit::Text,
            get(a, &|r| r.status.map_or(Value::Null, |s| s.word().into())),
            get(b, &|r| r.status.map_or(Value::Null, |s| s.word().into())),
        ),
        row(
            scope,
            "peak reserved",
            Unit::Bytes,
            get(a, &|r| num(r.peak_reserved_bytes)),
            get(b, &|r| num(r.peak_reserved_bytes)),
        ),
        row(
            scope,
            "peak allocated",
            Unit::Bytes,
            get(a, &|r| num(r.peak_allocated_bytes)),
            get(b, &|r| num(r.peak_allocated_bytes)),
        ),
        row(
            scope,
            "NVML peak",
            Unit::Bytes,
            get(a, &|r| num(r.nvml_peak_bytes)),
            get(b, &|r| num(r.nvml_peak_bytes)),
        ),
        row(
            scope,
            "step time",
            Unit::Seconds,
            get(a, &|r| flo(r.step_seconds_median)),
            get(b, &|r| flo(r.step_seconds_median)),
        ),
        row(
            scope,
            "tokens/s",
            Unit::PerSecond,
            get(a, &|r| flo(r.tokens_per_second)),
            get(b, &|r| flo(r.tokens_per_second)),
        ),
    ];
    let bd = |r: Option<&RunRecord>| r.and_then(|r| r.breakdown.clone()).unwrap_or(Value::Null);
    rows.extend(breakdown_rows(scope, &bd(a), &bd(b)));
    rows
}

fn breakdown_rows(scope: &str, a: &Value, b: &Value) -> Vec<Row> {
    let mut rows = vec![];
    if a.is_null() && b.is_null() {
        return rows;
    }
    for item in BREAKDOWN_ITEMS {
        let (x, y) = (
            a.get(item).cloned().unwrap_or(Value::Null),
            b.get(item).cloned().unwrap_or(Value::Null),
        );
        if !(x.is_null() && y.is_null()) {
            rows.push(row(scope, &format!("breakdown {item}"), Unit::Bytes, x, y));
        }
    }
    let types = |v: &Value| -> Vec<(String, f64)> {
        v.get("byModuleType")
            .and_then(Value::as_array)
            .map(|l| {
                l.iter()
                    .filter_map(|t| {
                        let total = ["parametersBytes", "gradientsBytes", "optimizerBytes"]
                            .iter()
                            .filter_map(|k| t.get(*k).and_then(Value::as_f64))
                            .sum();
                        Some((t.get("type")?.as_str()?.to_string(), total))
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let (ta, tb) = (types(a), types(b));
    let mut names: Vec<&String> = ta.iter().map(|t| &t.0).collect();
    names.extend(
        tb.iter()
            .map(|t| &t.0)
            .filter(|n| !ta.iter().any(|t| &t.0 == *n)),
    );
    for n in names {
        let find = |l: &[(String, f64)]| {
            l.iter()
                .find(|t| &t.0 == n)
                .map_or(Value::Null, |t| Value::from(t.1))
        };
        rows.push(row(
            scope,
            &format!("breakdown {n} (params+grads+optimizer)"),
            Unit::Bytes,
            find(&ta),
            find(&tb),
        ));
    }
    rows
}

fn headline(rows: &[Row]) -> Vec<String> {
    let mut grew: Vec<&Row> = rows
        .iter()
        .filter(|r| r.unit == Unit::Bytes && r.delta.is_some_and(|d| d > 0.0))
        .collect();
    grew.sort_by(|x, y| y.delta.unwrap_or(0.0).total_cmp(&x.delta.unwrap_or(0.0)));
    let mut out: Vec<String> = grew
        .iter()
        .take(HEADLINE)
        .map(|r| {
            format!(
                "{}: {} grew {}{}",
                r.scope,
                r.item,
                format_bytes(r.delta.unwrap_or(0.0) as u64),
                r.delta_percent
                    .map_or(String::new(), |p| format!(" ({p:+.1}%)"))
            )
        })
        .collect();
    out.extend(
        rows.iter()
            .filter(|r| r.unit == Unit::Text && r.changed())
            .map(|r| {
                format!(
                    "{}: {} {} → {}",
                    r.scope,
                    r.item,
                    cell(&r.a, r.unit),
                    cell(&r.b, r.unit)
                )
            }),
    );
    if out.is_empty() {
        out.push("nothing grew".into());
    }
    out
}

fn cell(v: &Value, unit: Unit) -> String {
    match (v, unit) {
        (Value::Null, _) => "-".into(),
        (Value::String(s), _) => s.clone(),
        (v, Unit::Bytes) => v
            .as_f64()
            .map_or("-".into(), crate::local::sweep::model::signed_bytes),
        (v, Unit::Seconds) => v.as_f64().map_or("-".into(), |x| format!("{x:.3}s")),
        (v, Unit::PerSecond) => v.as_f64().map_or("-".into(), |x| format!("{x:.0}/s")),
        (v, _) => v.as_f64().map_or(v.to_string(), |x| {
            crate::local::sweep::model::num((x * 1000.0).round() / 1000.0)
        }),
    }
}

fn change(r: &Row) -> String {
    match (r.delta, r.unit) {
        (Some(d), Unit::Bytes) if d != 0.0 => format!(
            "{}{}{}",
            if d > 0.0 { "+" } else { "" },
            cell(&Value::from(d), Unit::Bytes),
            r.delta_percent
                .map_or(String::new(), |p| format!(" ({p:+.1}%)"))
        ),
        (Some(d), _) if d != 0.0 => r
            .delta_percent
            .map_or(format!("{d:+}"), |p| format!("{p:+.1}%")),
        (Some(_), _) => "=".into(),
        (None, _) if r.changed() => "changed".into(),
        (None, _) => "=".into(),
    }
}

/// The comparison as text (changed items; `-o wide`: every item) or JSON/YAML.
pub fn render(c: &Comparison, format: Format) -> String {
    if format.is_structured() {
        return output::structured(c, format);
    }
    let mut out = format!("A: {}\nB: {}\n", c.a, c.b);
    out.push_str("What grew (B against A):\n");
    for g in &c.grew {
        out.push_str(&format!("  {g}\n"));
    }
    let mut t = Table::new(["WHERE", "WHAT", "A", "B", "CHANGE"]);
    for r in c
        .rows
        .iter()
        .filter(|r| format == Format::Wide || r.changed())
    {
        t.row([
            r.scope.clone(),
            r.item.clone(),
            cell(&r.a, r.unit),
            cell(&r.b, r.unit),
            change(r),
        ]);
    }
    if t.is_empty() {
        out.push_str("no item differs\n");
    } else {
        out.push('\n');
        out.push_str(&t.render());
    }
    out
}

#[cfg(test)]
mod tests;
