//! Recorded traces: a CSV with a header and the columns
//! `t_s,gpu,used_bytes,total_bytes`, optionally followed by
//! `allocated_bytes,reserved_bytes`. `t_s` is seconds from any origin,
//! non-decreasing; `gpu` is the GPU index. `memprof analyze` runs the analysis
//! over one offline; the `trace` backend replays one in real time or faster.

use super::{Error, GpuInfo, GpuReading, Sampler};
use crate::api::DataSource;

/// One row of a trace.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TraceRow {
    /// Seconds from the trace's origin.
    pub t: f64,
    /// GPU index.
    pub gpu: u32,
    /// Memory in use, bytes.
    pub used_bytes: u64,
    /// Total memory, bytes.
    pub total_bytes: u64,
    /// Bytes allocated to tensors, when recorded.
    pub allocated_bytes: Option<u64>,
    /// Bytes reserved by the allocator, when recorded.
    pub reserved_bytes: Option<u64>,
}

/// Reads a trace file.
pub fn read_trace(path: &str) -> Result<Vec<TraceRow>, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.into(),
        source,
    })?;
    parse_trace(&text).map_err(|(line, why)| Error::Trace {
        path: path.into(),
        line,
        why,
    })
}

/// Parses a trace; on error returns the 1-based line and what is wrong.
pub fn parse_trace(text: &str) -> Result<Vec<TraceRow>, (usize, String)> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.starts_with('#'));
    let (_, header) = lines.next().ok_or((1, "empty file".to_string()))?;
    let cols: Vec<&str> = header.split(',').map(str::trim).collect();
    if cols.len() < 4 || cols[..4] != ["t_s", "gpu", "used_bytes", "total_bytes"] {
        return Err((1, format!("bad header {header:?}")));
    }
    let extra = cols.len() >= 6 && cols[4..6] == ["allocated_bytes", "reserved_bytes"];
    let mut rows = Vec::new();
    let mut last_t = f64::NEG_INFINITY;
    for (i, line) in lines {
        let n = i + 1;
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if f.len() < 4 {
            return Err((n, format!("{} fields, need at least 4", f.len())));
        }
        let num = |k: usize, name: &str| -> Result<u64, (usize, String)> {
            f[k].parse::<u64>().map_err(|_| {
                (
                    n,
                    format!("{name} {:?} is not a non-negative integer", f[k]),
                )
            })
        };
        let t: f64 = f[0]
            .parse()
            .map_err(|_| (n, format!("t_s {:?} is not a number", f[0])))?;
        if !t.is_finite() || t < last_t {
            return Err((n, format!("t_s {t} goes back in time (previous {last_t})")));
        }
        last_t = t;
        let row = TraceRow {
            t,
            gpu: num(1, "gpu")? as u32,
            used_bytes: num(2, "used_bytes")?,
            total_bytes: num(3, "total_bytes")?,
            allocated_bytes: if extra && f.len() > 4 && !f[4].is_empty() {
                Some(num(4, "allocated_bytes")?)
            } else {
                None
            },
            reserved_bytes: if extra && f.len() > 5 && !f[5].is_empty() {
                Some(num(5, "reserved_bytes")?)
            } else {
                None
            },
        };
        if row.total_bytes == 0 || row.used_bytes > row.total_bytes {
            return Err((
                n,
                format!(
                    "used_bytes {} must be within total_bytes {} (> 0)",
                    row.used_bytes, row.total_bytes
                ),
            ));
        }
        rows.push(row);
    }
    if rows.is_empty() {
        return Err((1, "no rows after the header".into()));
    }
    Ok(rows)
}

/// Replays a trace: each GPU reads as its newest row at or before the time asked.
pub struct TraceSampler {
    rows: Vec<TraceRow>,
    gpus: Vec<GpuInfo>,
    next: usize,
    current: Vec<GpuReading>,
    origin: Option<f64>,
}

impl TraceSampler {
    /// A sampler replaying `rows` (from [`read_trace`]).
    pub fn new(rows: Vec<TraceRow>) -> Self {
        let mut indices: Vec<u32> = rows.iter().map(|r| r.gpu).collect();
        indices.sort_unstable();
        indices.dedup();
        let gpus: Vec<GpuInfo> = indices
            .iter()
            .map(|&i| GpuInfo {
                index: i,
                uuid: format!("GPU-trace-{i:02}"),
                model: "recorded trace".into(),
                total_bytes: rows
                    .iter()
                    .find(|r| r.gpu == i)
                    .map_or(0, |r| r.total_bytes),
            })
            .collect();
        let current = gpus
            .iter()
            .map(|g| GpuReading {
                total_bytes: g.total_bytes,
                ..Default::default()
            })
            .collect();
        TraceSampler {
            rows,
            gpus,
            next: 0,
            current,
            origin: None,
        }
    }

    /// Whether every row has been replayed.
    pub fn finished(&self) -> bool {
        self.next >= self.rows.len()
    }
}

impl Sampler for TraceSampler {
    fn source(&self) -> DataSource {
        // Recorded numbers, replayed: neither live nor simulated.
        DataSource::Trace
    }

    fn gpus(&self) -> &[GpuInfo] {
        &self.gpus
    }

    fn sample(&mut self, t: f64) -> Result<Vec<GpuReading>, Error> {
        let origin = *self
            .origin
            .get_or_insert(t - self.rows.first().map_or(0.0, |r| r.t));
        while let Some(r) = self.rows.get(self.next) {
            if r.t > t - origin {
                break;
            }
            if let Some(pos) = self.gpus.iter().position(|g| g.index == r.gpu) {
                self.current[pos] = GpuReading {
                    used_bytes: r.used_bytes,
                    total_bytes: r.total_bytes,
                    utilization_percent: None,
                };
            }
            self.next += 1;
        }
        Ok(self.current.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str =
        "t_s,gpu,used_bytes,total_bytes\n0,0,10,100\n0,1,20,100\n1.5,0,30,100\n3,1,40,100\n";

    #[test]
    fn a_replayed_trace_says_it_is_a_recorded_trace() {
        let s = TraceSampler::new(parse_trace(TRACE).unwrap());
        assert_eq!(s.source(), DataSource::Trace);
        assert_eq!(s.source().to_string(), "trace");
    }

    #[test]
    fn parses_and_replays_in_time() {
        let rows = parse_trace(TRACE).unwrap();
        assert_eq!(rows.len(), 4);
        let mut s = TraceSampler::new(rows);
        assert_eq!(s.gpus().len(), 2);
        let at = |s: &mut TraceSampler, t: f64| {
            s.sample(t)
                .unwrap()
                .iter()
                .map(|r| r.used_bytes)
                .collect::<Vec<_>>()
        };
        assert_eq!(at(&mut s, 100.0), vec![10, 20]);
        assert_eq!(at(&mut s, 101.6), vec![30, 20]);
        assert!(!s.finished());
        assert_eq!(at(&mut s, 103.0), vec![30, 40]);
        assert!(s.finished());
    }

    #[test]
    fn optional_allocator_columns() {
        let rows = parse_trace("t_s,gpu,used_bytes,total_bytes,allocated_bytes,reserved_bytes\n0,0,10,100,5,8\n1,0,10,100,,\n").unwrap();
        assert_eq!(rows[0].allocated_bytes, Some(5));
        assert_eq!(rows[1].reserved_bytes, None);
    }

    #[test]
    fn errors_name_the_line() {
        assert_eq!(parse_trace("t,gpu\n").unwrap_err().0, 1);
        let (line, why) =
            parse_trace("t_s,gpu,used_bytes,total_bytes\n0,0,10,100\n1,0,-5,100\n").unwrap_err();
        assert_eq!(line, 3);
        assert!(why.contains("used_bytes"));
        assert!(
            parse_trace("t_s,gpu,used_bytes,total_bytes\n5,0,1,2\n4,0,1,2\n")
                .unwrap_err()
                .1
                .contains("back in time")
        );
        assert!(parse_trace("t_s,gpu,used_bytes,total_bytes\n0,0,200,100\n")
            .unwrap_err()
            .1
            .contains("within"));
    }
}
