//! Recorded traces, the one file format every side shares: a CSV with a
//! header and the columns `t_s,gpu,used_bytes,total_bytes`, optionally
//! followed by `allocated_bytes,reserved_bytes`; lines starting with `#` are
//! comments. `t_s` is seconds from any origin, non-decreasing; `gpu` is the
//! GPU index. The sidecar writes one (`--trace-out`, [`TraceWriter`]);
//! `memprof analyze` runs the analysis over one offline and the sidecar's
//! `trace` backend replays one ([`read_trace`]).
//!
//! Read and written with the `csv` crate; the checks on top (header, time
//! order, used within total) say which line is wrong.

use std::io::Write;

/// The four columns every trace has, in order.
pub const COLUMNS: [&str; 4] = ["t_s", "gpu", "used_bytes", "total_bytes"];
/// The optional allocator columns after them.
pub const ALLOCATOR_COLUMNS: [&str; 2] = ["allocated_bytes", "reserved_bytes"];

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

/// Why a trace could not be read. The message names the file and the line.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// File path.
        path: String,
        /// Underlying error.
        source: std::io::Error,
    },
    /// The file is not a valid trace.
    #[error("invalid trace {path} line {line}: {why} (expected columns t_s,gpu,used_bytes,total_bytes[,allocated_bytes,reserved_bytes])")]
    Invalid {
        /// File path.
        path: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        why: String,
    },
}

/// Reads a trace file.
pub fn read_trace(path: &str) -> Result<Vec<TraceRow>, TraceError> {
    let text = std::fs::read_to_string(path).map_err(|source| TraceError::Read {
        path: path.into(),
        source,
    })?;
    parse_trace(&text).map_err(|(line, why)| TraceError::Invalid {
        path: path.into(),
        line,
        why,
    })
}

/// Parses a trace; on error returns the 1-based line and what is wrong.
pub fn parse_trace(text: &str) -> Result<Vec<TraceRow>, (usize, String)> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .comment(Some(b'#'))
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    // Blank (or whitespace-only) lines are not rows.
    let mut records = reader
        .records()
        .filter(|r| !matches!(r, Ok(rec) if rec.iter().all(str::is_empty)));
    let header = match records.next() {
        None => return Err((1, "empty file".to_string())),
        Some(r) => r.map_err(|e| csv_error(&e))?,
    };
    let cols: Vec<&str> = header.iter().collect();
    if cols.len() < 4 || cols[..4] != COLUMNS {
        return Err((line_of(&header), format!("bad header {:?}", cols.join(","))));
    }
    let extra = cols.len() >= 6 && cols[4..6] == ALLOCATOR_COLUMNS;
    let mut rows = Vec::new();
    let mut last_t = f64::NEG_INFINITY;
    for record in records {
        let record = record.map_err(|e| csv_error(&e))?;
        let row =
            parse_row(&record, extra, last_t).map_err(|why| (line_of(&record), why.to_string()))?;
        last_t = row.t;
        rows.push(row);
    }
    if rows.is_empty() {
        return Err((1, "no rows after the header".into()));
    }
    Ok(rows)
}

/// What is wrong with one data row; the trace's error adds the file and line.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum RowError {
    /// Fewer than the four columns every row has.
    #[error("{0} fields, need at least 4")]
    TooFewFields(usize),
    /// `t_s` is not a number.
    #[error("t_s {0:?} is not a number")]
    TimeNotANumber(String),
    /// `t_s` is before the previous row's.
    #[error("t_s {t} goes back in time (previous {previous})")]
    BackInTime {
        /// This row's time.
        t: f64,
        /// The previous row's.
        previous: f64,
    },
    /// A byte count or index is not a non-negative integer.
    #[error("{column} {value:?} is not a non-negative integer")]
    NotAnInteger {
        /// The column.
        column: &'static str,
        /// What it holds.
        value: String,
    },
    /// More used than there is, or no total.
    #[error("used_bytes {used} must be within total_bytes {total} (> 0)")]
    UsedOverTotal {
        /// `used_bytes`.
        used: u64,
        /// `total_bytes`.
        total: u64,
    },
}

/// One data row, checked: numbers, time order, used within total.
fn parse_row(f: &csv::StringRecord, extra: bool, last_t: f64) -> Result<TraceRow, RowError> {
    if f.len() < 4 {
        return Err(RowError::TooFewFields(f.len()));
    }
    let num = |k: usize, column: &'static str| -> Result<u64, RowError> {
        f[k].parse::<u64>().map_err(|_| RowError::NotAnInteger {
            column,
            value: f[k].to_string(),
        })
    };
    let optional = |k: usize, column: &'static str| -> Result<Option<u64>, RowError> {
        match f.get(k) {
            Some(v) if extra && !v.is_empty() => num(k, column).map(Some),
            _ => Ok(None),
        }
    };
    let t: f64 = f[0]
        .parse()
        .map_err(|_| RowError::TimeNotANumber(f[0].to_string()))?;
    if !t.is_finite() || t < last_t {
        return Err(RowError::BackInTime {
            t,
            previous: last_t,
        });
    }
    let row = TraceRow {
        t,
        gpu: num(1, "gpu")? as u32,
        used_bytes: num(2, "used_bytes")?,
        total_bytes: num(3, "total_bytes")?,
        allocated_bytes: optional(4, "allocated_bytes")?,
        reserved_bytes: optional(5, "reserved_bytes")?,
    };
    if row.total_bytes == 0 || row.used_bytes > row.total_bytes {
        return Err(RowError::UsedOverTotal {
            used: row.used_bytes,
            total: row.total_bytes,
        });
    }
    Ok(row)
}

/// The 1-based line a record starts on.
fn line_of(record: &csv::StringRecord) -> usize {
    record.position().map_or(1, |p| p.line() as usize)
}

fn csv_error(e: &csv::Error) -> (usize, String) {
    let line = e.position().map_or(1, |p| p.line() as usize);
    (line, e.to_string())
}

/// Writes a trace as the sidecar records it: the four columns, `t_s` with
/// millisecond precision.
pub struct TraceWriter<W: Write> {
    csv: csv::Writer<W>,
}

impl<W: Write> TraceWriter<W> {
    /// A writer that has written the header.
    pub fn new(out: W) -> Result<Self, csv::Error> {
        let mut csv = csv::WriterBuilder::new()
            .has_headers(false)
            .from_writer(out);
        csv.write_record(COLUMNS)?;
        Ok(TraceWriter { csv })
    }

    /// Appends one sample of one GPU.
    pub fn write(
        &mut self,
        t: f64,
        gpu: u32,
        used_bytes: u64,
        total_bytes: u64,
    ) -> csv::Result<()> {
        self.csv.write_record([
            format!("{t:.3}"),
            gpu.to_string(),
            used_bytes.to_string(),
            total_bytes.to_string(),
        ])
    }

    /// Flushes what was written to the underlying writer.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.csv.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rows_comments_and_blank_lines() {
        let rows = parse_trace(
            "# source=test\n\nt_s,gpu,used_bytes,total_bytes\n0,0,10,100\n  \n1.5, 1 ,20,100\n",
        )
        .unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[1].t, rows[1].gpu, rows[1].used_bytes), (1.5, 1, 20));
        assert_eq!(rows[0].allocated_bytes, None);
    }

    #[test]
    fn optional_allocator_columns() {
        let rows = parse_trace("t_s,gpu,used_bytes,total_bytes,allocated_bytes,reserved_bytes\n0,0,10,100,5,8\n1,0,10,100,,\n").unwrap();
        assert_eq!(rows[0].allocated_bytes, Some(5));
        assert_eq!(rows[0].reserved_bytes, Some(8));
        assert_eq!(rows[1].reserved_bytes, None);
        let plain = parse_trace("t_s,gpu,used_bytes,total_bytes\n0,0,10,100,5,8\n").unwrap();
        assert_eq!(
            plain[0].allocated_bytes, None,
            "no allocator header: ignored"
        );
    }

    #[test]
    fn errors_name_the_line() {
        assert_eq!(parse_trace("").unwrap_err(), (1, "empty file".into()));
        assert_eq!(parse_trace("t,gpu\n").unwrap_err().0, 1);
        let (line, why) =
            parse_trace("t_s,gpu,used_bytes,total_bytes\n0,0,10,100\n1,0,-5,100\n").unwrap_err();
        assert_eq!(line, 3);
        assert!(why.contains("used_bytes"));
        let (line, why) =
            parse_trace("# c\nt_s,gpu,used_bytes,total_bytes\n5,0,1,2\n4,0,1,2\n").unwrap_err();
        assert_eq!(line, 4, "comment lines count");
        assert!(why.contains("back in time"), "{why}");
        assert!(parse_trace("t_s,gpu,used_bytes,total_bytes\n0,0,200,100\n")
            .unwrap_err()
            .1
            .contains("within"));
        assert!(parse_trace("t_s,gpu,used_bytes,total_bytes\n0,0,1\n")
            .unwrap_err()
            .1
            .contains("3 fields"));
        assert_eq!(
            parse_trace("t_s,gpu,used_bytes,total_bytes\n").unwrap_err(),
            (1, "no rows after the header".into())
        );
    }

    #[test]
    fn a_bad_row_is_a_typed_error_that_says_what_is_wrong() {
        let row = |fields: &[&str]| csv::StringRecord::from(fields.to_vec());
        let err = parse_row(&row(&["1", "x", "1", "2"]), false, 0.0).unwrap_err();
        assert_eq!(
            err,
            RowError::NotAnInteger {
                column: "gpu",
                value: "x".into()
            }
        );
        assert_eq!(err.to_string(), "gpu \"x\" is not a non-negative integer");
        let err = parse_row(&row(&["1", "0", "1", "2"]), false, 2.0).unwrap_err();
        assert_eq!(err.to_string(), "t_s 1 goes back in time (previous 2)");
        let err = parse_row(&row(&["a", "0", "1", "2"]), false, 0.0).unwrap_err();
        assert_eq!(err, RowError::TimeNotANumber("a".into()));
    }

    #[test]
    fn what_the_writer_writes_reads_back_byte_for_byte_as_before() {
        let mut w = TraceWriter::new(Vec::new()).unwrap();
        w.write(0.0, 0, 10, 100).unwrap();
        w.write(1.23456, 3, 20, 100).unwrap();
        w.flush().unwrap();
        let bytes = w.csv.into_inner().map_err(|e| e.to_string()).unwrap();
        let text = String::from_utf8(bytes).unwrap();
        // The format the sidecar wrote by hand before the csv crate.
        assert_eq!(
            text,
            "t_s,gpu,used_bytes,total_bytes\n0.000,0,10,100\n1.235,3,20,100\n"
        );
        let rows = parse_trace(&text).unwrap();
        assert_eq!((rows[1].t, rows[1].gpu), (1.235, 3));
    }
}
