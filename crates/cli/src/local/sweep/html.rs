//! `--html`: one self-contained report (inline SVG and CSS, no script, no
//! network), written with the `maud` template macro (every text escaped by
//! default, elements closed by construction): the recommendation, every
//! chart of [`crate::local::sweep::charts::figures`] with its caption, and
//! the runs table. Pure: a result in, a document out.

use crate::local::sweep::charts::{self, metric_word, Figure};
use crate::local::sweep::model::describe;
use crate::local::sweep::output::SweepResult;
use crate::local::sweep::record::{RunRecord, Status};
use maud::{html, Markup, PreEscaped, DOCTYPE};
use memprof_api::format_bytes;

const CSS: &str = "body{font-family:sans-serif;margin:24px auto;max-width:1100px;color:#222}\
h1{font-size:22px}h2{font-size:18px;margin-top:32px}\
.note{background:#fff4d6;border:1px solid #e0c060;padding:8px 12px}\
pre{background:#f5f5f5;padding:10px;overflow-x:auto;font-size:13px}\
figure{margin:16px 0}figcaption{font-size:13px;color:#555}\
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}\
th{background:#eee}td.l{text-align:left}tr.oom td{background:#fde2e2}tr.timeout td,tr.failed td{background:#eee}\
tr.trial td:first-child{font-weight:bold}svg{max-width:100%;height:auto}";

/// The whole document.
pub fn render(r: &SweepResult) -> String {
    let figures = charts::figures(r);
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { "memprof sweep" }
                style { (PreEscaped(CSS)) }
            }
            body {
                h1 { "memprof sweep" }
                (header(r))
                h2 { "Recommendation" }
                pre { (recommendation(r)) }
                @for (n, f) in figures.iter().enumerate() {
                    (figure(n + 1, f))
                }
                (table(r))
            }
        }
    }
    .into_string()
}

fn header(r: &SweepResult) -> Markup {
    html! {
        @if let Some(note) = &r.note {
            p.note { (note) }
        }
        p {
            "Command " code { (r.command.join(" ")) } ", started " (r.started_at) "; "
            (r.runs.len()) " run(s), step budget "
            (r.step_budget.map_or("none".into(), |s| s.to_string()))
            ", timeout " (r.timeout_seconds) " s, metric: peak " (metric_word(r.metric))
            ", headroom " (format!("{:.0}%", r.headroom * 100.0))
            ", verification: "
            (if r.verify_runs == 0 { "off (--no-verify)".to_string() } else { format!("up to {} run(s) per model", r.verify_runs) })
            @if r.interrupted { "; interrupted before the end" }
            "."
        }
    }
}

fn recommendation(r: &SweepResult) -> String {
    if r.models.is_empty() {
        return "no model: vary a numeric variable over at least two values".into();
    }
    let blocks: Vec<String> = r.models.iter().map(|m| describe(m).join("\n")).collect();
    blocks.join("\n\n")
}

fn figure(n: usize, f: &Figure) -> Markup {
    html! {
        figure id=(f.id) {
            (PreEscaped(&f.svg))
            figcaption { "Figure " (n) ". " (f.caption) }
        }
    }
}

fn table(r: &SweepResult) -> Markup {
    html! {
        h2 { "Runs" }
        table id="results-table" {
            thead {
                tr {
                    th { "#" }
                    @for v in &r.variables { th { (v) } }
                    @for h in ["status", "exit", "peak reserved", "peak allocated", "NVML peak", "static", "activations", "s/step", "tokens/s", "samples/s", "time"] {
                        th { (h) }
                    }
                    th.l { "note" }
                }
            }
            tbody {
                @for x in &r.runs { (row(r, x)) }
            }
        }
    }
}

fn row(r: &SweepResult, x: &RunRecord) -> Markup {
    let status = x.status.map_or("-", Status::word);
    let b = |v: Option<u64>| v.map_or("-".into(), format_bytes);
    let f = |v: Option<f64>, d: usize| v.map_or("-".into(), |x| format!("{x:.d$}"));
    let bd = |k: &str| {
        x.breakdown
            .as_ref()
            .and_then(|d| d.get(k))
            .and_then(serde_json::Value::as_u64)
    };
    let note = [
        x.trial.as_deref().map(|t| format!("verification: {t}")),
        x.oom_message.clone(),
        x.note.clone(),
        x.nvml_note.clone().filter(|_| r.nvml),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join("; ");
    let class = if x.trial.is_some() {
        format!("{status} trial")
    } else {
        status.to_string()
    };
    html! {
        tr class=(class) {
            td { (x.index) @if x.trial.is_some() { "*" } }
            @for v in &r.variables { td { (x.values.get(v).map_or("", String::as_str)) } }
            td { (status) }
            td { (x.exit_code.map_or("-".into(), |c| c.to_string())) }
            td { (b(x.peak_reserved_bytes)) }
            td { (b(x.peak_allocated_bytes)) }
            td { (b(x.nvml_peak_bytes)) }
            td { (b(bd("staticBytes"))) }
            td { (b(bd("activationsPeakBytes"))) }
            td { (f(x.step_seconds_median, 3)) }
            td { (f(x.tokens_per_second, 0)) }
            td { (f(x.samples_per_second, 1)) }
            td { (format!("{:.1} s", x.duration_seconds)) }
            td.l { (note) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::sweep::charts::{peak_chart, peak_options};
    use crate::local::sweep::model::{models, Metric, Target};
    use crate::plot::Style;

    fn result(runs: Vec<RunRecord>) -> SweepResult {
        let variables = vec!["B".to_string()];
        let target = Target {
            metric: Metric::Reserved,
            headroom: 0.1,
            limit_override: None,
            ..Default::default()
        };
        SweepResult {
            kind: crate::local::sweep::output::KIND.into(),
            version: 1,
            started_at: "2026-11-22T20:00:00Z".into(),
            command: vec!["python".into(), "<train>.py".into()],
            models: models(&variables, &runs, &target),
            variables,
            step_budget: Some(5),
            timeout_seconds: 60.0,
            metric: Metric::Reserved,
            headroom: 0.1,
            limit_bytes: None,
            nvml: false,
            verify_runs: 0,
            agent_interval: "250ms".into(),
            interrupted: false,
            note: Some("a <fake> run".into()),
            runs,
        }
    }

    fn run(b: &str, status: Status, peak: Option<u64>) -> RunRecord {
        RunRecord {
            values: [("B".to_string(), b.to_string())].into(),
            status: Some(status),
            peak_reserved_bytes: peak,
            device_total_bytes: Some(16_000_000_000),
            ..Default::default()
        }
    }

    #[test]
    fn without_a_breakdown_the_figure_says_so_and_text_is_escaped() {
        let r = result(vec![
            run("1", Status::Ok, Some(3_000_000_000)),
            run("2", Status::Ok, Some(4_000_000_000)),
            run("32", Status::Oom, None),
        ]);
        let doc = render(&r);
        assert!(doc.contains("<figure id=\"plot-breakdown\">"));
        assert!(
            doc.contains("No run's summary carried a breakdown"),
            "{doc}"
        );
        assert!(doc.contains("a &lt;fake&gt; run"));
        assert!(doc.contains("<code>python &lt;train&gt;.py</code>"));
        assert!(doc.contains("<tr class=\"oom\">"));
        assert!(!doc.contains("<script"));
        assert_eq!(doc.matches("<svg").count(), 3, "peak, breakdown, trade-off");
    }

    #[test]
    fn a_group_fit_and_dots_share_a_colour_ooms_are_crossed_and_the_axis_is_capped() {
        let mut oom = run("64", Status::Oom, Some(15_000_000_000));
        oom.device_total_bytes = Some(16_000_000_000);
        let r = result(vec![
            run("1", Status::Ok, Some(3_000_000_000)),
            run("2", Status::Ok, Some(4_000_000_000)),
            oom,
        ]);
        let c = peak_chart(&r, "B", &r.models.iter().collect::<Vec<_>>());
        let colours: Vec<Option<&str>> = c.series.iter().map(|s| s.color.as_deref()).collect();
        assert!(colours[0].is_some());
        assert_eq!(colours[0], colours[1], "fit and dots of one group");
        assert_eq!(c.series[1].style, Style::Markers);
        let crosses = c.series.last().unwrap();
        assert_eq!(crosses.style, Style::Crosses);
        assert_eq!(crosses.points, vec![(64.0, 15e9)]);
        let y_max = peak_options(&r.models.iter().collect::<Vec<_>>()).y_max;
        assert_eq!(y_max, Some(16e9 * 1.25));
        // Three charts, three clip paths, no two alike.
        let doc = render(&r);
        let mut ids: Vec<&str> = doc
            .split("<clipPath id=\"")
            .skip(1)
            .map(|s| &s[..s.find('"').unwrap()])
            .collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), doc.matches("<clipPath").count());
    }
}
