//! kubectl's JSONPath templates (`-o jsonpath=…`, `--sort-by`, the columns of
//! `-o custom-columns=…`). kubectl's dialect is its own: a template of text
//! and `{…}` actions (`{.items[*].metadata.name}`, `{range .items[*]}…{end}`,
//! `{"\n"}`), with paths that start at `.` and take `\.` inside names. The
//! template layer is here; each path is translated to RFC 9535 JSONPath and
//! evaluated by `serde_json_path` (filters, slices, unions, `..`).
//!
//! Supported: text; `{.a.b}`, `{$.a}`, `{@}`, `{.a[*].b}`, `{.a[0]}`,
//! `{.a[-1:]}`, `{.a[0,1]}`, `{..name}`, `{.a[?(@.b=="x")].c}` (RFC filter
//! syntax: `==`, `!=`, `<`, `&&`, `||`, `!`, `length()`…),
//! `{.labels.app\.kubernetes\.io/name}`, `{.labels['app.kubernetes.io/name']}`,
//! `{range PATH}…{end}` (nested), `{"text"}` / `{'text'}` with `\n`, `\t`.
//! Not supported (an error says so): kubectl's `{.a,.b}` lists of paths in
//! one action, `=~` regex filters (use RFC `match(@.x, 're')`), `{else}`.
//! Missing fields print nothing, as kubectl's default
//! `--allow-missing-template-keys=true`.

use serde_json::Value;
use serde_json_path::JsonPath;

/// Why a template was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JsonPathError {
    /// A `{` without its `}`.
    #[error("jsonpath template {template:?}: unclosed action starting at byte {at} (every {{ needs a }})")]
    Unclosed {
        /// The template.
        template: String,
        /// Where the action starts.
        at: usize,
    },
    /// `{range …}` without `{end}`, or `{end}` without `{range …}`.
    #[error("jsonpath template {0:?}: every {{range …}} needs an {{end}} and every {{end}} a {{range …}}")]
    Range(String),
    /// A path that does not parse.
    #[error("jsonpath {path:?}: {reason} (kubectl's syntax: {{.items[*].metadata.name}}, {{range .items[*]}}…{{end}}; see docs/cli.md)")]
    Path {
        /// The path as written.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// Where a path's text breaks kubectl's syntax (the reason of a
/// [`JsonPathError::Path`]).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
enum SyntaxError {
    /// A character where a `.name` or a `[…]` must be.
    #[error("unexpected {found:?} at character {at}")]
    Unexpected { found: char, at: usize },
    /// A `[` without its `]`.
    #[error("unclosed [ at character {0}")]
    UnclosedBracket(usize),
}

/// One piece of a parsed template.
#[derive(Clone, Debug, PartialEq)]
enum Node {
    Text(String),
    Path(Path),
    Range(Path, Vec<Node>),
}

/// A path translated to RFC 9535, and whether it starts at the root (`$`)
/// rather than at the current element (`.`, `@`).
#[derive(Clone, Debug, PartialEq)]
struct Path {
    from_root: bool,
    rfc: JsonPath,
}

/// A parsed kubectl JSONPath template.
#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    nodes: Vec<Node>,
}

impl Template {
    /// Parses `template` (`{.items[*].metadata.name}`, or a bare path
    /// `.metadata.name`, which kubectl also accepts in `--sort-by` and columns).
    pub fn parse(template: &str) -> Result<Self, JsonPathError> {
        let t = template.trim();
        let text = if t.contains('{') {
            template.to_string()
        } else {
            format!("{{{t}}}")
        };
        let actions = split_actions(&text)?;
        let mut stack: Vec<(Option<Path>, Vec<Node>)> = vec![(None, Vec::new())];
        for a in actions {
            match a {
                Action::Text(s) => push(&mut stack, Node::Text(s)),
                Action::Expr(e) => match e.trim() {
                    "end" => match (stack.len(), stack.pop()) {
                        (2.., Some((Some(path), nodes))) => {
                            push(&mut stack, Node::Range(path, nodes))
                        }
                        _ => return Err(JsonPathError::Range(template.into())),
                    },
                    e if e.starts_with("range ") => {
                        stack.push((Some(parse_path(&e[6..])?), Vec::new()));
                    }
                    e if e.starts_with('"') || e.starts_with('\'') => {
                        push(&mut stack, Node::Text(literal(e)?));
                    }
                    e => push(&mut stack, Node::Path(parse_path(e)?)),
                },
            }
        }
        match stack.pop() {
            Some((None, nodes)) if stack.is_empty() => Ok(Template { nodes }),
            _ => Err(JsonPathError::Range(template.into())),
        }
    }

    /// The template applied to `root`, as kubectl prints it: the results of
    /// one action separated by spaces, strings bare, objects as JSON.
    pub fn render(&self, root: &Value) -> String {
        let mut out = String::new();
        render_nodes(&self.nodes, root, root, &mut out);
        out
    }

    /// Every value the template's paths select (for `--sort-by` and columns:
    /// a template of one path gives that path's results).
    pub fn values<'v>(&self, root: &'v Value) -> Vec<&'v Value> {
        let mut out = Vec::new();
        for n in &self.nodes {
            if let Node::Path(p) = n {
                out.extend(p.rfc.query(root).all());
            }
        }
        out
    }
}

fn push(stack: &mut [(Option<Path>, Vec<Node>)], node: Node) {
    if let Some((_, nodes)) = stack.last_mut() {
        nodes.push(node);
    }
}

fn render_nodes(nodes: &[Node], root: &Value, cur: &Value, out: &mut String) {
    for n in nodes {
        match n {
            Node::Text(s) => out.push_str(s),
            Node::Path(p) => {
                let from = if p.from_root { root } else { cur };
                let vals: Vec<String> = p.rfc.query(from).all().into_iter().map(scalar).collect();
                out.push_str(&vals.join(" "));
            }
            Node::Range(p, body) => {
                let from = if p.from_root { root } else { cur };
                for item in p.rfc.query(from).all() {
                    render_nodes(body, root, item, out);
                }
            }
        }
    }
}

/// A value as kubectl prints it: strings bare, whole floats without `.0`
/// (Go's encoding), objects and arrays as compact JSON.
pub fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => number(n),
        Value::Null => String::new(),
        Value::Bool(b) => b.to_string(),
        other => serde_json::to_string(&go_numbers(other.clone())).unwrap_or_default(),
    }
}

fn number(n: &serde_json::Number) -> String {
    match n.as_f64() {
        Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
        _ => n.to_string(),
    }
}

/// Whole floats as integers, as the API server and kubectl print them
/// (`75.0` written by serde reads back as `75`).
pub fn go_numbers(v: Value) -> Value {
    match v {
        Value::Number(n) if n.is_f64() => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => Value::from(f as i64),
            _ => Value::Number(n),
        },
        Value::Array(a) => Value::Array(a.into_iter().map(go_numbers).collect()),
        Value::Object(o) => Value::Object(o.into_iter().map(|(k, v)| (k, go_numbers(v))).collect()),
        v => v,
    }
}

enum Action {
    Text(String),
    Expr(String),
}

/// Splits a template into text and `{…}` actions; a `}` inside quotes does
/// not close an action.
fn split_actions(t: &str) -> Result<Vec<Action>, JsonPathError> {
    let mut out = Vec::new();
    let mut rest = t;
    let mut offset = 0;
    while let Some(start) = rest.find('{') {
        if start > 0 {
            out.push(Action::Text(rest[..start].to_string()));
        }
        let body = &rest[start + 1..];
        let mut quote: Option<char> = None;
        let mut escaped = false;
        let mut end = None;
        for (i, c) in body.char_indices() {
            match (quote, c) {
                (_, _) if escaped => escaped = false,
                (Some(_), '\\') => escaped = true,
                (Some(q), c) if c == q => quote = None,
                (None, '"' | '\'') => quote = Some(c),
                (None, '}') => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let end = end.ok_or(JsonPathError::Unclosed {
            template: t.to_string(),
            at: offset + start,
        })?;
        out.push(Action::Expr(body[..end].to_string()));
        offset += start + 1 + end + 1;
        rest = &body[end + 1..];
    }
    if !rest.is_empty() {
        out.push(Action::Text(rest.to_string()));
    }
    Ok(out)
}

/// `"a\tb"` or `'x'`: the text, with `\n`, `\t`, `\r`, `\\` and quotes unescaped.
fn literal(e: &str) -> Result<String, JsonPathError> {
    let q = e.chars().next().unwrap_or('"');
    let inner = e
        .strip_prefix(q)
        .and_then(|s| s.strip_suffix(q))
        .ok_or_else(|| JsonPathError::Path {
            path: e.into(),
            reason: "unterminated string".into(),
        })?;
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    Ok(out)
}

/// A kubectl path (`.a.b[*]`, `$.a`, `@`, `..x`, `a.b`) as RFC 9535.
fn parse_path(p: &str) -> Result<Path, JsonPathError> {
    let err = |reason: &str| JsonPathError::Path {
        path: p.to_string(),
        reason: reason.to_string(),
    };
    let s = p.trim();
    if s.contains(",.") || s.starts_with(',') {
        return Err(err(
            "several paths in one action are not supported: use one {…} per path",
        ));
    }
    if s.contains("=~") {
        return Err(err("=~ is not supported: use match(@.field, 'regex')"));
    }
    let (from_root, body) = match s.strip_prefix('$') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('@').unwrap_or(s)),
    };
    let rfc = translate(body).map_err(|r| err(&r.to_string()))?;
    let rfc = JsonPath::parse(&rfc).map_err(|e| err(&e.to_string()))?;
    Ok(Path { from_root, rfc })
}

/// `.a.b\.c[0]..d` → `$['a']['b.c'][0]..['d']`; brackets are copied as they
/// are (RFC 9535 accepts kubectl's `[*]`, `[0]`, `[1:3]`, `['x']`, `[?(…)]`).
fn translate(body: &str) -> Result<String, SyntaxError> {
    let mut out = String::from("$");
    let b: Vec<char> = body.chars().collect();
    let mut i = 0;
    // kubectl takes `metadata.name` for `.metadata.name` in columns.
    if b.first().is_some_and(|c| *c != '.' && *c != '[') {
        i = read_name(&b, 0, &mut out);
    }
    while i < b.len() {
        match b[i] {
            '.' if b.get(i + 1) == Some(&'.') => {
                out.push_str("..");
                i = if b.get(i + 2) == Some(&'[') {
                    i + 2
                } else {
                    read_name(&b, i + 2, &mut out)
                };
            }
            '.' => i = read_name(&b, i + 1, &mut out),
            '[' => i = copy_bracket(&b, i, &mut out)?,
            found => return Err(SyntaxError::Unexpected { found, at: i }),
        }
    }
    Ok(out)
}

/// Reads a member name from `i` up to an unescaped `.` or `[`; writes it
/// as `['name']` (or `[*]`). Returns where it stopped.
fn read_name(b: &[char], mut i: usize, out: &mut String) -> usize {
    let mut name = String::new();
    while i < b.len() && b[i] != '.' && b[i] != '[' {
        if b[i] == '\\' && i + 1 < b.len() {
            i += 1;
        }
        name.push(b[i]);
        i += 1;
    }
    if name == "*" {
        out.push_str("[*]");
    } else if !name.is_empty() {
        let quoted = name.replace('\\', "\\\\").replace('\'', "\\'");
        out.push_str(&format!("['{quoted}']"));
    }
    i
}

/// Copies `[…]` (nested brackets and quotes respected) from `i`.
fn copy_bracket(b: &[char], i: usize, out: &mut String) -> Result<usize, SyntaxError> {
    let (mut depth, mut quote, mut j) = (0usize, None::<char>, i);
    while j < b.len() {
        let c = b[j];
        out.push(c);
        match (quote, c) {
            (Some(_), '\\') if j + 1 < b.len() => {
                j += 1;
                out.push(b[j]);
            }
            (Some(q), c) if c == q => quote = None,
            (None, '"' | '\'') => quote = Some(c),
            (None, '[') => depth += 1,
            (None, ']') => {
                depth -= 1;
                if depth == 0 {
                    return Ok(j + 1);
                }
            }
            _ => {}
        }
        j += 1;
    }
    Err(SyntaxError::UnclosedBracket(i))
}

#[cfg(test)]
mod tests;
