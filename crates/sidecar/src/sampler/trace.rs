//! The `trace` backend: replays a recorded trace (the format and its reader
//! are `memprof_api::trace`) in real time or faster.

use super::{Error, GpuInfo, GpuReading, Sampler};
use memprof_api::trace::TraceRow;
use memprof_api::DataSource;

/// Replays a trace: each GPU reads as its newest row at or before the time asked.
pub struct TraceSampler {
    rows: Vec<TraceRow>,
    gpus: Vec<GpuInfo>,
    next: usize,
    current: Vec<GpuReading>,
    origin: Option<f64>,
}

impl TraceSampler {
    /// A sampler replaying `rows` (from `memprof_api::trace::read_trace`).
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
                    ..Default::default()
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
    use memprof_api::trace::parse_trace;

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
}
