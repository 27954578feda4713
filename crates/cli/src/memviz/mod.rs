//! The OOM snapshot the agent kept, written as PyTorch's
//! `torch.cuda.memory._snapshot()` pickle, which https://pytorch.org/memory_viz
//! (and `python -m torch.cuda._memory_viz`) opens: `--oom-snapshot FILE` of
//! `memprof profile`, `memprof rollup` and `memprof report`.
//!
//! The agent sends a summary, not the allocator's whole state: the largest
//! live blocks (at most 8), each with its size, a count when several blocks
//! were allocated at the same frames, and up to 4 frames as `file:line
//! function`. What the pickle holds is therefore in part filled in
//! (docs/cli.md says which): each block gets a segment of its own at a
//! made-up address, `state` is `active_allocated`, `requested_size` is the
//! size, a count of n becomes n equal blocks, and `device_traces` holds an
//! empty trace per device (no allocation history crosses the wire).
//!
//! - [`pickle`]: the protocol-2 writer;
//! - [`snapshot`]: the summary as the snapshot's dict.

pub mod pickle;

use memprof_api::{OomBlock, OomSnapshotSummary};
use pickle::Value;
use std::path::Path;

/// Where the made-up addresses start (a typical CUDA virtual address).
const BASE_ADDRESS: u64 = 0x7f00_0000_0000;
/// Segments are placed at multiples of this (the allocator's large pages).
const SEGMENT_ALIGN: u64 = 2 << 20;
/// Blocks up to this size come from the allocator's small pool.
const SMALL_BLOCK: u64 = 1 << 20;

/// `file:line function` (the agent's frame) as memory_viz's frame dict;
/// a frame without a line keeps its text as the file name, line 0.
pub fn frame(text: &str) -> Value {
    let (file, line, name) = split_frame(text);
    Value::Dict(vec![
        ("filename".into(), file.into()),
        ("line".into(), Value::Int(line)),
        ("name".into(), name.into()),
    ])
}

fn split_frame(text: &str) -> (&str, i64, &str) {
    // The line is the digits after the last `:` that has only digits
    // before the next space (a path may hold `:` or spaces of its own).
    for (i, _) in text.match_indices(':').rev() {
        let rest = &text[i + 1..];
        let (num, name) = rest.split_once(' ').unwrap_or((rest, ""));
        if !num.is_empty() && num.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(line) = num.parse() {
                return (&text[..i], line, name);
            }
        }
    }
    (text, 0, "")
}

fn segment(b: &OomBlock, device: i64, address: u64) -> Value {
    let n = b.count.unwrap_or(1).max(1);
    let frames = Value::List(b.frames.iter().map(|f| frame(f)).collect());
    let mut blocks = Vec::new();
    let mut at = address;
    for i in 0..n {
        // n equal blocks; the first takes what does not divide.
        let size = b.size_bytes / n + if i == 0 { b.size_bytes % n } else { 0 };
        blocks.push(Value::Dict(vec![
            ("address".into(), at.into()),
            ("size".into(), size.into()),
            ("requested_size".into(), size.into()),
            ("state".into(), "active_allocated".into()),
            ("frames".into(), frames.clone()),
        ]));
        at += size;
    }
    let pool = if b.size_bytes / n <= SMALL_BLOCK {
        "small"
    } else {
        "large"
    };
    Value::Dict(vec![
        ("device".into(), Value::Int(device)),
        ("address".into(), address.into()),
        ("total_size".into(), b.size_bytes.into()),
        ("allocated_size".into(), b.size_bytes.into()),
        ("active_size".into(), b.size_bytes.into()),
        ("requested_size".into(), b.size_bytes.into()),
        ("stream".into(), Value::Int(0)),
        ("segment_type".into(), pool.into()),
        (
            "segment_pool_id".into(),
            Value::Tuple(vec![Value::Int(0), Value::Int(0)]),
        ),
        ("is_expandable".into(), Value::Bool(false)),
        // The stack that made the segment: its (only) allocation's.
        ("frames".into(), frames),
        ("blocks".into(), Value::List(blocks)),
    ])
}

/// The summary as `torch.cuda.memory._snapshot()`'s dict: `segments` (one
/// per block the agent kept, largest first) and `device_traces` (an empty
/// list per device up to the one that ran out).
pub fn snapshot(s: &OomSnapshotSummary) -> Value {
    let device = i64::from(s.device.unwrap_or(0));
    let mut address = BASE_ADDRESS;
    let segments = s
        .blocks
        .iter()
        .map(|b| {
            let seg = segment(b, device, address);
            address += b.size_bytes.div_ceil(SEGMENT_ALIGN).max(1) * SEGMENT_ALIGN;
            seg
        })
        .collect();
    Value::Dict(vec![
        ("segments".into(), Value::List(segments)),
        (
            "device_traces".into(),
            Value::List((0..=device).map(|_| Value::List(vec![])).collect()),
        ),
    ])
}

/// Writes the snapshot's pickle to `path`.
pub fn write(path: &Path, s: &OomSnapshotSummary) -> std::io::Result<()> {
    std::fs::write(path, pickle::dumps(&snapshot(s)))
}

/// The line a command prints after writing `path`.
pub fn written(path: &Path, s: &OomSnapshotSummary) -> String {
    format!(
        "OOM snapshot ({} at {}, {} block(s)) written to {}: open it at https://pytorch.org/memory_viz",
        s.device.map_or("GPU -".into(), |d| format!("GPU {d}")),
        s.time,
        s.blocks.len(),
        path.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_at_the_line_number() {
        assert_eq!(split_frame("train.py:42 leak"), ("train.py", 42, "leak"));
        assert_eq!(
            split_frame("C:/my runs/x:y.py:7 forward pass"),
            ("C:/my runs/x:y.py", 7, "forward pass")
        );
        assert_eq!(split_frame("<unknown>"), ("<unknown>", 0, ""));
    }

    #[test]
    fn each_block_a_segment_counts_split_evenly_addresses_apart() {
        let s = OomSnapshotSummary {
            time: "t".into(),
            device: Some(1),
            blocks: vec![
                OomBlock {
                    size_bytes: 6 << 30,
                    count: None,
                    frames: vec!["train.py:42 leak".into()],
                },
                OomBlock {
                    size_bytes: 3 << 20,
                    count: Some(3),
                    frames: vec![],
                },
            ],
            ..Default::default()
        };
        let Value::Dict(top) = snapshot(&s) else {
            panic!()
        };
        assert_eq!(top[1].0, "device_traces");
        assert_eq!(top[1].1, Value::List(vec![Value::List(vec![]); 2]));
        let Value::List(segs) = &top[0].1 else {
            panic!()
        };
        let field = |v: &Value, k: &str| match v {
            Value::Dict(d) => d.iter().find(|(n, _)| n == k).unwrap().1.clone(),
            _ => panic!(),
        };
        assert_eq!(field(&segs[0], "address"), Value::Int(BASE_ADDRESS as i64));
        assert_eq!(
            field(&segs[1], "address"),
            Value::Int((BASE_ADDRESS + (6 << 30)) as i64)
        );
        assert_eq!(field(&segs[1], "segment_type"), "small".into());
        let Value::List(blocks) = field(&segs[1], "blocks") else {
            panic!()
        };
        assert_eq!(blocks.len(), 3);
        assert_eq!(field(&blocks[2], "size"), Value::Int(1 << 20));
        assert_eq!(field(&blocks[2], "state"), "active_allocated".into());
    }
}
