//! A pickle (protocol 2) writer for the few kinds a memory snapshot holds:
//! dicts with string keys, lists, tuples, strings, integers, booleans and None.
//! Hand-written: about forty lines of opcodes, where a crate would add a
//! workspace dependency for one file format; Python's `pickle.load` (and
//! so PyTorch's `memory_viz`) reads the result (tests/cli_seed_gaps.rs).

/// A value a snapshot is made of.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `None`.
    None,
    /// `True` / `False`.
    Bool(bool),
    /// An `int`.
    Int(i64),
    /// A `str`.
    Str(String),
    /// A `list`.
    List(Vec<Value>),
    /// A `tuple`.
    Tuple(Vec<Value>),
    /// A `dict` with `str` keys, in this order.
    Dict(Vec<(String, Value)>),
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Str(s.into())
    }
}

impl From<u64> for Value {
    fn from(n: u64) -> Self {
        Value::Int(i64::try_from(n).unwrap_or(i64::MAX))
    }
}

/// The pickle of `v`, protocol 2, as `pickle.dumps(v, protocol=2)` would
/// read back (without memoisation: nothing is shared).
pub fn dumps(v: &Value) -> Vec<u8> {
    let mut out = vec![0x80, 2]; // PROTO 2
    write(&mut out, v);
    out.push(b'.'); // STOP
    out
}

fn write(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::None => out.push(b'N'),
        Value::Bool(true) => out.push(0x88),  // NEWTRUE
        Value::Bool(false) => out.push(0x89), // NEWFALSE
        Value::Int(n) => int(out, *n),
        Value::Str(s) => str(out, s),
        Value::List(items) => {
            out.push(b']'); // EMPTY_LIST
            if !items.is_empty() {
                out.push(b'('); // MARK
                items.iter().for_each(|i| write(out, i));
                out.push(b'e'); // APPENDS
            }
        }
        Value::Tuple(items) if items.is_empty() => out.push(b')'), // EMPTY_TUPLE
        Value::Tuple(items) => {
            out.push(b'('); // MARK
            items.iter().for_each(|i| write(out, i));
            out.push(b't'); // TUPLE
        }
        Value::Dict(items) => {
            out.push(b'}'); // EMPTY_DICT
            if !items.is_empty() {
                out.push(b'('); // MARK
                for (k, v) in items {
                    str(out, k);
                    write(out, v);
                }
                out.push(b'u'); // SETITEMS
            }
        }
    }
}

fn str(out: &mut Vec<u8>, s: &str) {
    out.push(b'X'); // BINUNICODE: u32 length, UTF-8
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn int(out: &mut Vec<u8>, n: i64) {
    if let Ok(small) = i32::try_from(n) {
        out.push(b'J'); // BININT: i32, little-endian
        out.extend_from_slice(&small.to_le_bytes());
        return;
    }
    // LONG1: a length byte, then the shortest two's complement, little-endian.
    let mut b = n.to_le_bytes().to_vec();
    while b.len() > 1 {
        let (last, next) = (b[b.len() - 1], b[b.len() - 2]);
        if (last == 0 && next & 0x80 == 0) || (last == 0xff && next & 0x80 != 0) {
            b.pop();
        } else {
            break;
        }
    }
    out.push(0x8a);
    out.push(b.len() as u8);
    out.extend_from_slice(&b);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcodes_as_python_writes_them() {
        // pickle.dumps({"a": [1, True, None]}, protocol=2) without the memo.
        let v = Value::Dict(vec![(
            "a".into(),
            Value::List(vec![Value::Int(1), Value::Bool(true), Value::None]),
        )]);
        assert_eq!(
            dumps(&v),
            b"\x80\x02}(X\x01\x00\x00\x00a](J\x01\x00\x00\x00\x88Neu.".to_vec()
        );
        // 6 GiB does not fit an i32: LONG1 with the shortest bytes.
        let mut out = vec![];
        int(&mut out, 6 << 30);
        assert_eq!(out, b"\x8a\x05\x00\x00\x00\x80\x01".to_vec());
        let mut out = vec![];
        int(&mut out, -(1 << 40));
        assert_eq!(out, b"\x8a\x06\x00\x00\x00\x00\x00\xff".to_vec());
        assert_eq!(dumps(&Value::List(vec![])), b"\x80\x02].".to_vec());
        assert_eq!(
            dumps(&Value::Tuple(vec![Value::Int(0), Value::Int(0)])),
            b"\x80\x02(J\x00\x00\x00\x00J\x00\x00\x00\x00t.".to_vec()
        );
        assert_eq!(dumps(&Value::Tuple(vec![])), b"\x80\x02).".to_vec());
    }
}
