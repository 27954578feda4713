//! kubectl's printing flags (cli-runtime's `PrintFlags`) for commands that
//! print Kubernetes objects: `-o table|wide|json|yaml|name|jsonpath=…|
//! jsonpath-file=…|custom-columns=…|custom-columns-file=…`, `--no-headers`,
//! `--sort-by`. What `-o json` prints is what jsonpath, custom-columns and
//! `--sort-by` read, as in kubectl: a `v1 List` of the objects with their
//! API fields (no managedFields, whole floats as integers as the API server
//! returns them).

use super::jsonpath::{go_numbers, scalar, JsonPathError, Template};
use super::Table;
use clap::builder::{PossibleValue, TypedValueParser};
use serde_json::Value;

/// One `-o` value.
#[derive(Clone, Debug, PartialEq)]
pub enum Output {
    /// The command's columns.
    Table,
    /// The table with more columns.
    Wide,
    /// A `v1 List` as JSON (4-space indent, as kubectl).
    Json,
    /// The same List as YAML.
    Yaml,
    /// `kind.group/name` per object.
    Name,
    /// A kubectl JSONPath template applied to the List.
    JsonPath(Template),
    /// `HEADER:PATH,…`: one row per object.
    CustomColumns(Vec<Column>),
}

/// One column of `-o custom-columns`.
#[derive(Clone, Debug, PartialEq)]
pub struct Column {
    /// The header, as written.
    pub header: String,
    /// The path read from each object.
    pub path: Template,
}

/// The kinds of `-o` value, for a command to say which it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `table`.
    Table,
    /// `wide`.
    Wide,
    /// `json`.
    Json,
    /// `yaml`.
    Yaml,
    /// `name`.
    Name,
    /// `jsonpath=`, `jsonpath-file=`.
    JsonPath,
    /// `custom-columns=`, `custom-columns-file=`.
    CustomColumns,
}

/// Every kind: what list commands (`top`, `report`) take.
pub const ALL: &[Kind] = &[
    Kind::Table,
    Kind::Wide,
    Kind::Json,
    Kind::Yaml,
    Kind::Name,
    Kind::JsonPath,
    Kind::CustomColumns,
];

impl Output {
    fn kind(&self) -> Kind {
        match self {
            Output::Table => Kind::Table,
            Output::Wide => Kind::Wide,
            Output::Json => Kind::Json,
            Output::Yaml => Kind::Yaml,
            Output::Name => Kind::Name,
            Output::JsonPath(_) => Kind::JsonPath,
            Output::CustomColumns(_) => Kind::CustomColumns,
        }
    }

    /// Parses a `-o` value (files named by `*-file=` are read here).
    pub fn parse(s: &str) -> Result<Self, OutputError> {
        let read = |f: &str| {
            std::fs::read_to_string(f).map_err(|source| OutputError::Read {
                file: f.to_string(),
                source,
            })
        };
        let (name, arg) = s.split_once('=').map_or((s, None), |(n, a)| (n, Some(a)));
        match (name, arg) {
            ("table", None) | ("", None) => Ok(Output::Table),
            ("wide", None) => Ok(Output::Wide),
            ("json", None) => Ok(Output::Json),
            ("yaml", None) => Ok(Output::Yaml),
            ("name", None) => Ok(Output::Name),
            ("jsonpath", Some(t)) => Ok(Output::JsonPath(Template::parse(t)?)),
            ("jsonpath-file", Some(f)) => Ok(Output::JsonPath(Template::parse(&read(f)?)?)),
            ("custom-columns", Some(spec)) => columns(spec).map(Output::CustomColumns),
            ("custom-columns-file", Some(f)) => columns_file(&read(f)?).map(Output::CustomColumns),
            ("jsonpath" | "jsonpath-file" | "custom-columns" | "custom-columns-file", None) => {
                Err(OutputError::NeedsValue(name.to_string()))
            }
            _ => Err(OutputError::Unknown(s.to_string())),
        }
    }
}

/// Why a `-o` value was refused; clap prints it after `-o: `.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// A `*-file=` that cannot be read.
    #[error("cannot read {file}: {source}")]
    Read {
        /// The file.
        file: String,
        /// Why.
        source: std::io::Error,
    },
    /// A template or column path that does not parse.
    #[error(transparent)]
    Template(#[from] JsonPathError),
    /// `-o jsonpath` and the like without `=…`.
    #[error("-o {0} needs a value: -o {0}=…")]
    NeedsValue(String),
    /// No such format.
    #[error(
        "unknown output format {0:?}: table, wide, json, yaml, name, jsonpath=TEMPLATE, \
         jsonpath-file=FILE, custom-columns=SPEC, custom-columns-file=FILE"
    )]
    Unknown(String),
    /// `-o custom-columns=` with nothing after it.
    #[error("custom-columns format specified but no custom columns given")]
    NoColumns,
    /// A column without its header or its path.
    #[error("unexpected custom-columns spec: {0}, expected <header>:<json-path-expr>")]
    Column(String),
    /// A columns file without its two lines.
    #[error("a custom-columns file has two lines: the headers, then the paths")]
    ColumnsFileLines,
    /// A columns file whose lines do not pair up.
    #[error("{headers} headers but {paths} paths in the custom-columns file")]
    ColumnsFileMismatch {
        /// Headers on the first line.
        headers: usize,
        /// Paths on the second.
        paths: usize,
    },
}

/// `NAME:.metadata.name,RISK:.status.risk`.
fn columns(spec: &str) -> Result<Vec<Column>, OutputError> {
    if spec.trim().is_empty() {
        return Err(OutputError::NoColumns);
    }
    spec.split(',')
        .map(|c| match c.split_once(':') {
            Some((h, p)) if !h.is_empty() && !p.is_empty() => Ok(Column {
                header: h.to_string(),
                path: Template::parse(p)?,
            }),
            _ => Err(OutputError::Column(c.to_string())),
        })
        .collect()
}

/// kubectl's columns file: a line of headers and a line of paths.
fn columns_file(text: &str) -> Result<Vec<Column>, OutputError> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let (Some(h), Some(p)) = (lines.next(), lines.next()) else {
        return Err(OutputError::ColumnsFileLines);
    };
    let (h, p): (Vec<_>, Vec<_>) = (
        h.split_whitespace().collect(),
        p.split_whitespace().collect(),
    );
    if h.len() != p.len() {
        return Err(OutputError::ColumnsFileMismatch {
            headers: h.len(),
            paths: p.len(),
        });
    }
    let spec: Vec<String> = h.iter().zip(&p).map(|(h, p)| format!("{h}:{p}")).collect();
    columns(&spec.join(","))
}

/// clap's parser for `-o`, restricted to the kinds a command prints; its
/// possible values feed `--help` and shell completion.
#[derive(Clone, Copy, Debug)]
pub struct OutputParser(pub &'static [Kind]);

impl TypedValueParser for OutputParser {
    type Value = Output;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Output, clap::Error> {
        let fail = |msg: String| {
            clap::Error::raw(clap::error::ErrorKind::InvalidValue, format!("-o: {msg}\n"))
                .with_cmd(cmd)
        };
        let s = value.to_str().ok_or_else(|| fail("not UTF-8".into()))?;
        let out = Output::parse(s).map_err(|e| fail(e.to_string()))?;
        if self.0.contains(&out.kind()) {
            Ok(out)
        } else {
            let names: Vec<String> = self
                .possible_values()
                .into_iter()
                .flatten()
                .map(|p| p.get_name().to_string())
                .collect();
            Err(fail(format!(
                "{s:?} is not an output of this command; it prints: {}",
                names.join(", ")
            )))
        }
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        let pv = |k: &Kind| -> Vec<PossibleValue> {
            match k {
                Kind::Table => vec![PossibleValue::new("table").help("Columns for a person")],
                Kind::Wide => vec![PossibleValue::new("wide").help("The table with more columns")],
                Kind::Json => {
                    vec![PossibleValue::new("json")
                        .help("JSON (top, report: a v1 List of the objects)")]
                }
                Kind::Yaml => {
                    vec![PossibleValue::new("yaml")
                        .help("YAML (top, report: a v1 List of the objects)")]
                }
                Kind::Name => {
                    vec![PossibleValue::new("name").help("kind.group/name of each object")]
                }
                Kind::JsonPath => vec![
                    PossibleValue::new("jsonpath=").help("A kubectl JSONPath template"),
                    PossibleValue::new("jsonpath-file=").help("A JSONPath template from a file"),
                ],
                Kind::CustomColumns => vec![
                    PossibleValue::new("custom-columns=").help("HEADER:PATH,… one row per object"),
                    PossibleValue::new("custom-columns-file=")
                        .help("Headers and paths from a file"),
                ],
            }
        };
        Some(Box::new(self.0.iter().flat_map(pv)))
    }
}

/// What to write: stdout, and a note for stderr (kubectl's "No resources
/// found", which must not end up in a pipe).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Printed {
    /// For stdout.
    pub stdout: String,
    /// For stderr (empty: nothing).
    pub stderr: String,
}

impl From<String> for Printed {
    fn from(stdout: String) -> Self {
        Printed {
            stdout,
            stderr: String::new(),
        }
    }
}

/// The flags every command that lists objects takes (`top`, `report`).
#[derive(Clone, Debug, clap::Args)]
pub struct PrintArgs {
    /// Output format: table, wide, json, yaml, name, jsonpath=TEMPLATE, jsonpath-file=FILE,
    /// custom-columns=HEADER:PATH,…, custom-columns-file=FILE (kubectl's; see docs/cli.md).
    #[arg(short = 'o', long = "output", value_name = "FORMAT", default_value = "table", value_parser = OutputParser(ALL))]
    pub output: Output,
    /// Print no header line (table, wide, custom-columns).
    #[arg(long)]
    pub no_headers: bool,
    /// Sort by this JSONPath into each object, ascending, as kubectl:
    /// `--sort-by=.status.timeToOomSeconds`; objects without the field last.
    #[arg(long, value_name = "JSONPATH", value_parser = parse_sort_by)]
    pub sort_by: Option<Template>,
}

impl Default for PrintArgs {
    fn default() -> Self {
        PrintArgs {
            output: Output::Table,
            no_headers: false,
            sort_by: None,
        }
    }
}

fn parse_sort_by(s: &str) -> Result<Template, JsonPathError> {
    Template::parse(s)
}

impl PrintArgs {
    /// Whether `-o wide`.
    pub fn wide(&self) -> bool {
        self.output == Output::Wide
    }

    /// Whether the output is a table the command draws itself.
    pub fn is_table(&self) -> bool {
        matches!(self.output, Output::Table | Output::Wide)
    }

    /// Prints `items` (in the command's order, re-sorted by `--sort-by`):
    /// `objects` gives each one's API object, `table` draws the command's
    /// own table; `none` is the stderr note for an empty table.
    pub fn print<T>(
        &self,
        items: &[T],
        object: impl Fn(&T) -> Value,
        table: impl FnOnce(&[&T]) -> Table,
        none: &str,
    ) -> Printed {
        let mut pairs: Vec<(&T, Value)> = items.iter().map(|t| (t, object(t))).collect();
        if let Some(key) = &self.sort_by {
            pairs.sort_by(|a, b| compare_keys(&key.values(&a.1), &key.values(&b.1)));
        }
        let (items, values): (Vec<&T>, Vec<Value>) = pairs.into_iter().unzip();
        let stdout = match &self.output {
            Output::Table | Output::Wide if items.is_empty() => {
                return Printed {
                    stdout: String::new(),
                    stderr: format!("{none}\n"),
                }
            }
            Output::Table | Output::Wide => table(&items).no_headers(self.no_headers).render(),
            Output::Json => json(&list(values)),
            Output::Yaml => {
                serde_yaml::to_string(&list(values)).unwrap_or_else(|e| format!("# {e}\n"))
            }
            Output::Name => values.iter().map(|v| format!("{}\n", name_of(v))).collect(),
            Output::JsonPath(t) => t.render(&list(values)),
            Output::CustomColumns(cols) => custom_columns(cols, &values)
                .no_headers(self.no_headers)
                .render(),
        };
        stdout.into()
    }
}

/// Items whose key is missing sort last; numbers by value; else by text.
fn compare_keys(a: &[&Value], b: &[&Value]) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    match (a.first(), b.first()) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Greater,
        (Some(_), None) => Ordering::Less,
        (Some(Value::Number(x)), Some(Value::Number(y))) => x
            .as_f64()
            .unwrap_or(0.0)
            .total_cmp(&y.as_f64().unwrap_or(0.0)),
        (Some(x), Some(y)) => scalar(x).cmp(&scalar(y)),
    }
}

fn custom_columns(cols: &[Column], values: &[Value]) -> Table {
    let mut t = Table::new(cols.iter().map(|c| c.header.clone()));
    for v in values {
        t.row(cols.iter().map(|c| {
            let found = c.path.values(v);
            if found.is_empty() {
                "<none>".to_string()
            } else {
                found.into_iter().map(scalar).collect::<Vec<_>>().join(",")
            }
        }));
    }
    t
}

/// A kubectl `v1 List` of `items`.
pub fn list(items: Vec<Value>) -> Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {"resourceVersion": ""},
        "items": items,
    })
}

/// An object as `kubectl get -o json` prints it: no managedFields, whole
/// floats as integers.
pub fn object<K: kube::Resource + serde::Serialize + Clone>(o: &K) -> Value {
    let mut o = o.clone();
    o.meta_mut().managed_fields = None;
    go_numbers(serde_json::to_value(&o).unwrap_or_default())
}

/// `memoryprofile.memprof.dev/train`: kind, lower-cased, dot group, slash name.
pub fn name_of(v: &Value) -> String {
    let kind = v["kind"].as_str().unwrap_or_default().to_ascii_lowercase();
    let group = v["apiVersion"]
        .as_str()
        .and_then(|a| a.split_once('/'))
        .map_or(String::new(), |(g, _)| format!(".{g}"));
    format!(
        "{kind}{group}/{}",
        v["metadata"]["name"].as_str().unwrap_or_default()
    )
}

/// JSON as kubectl indents it (four spaces), with a trailing newline.
pub fn json(v: &Value) -> String {
    use serde::Serialize;
    let mut buf = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, fmt);
    if v.serialize(&mut ser).is_err() {
        return "{}\n".into();
    }
    let mut s = String::from_utf8(buf).unwrap_or_default();
    s.push('\n');
    s
}

#[cfg(test)]
mod tests;
