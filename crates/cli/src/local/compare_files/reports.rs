//! The rows of two reports compared: per GPU (paired by UUID when the two
//! runs share one, else by position), the allocator's numbers, the breakdown.

use super::{breakdown_rows, row, Row, Unit};
use serde_json::Value;

pub(super) fn report_rows(a: &Value, b: &Value) -> Vec<Row> {
    let mut rows = vec![];
    for (i, (x, y)) in gpu_pairs(a, b).iter().enumerate() {
        rows.extend(gpu_rows(i, x, y));
    }
    rows.extend(allocator_rows(a, b));
    let breakdown = |v: &Value| {
        let top = pick(v, &["breakdown"]);
        if top.is_null() {
            pick(v, &["allocator", "breakdown"])
        } else {
            top
        }
    };
    rows.extend(breakdown_rows("breakdown", &breakdown(a), &breakdown(b)));
    rows.retain(|r| !(r.a.is_null() && r.b.is_null()));
    rows
}

/// A GPU's identity: its UUID, else its index.
fn gpu_key(g: &Value) -> String {
    g.get("uuid")
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty())
        .map(String::from)
        .unwrap_or_else(|| {
            format!(
                "index {}",
                g.get("index").and_then(Value::as_u64).unwrap_or(0)
            )
        })
}

/// The two reports' GPUs side by side (null where one has no match).
fn gpu_pairs(a: &Value, b: &Value) -> Vec<(Value, Value)> {
    let gpus = |v: &Value| {
        v.get("gpus")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let key = gpu_key;
    let (ga, gb) = (gpus(a), gpus(b));
    // Two runs on one machine see the same UUIDs; on two machines, pair by index.
    let shared = ga.iter().any(|g| gb.iter().any(|h| key(g) == key(h)));
    if !shared {
        let at = |l: &[Value], i: usize| l.get(i).cloned().unwrap_or(Value::Null);
        return (0..ga.len().max(gb.len()))
            .map(|i| (at(&ga, i), at(&gb, i)))
            .collect();
    }
    let mut keys: Vec<String> = ga.iter().map(key).collect();
    keys.extend(
        gb.iter()
            .map(key)
            .filter(|k| !ga.iter().any(|g| &key(g) == k)),
    );
    let find = |l: &[Value], k: &str| {
        l.iter()
            .find(|g| key(g) == k)
            .cloned()
            .unwrap_or(Value::Null)
    };
    keys.iter().map(|k| (find(&ga, k), find(&gb, k))).collect()
}

/// Peak, used, total and risk of the `i`th pair of GPUs.
fn gpu_rows(i: usize, x: &Value, y: &Value) -> Vec<Row> {
    let index = x.get("index").or(y.get("index")).and_then(Value::as_u64);
    let scope = format!("GPU {}", index.unwrap_or(i as u64));
    let mut rows = vec![];
    for (item, field) in [
        ("peak", "peakBytes"),
        ("used", "usedBytes"),
        ("total", "totalBytes"),
    ] {
        rows.push(row(
            &scope,
            item,
            Unit::Bytes,
            pick(x, &[field]),
            pick(y, &[field]),
        ));
    }
    rows.push(row(
        &scope,
        "risk",
        Unit::Text,
        pick(x, &["risk"]),
        pick(y, &["risk"]),
    ));
    rows
}

/// The agent's allocator numbers.
fn allocator_rows(a: &Value, b: &Value) -> Vec<Row> {
    let mut rows = vec![];
    for (item, field) in [
        ("allocated", "allocatedBytes"),
        ("reserved", "reservedBytes"),
        ("peak allocated", "peakAllocatedBytes"),
    ] {
        rows.push(row(
            "allocator",
            item,
            Unit::Bytes,
            pick(a, &["allocator", field]),
            pick(b, &["allocator", field]),
        ));
    }
    rows.push(row(
        "allocator",
        "fragmentation",
        Unit::Number,
        pick(a, &["allocator", "fragmentation"]),
        pick(b, &["allocator", "fragmentation"]),
    ));
    rows
}

fn pick(v: &Value, path: &[&str]) -> Value {
    path.iter()
        .try_fold(v, |v, k| v.get(*k))
        .cloned()
        .unwrap_or(Value::Null)
}
