//! `memprof plot JOB` (also `kubectl memprof plot`): the Job's per-rank memory
//! timelines (one series per rank, from the 60-point timelines its
//! MemoryReports carry, GPU total as a line, OOMs marked) and the per-GPU
//! peak heatmap across ranks and nodes. SVG (or PNG) with `--out`; a text
//! chart otherwise. Building the charts is pure ([`timeline`], [`heatmap`]).

use crate::kube::client::{self as k, CliError, KubeArgs};
use crate::output;
use crate::plot::{HLine, Heatmap, LineChart, Mark, Series, Style, Unit};
use memprof_api::{MemoryProfile, MemoryReport};
use std::path::PathBuf;

/// Flags of `memprof plot`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Job name, or NAMESPACE/JOB.
    pub job: String,
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Write the charts to this file: `.svg`, or `.png` (rasterised in-process).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Which chart.
    #[arg(long, value_enum, default_value_t = Chart::All)]
    pub chart: Chart,
    /// Width of the text chart in characters.
    #[arg(long, default_value_t = 100)]
    pub width: usize,
}

/// The charts `plot` draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Chart {
    /// Memory over time, one series per rank.
    Timeline,
    /// Peak memory per GPU, ranks by GPUs.
    Heatmap,
    /// Both, one above the other.
    All,
}

/// Runs the subcommand; returns the process exit code.
pub async fn run(args: Args) -> Result<i32, CliError> {
    if let Some(path) = &args.out {
        crate::outfile::prepare_image("--out", path).map_err(|e| CliError::Usage(e.to_string()))?;
    }
    let (client, ns) = args.kube.connect().await?;
    let (ns, job) = k::split_ref(&args.job, &ns);
    let profile = k::get_profile(&client, ns, job).await?;
    let reports = k::job_reports(&client, ns, &profile.spec.job_name).await?;
    let (line, map) = (timeline(&profile, &reports), heatmap(&profile, &reports));
    match &args.out {
        Some(path) => {
            let svg = svg_document(&line, &map, args.chart);
            crate::plot::write_image(path, &svg).map_err(|e| CliError::Usage(e.to_string()))?;
            eprintln!("wrote {}", path.display());
        }
        None => {
            let mut text = String::new();
            if args.chart != Chart::Heatmap {
                text.push_str(&line.to_text(args.width, 20));
                text.push('\n');
            }
            if args.chart != Chart::Timeline {
                text.push_str(&map.to_text(args.width, 40));
            }
            output::print(&text);
        }
    }
    Ok(0)
}

/// The fullest GPU of each rank over time: one series per rank, x in seconds
/// since the earliest point, the smallest GPU total as a line, each OOM the
/// profile recorded as a mark.
pub fn timeline(p: &MemoryProfile, reports: &[MemoryReport]) -> LineChart {
    let t0 = reports
        .iter()
        .flat_map(|r| &r.spec.gpus)
        .flat_map(|g| g.points().first())
        .map(|pt| pt.t)
        .min()
        .unwrap_or(0);
    let series = reports
        .iter()
        .filter(|r| r.spec.gpus.iter().any(|g| !g.points().is_empty()))
        .map(|r| Series::new(rank_name(r), rank_points(r, t0), Style::Line))
        .collect();
    let total = reports
        .iter()
        .flat_map(|r| &r.spec.gpus)
        .map(|g| g.total_bytes)
        .filter(|&b| b > 0)
        .min();
    let hlines = total
        .map(|t| HLine {
            y: t as f64,
            label: "GPU memory total".into(),
        })
        .into_iter()
        .collect();
    let ooms = p.status.iter().flat_map(|s| &s.ooms);
    let marks = ooms
        .filter_map(|o| {
            let at: jiff::Timestamp = o.time.parse().ok()?;
            let rank = o.rank.map_or(o.pod.clone(), |r| format!("rank {r}"));
            Some(Mark {
                x: (at.as_second() - t0) as f64,
                label: format!("OOM {rank}"),
            })
        })
        .collect();
    LineChart {
        title: titled(
            format!("GPU memory of Job {} by rank", p.spec.job_name),
            reports,
        ),
        x_label: "time since first sample".into(),
        x_unit: Unit::Seconds,
        y_label: "used memory (fullest GPU of the rank)".into(),
        y_unit: Unit::Bytes,
        series,
        hlines,
        marks,
    }
}

/// The title, with what the data is when it is not a measurement
/// (`sim`, `trace`): a picture is shared without the command that drew it.
fn titled(title: String, reports: &[MemoryReport]) -> String {
    match crate::kube::ranks::not_measured(reports) {
        Some(note) => format!("{title} ({note})"),
        None => title,
    }
}

fn rank_name(r: &MemoryReport) -> String {
    match r.spec.rank {
        Some(rank) => format!("rank {rank}"),
        None => r.spec.pod_name.clone(),
    }
}

/// Per timeline point, the highest use across the rank's GPUs.
fn rank_points(r: &MemoryReport, t0: i64) -> Vec<(f64, f64)> {
    let mut by_t = std::collections::BTreeMap::<i64, u64>::new();
    for pt in r.spec.gpus.iter().flat_map(|g| g.points()) {
        let v = by_t.entry(pt.t).or_default();
        *v = (*v).max(pt.max);
    }
    by_t.into_iter()
        .map(|(t, v)| ((t - t0) as f64, v as f64))
        .collect()
}

/// Peak memory of every GPU: one row per rank (with its node), one column
/// per GPU index; a rank without that GPU leaves the cell empty.
pub fn heatmap(p: &MemoryProfile, reports: &[MemoryReport]) -> Heatmap {
    let width = reports
        .iter()
        .flat_map(|r| r.spec.gpus.iter().map(|g| g.index as usize + 1))
        .max()
        .unwrap_or(0);
    let rows = reports
        .iter()
        .map(|r| {
            let node = r.spec.node_name.as_deref().unwrap_or("-");
            format!("{} on {node}", rank_name(r))
        })
        .collect();
    let values = reports
        .iter()
        .map(|r| {
            let mut row = vec![None; width];
            for g in &r.spec.gpus {
                row[g.index as usize] = Some(g.peak_bytes as f64);
            }
            row
        })
        .collect();
    // From 0 to the largest device's total: a 38-58 GiB spread on 80 GiB
    // GPUs is a modest imbalance, not empty against full.
    let total = reports
        .iter()
        .flat_map(|r| &r.spec.gpus)
        .map(|g| g.total_bytes as f64)
        .fold(0.0, f64::max);
    Heatmap {
        title: titled(
            format!("Peak GPU memory of Job {} per GPU", p.spec.job_name),
            reports,
        ),
        scale: (total > 0.0).then_some((0.0, total)),
        x_label: "GPU index".into(),
        y_label: "rank and node".into(),
        cols: (0..width).map(|i| format!("GPU {i}")).collect(),
        rows,
        values,
        unit: Unit::Bytes,
    }
}

/// One SVG document with the chosen charts stacked (each chart stays its own
/// `<svg>` inside, as the plot module drew it).
pub fn svg_document(line: &LineChart, map: &Heatmap, chart: Chart) -> String {
    let parts: Vec<String> = match chart {
        Chart::Timeline => return line.to_svg(),
        Chart::Heatmap => return map.to_svg(),
        Chart::All => vec![line.to_svg(), map.to_svg()],
    };
    let mut body = String::new();
    let (mut y, mut width) = (0.0f64, 0.0f64);
    for svg in &parts {
        let (w, h) = (attr(svg, "width"), attr(svg, "height"));
        let inner = svg.trim_start_matches(|c| c != '<');
        let inner = inner.strip_prefix("<?xml").map_or(inner, |rest| {
            rest.split_once("?>").map_or(rest, |(_, r)| r.trim_start())
        });
        body.push_str(&inner.replacen("<svg ", &format!("<svg y=\"{y:.0}\" "), 1));
        y += h;
        width = width.max(w);
    }
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{y:.0}\" viewBox=\"0 0 {width:.0} {y:.0}\">{body}</svg>\n"
    )
}

/// A numeric attribute of the root element (0 when absent).
fn attr(svg: &str, name: &str) -> f64 {
    let root = svg.split_once("<svg").map_or("", |(_, r)| r);
    let root = root.split_once('>').map_or(root, |(head, _)| head);
    let key = format!(" {name}=\"");
    root.split_once(&key)
        .and_then(|(_, v)| v.split_once('"'))
        .and_then(|(v, _)| v.trim_end_matches("px").parse().ok())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::{
        GpuReport, MemoryProfileSpec, MemoryProfileStatus, MemoryReportSpec, OomRecord,
        TimelinePoint,
    };

    const GIB: u64 = 1 << 30;

    fn report(rank: u32, gpus: &[(u32, u64)], t0: i64) -> MemoryReport {
        let gpus = gpus
            .iter()
            .map(|&(index, peak)| GpuReport {
                index,
                total_bytes: 80 * GIB,
                peak_bytes: peak * GIB,
                timeline: (0..3)
                    .map(|i| TimelinePoint {
                        t: t0 + 10 * i,
                        max: (peak - 2 + i as u64) * GIB,
                        min: 0,
                    })
                    .collect(),
                ..Default::default()
            })
            .collect();
        MemoryReport::new(
            &format!("train-{rank}"),
            MemoryReportSpec {
                pod_name: format!("train-{rank}"),
                node_name: Some(format!("node-{rank}")),
                rank: Some(rank),
                gpus,
                ..Default::default()
            },
        )
    }

    fn profile() -> MemoryProfile {
        let mut p = MemoryProfile::new(
            "train",
            MemoryProfileSpec {
                job_name: "train".into(),
                expected_ranks: Some(2),
            },
        );
        p.status = Some(MemoryProfileStatus {
            ooms: vec![OomRecord {
                time: "2026-11-22T10:00:20Z".into(),
                pod: "train-1".into(),
                rank: Some(1),
                ..Default::default()
            }],
            ..Default::default()
        });
        p
    }

    #[test]
    fn one_series_per_rank_from_its_fullest_gpu_with_total_and_oom_marks() {
        let t0 = "2026-11-22T10:00:00Z"
            .parse::<jiff::Timestamp>()
            .unwrap()
            .as_second();
        let reports = [
            report(0, &[(0, 40), (1, 50)], t0),
            report(1, &[(0, 70)], t0),
        ];
        let c = timeline(&profile(), &reports);
        let names: Vec<&str> = c.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["rank 0", "rank 1"]);
        // rank 0: the higher of its two GPUs at each point.
        assert_eq!(
            c.series[0].points,
            [
                (0.0, 48.0 * GIB as f64),
                (10.0, 49.0 * GIB as f64),
                (20.0, 50.0 * GIB as f64)
            ]
        );
        assert_eq!(c.hlines[0].y, 80.0 * GIB as f64);
        assert_eq!(
            (c.marks[0].x, c.marks[0].label.as_str()),
            (20.0, "OOM rank 1")
        );
    }

    #[test]
    fn heatmap_has_a_row_per_rank_and_node_and_a_column_per_gpu_index() {
        let reports = [report(0, &[(0, 40), (1, 50)], 0), report(1, &[(0, 70)], 0)];
        let h = heatmap(&profile(), &reports);
        assert_eq!(h.rows, ["rank 0 on node-0", "rank 1 on node-1"]);
        assert_eq!(h.cols, ["GPU 0", "GPU 1"]);
        assert_eq!(h.values[1], [Some(70.0 * GIB as f64), None]);
    }

    #[test]
    fn the_heatmap_scales_from_zero_to_the_devices_total() {
        let reports = [report(0, &[(0, 38)], 0), report(1, &[(0, 58)], 0)];
        let h = heatmap(&profile(), &reports);
        assert_eq!(h.scale, Some((0.0, 80.0 * GIB as f64)));
        assert_eq!(h.range(), (0.0, 80.0 * GIB as f64));
        // 58 of 80 GiB is not drawn as full: its colour is viridis(58/80).
        let svg = h.to_svg();
        let (full, _) = crate::plot::viridis(1.0);
        let (at_58, _) = crate::plot::viridis(58.0 / 80.0);
        assert!(svg.contains(&format!("fill=\"{at_58}\"")), "{svg}");
        assert!(!svg.contains(&format!("fill=\"{full}\" stroke")), "{svg}");
        // The title fits: the picture is at least as wide as it needs.
        let width: f64 = svg
            .split("width=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(width >= h.title.chars().count() as f64 * 10.0, "{width}");
    }

    #[test]
    fn charts_of_simulated_or_replayed_data_say_so_in_their_titles() {
        let mut sim = report(0, &[(0, 40)], 0);
        sim.spec.gpus[0].source = memprof_api::DataSource::Sim;
        let measured = [report(1, &[(0, 50)], 0)];
        let p = profile();
        assert_eq!(
            timeline(&p, &measured).title,
            "GPU memory of Job train by rank"
        );
        let both = [sim, measured[0].clone()];
        let t = timeline(&p, &both).title;
        assert_eq!(
            t,
            "GPU memory of Job train by rank (simulated data, not measured on a GPU)"
        );
        assert!(heatmap(&p, &both)
            .title
            .ends_with("(simulated data, not measured on a GPU)"));
    }

    #[test]
    fn both_charts_stack_into_one_well_formed_svg() {
        let reports = [report(0, &[(0, 40)], 0), report(1, &[(0, 70)], 0)];
        let p = profile();
        let svg = svg_document(&timeline(&p, &reports), &heatmap(&p, &reports), Chart::All);
        let doc = roxmltree::Document::parse(&svg).unwrap();
        let root = doc.root_element();
        let inner: Vec<_> = root.children().filter(|n| n.has_tag_name("svg")).collect();
        assert_eq!(inner.len(), 2);
        assert_eq!(inner[1].attribute("y"), Some("450"));
        let height: f64 = root.attribute("height").unwrap().parse().unwrap();
        assert!(height > 450.0, "{height}");
    }
}
