//! The grid of a sweep: `--vary VAR=v1,v2,…` lists and their cartesian
//! product, in the order given (the first variable changes slowest).

use std::collections::BTreeSet;

/// Why a `--vary` list is not usable.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum GridError {
    /// No `=` in the argument.
    #[error("--vary {0:?}: expected VAR=v1,v2,… (e.g. --vary BATCH_SIZE=8,16,32)")]
    NoEquals(String),
    /// The variable name is not an environment variable name.
    #[error("--vary {0:?}: the name must be letters, digits and _ (an environment variable), not starting with a digit")]
    BadName(String),
    /// No values, or an empty value.
    #[error("--vary {0}: give at least one non-empty value, comma-separated")]
    NoValues(String),
    /// The same value twice.
    #[error("--vary {name}: value {value:?} is listed twice")]
    Duplicate {
        /// Variable.
        name: String,
        /// Repeated value.
        value: String,
    },
    /// The same variable twice.
    #[error("--vary {0} is given twice: put all its values in one list")]
    RepeatedVariable(String),
    /// Too many configurations.
    #[error("the grid has {0} configurations (more than {MAX_CONFIGS}): vary fewer values")]
    TooLarge(usize),
}

/// Most configurations one sweep runs (each is a whole training process).
pub const MAX_CONFIGS: usize = 1000;

/// One swept variable and its values, as given.
#[derive(Clone, Debug, PartialEq)]
pub struct Vary {
    /// Environment variable name.
    pub name: String,
    /// Values, in the order given.
    pub values: Vec<String>,
}

/// One configuration: a value for every swept variable, in `--vary` order.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// `(variable, value)` pairs.
    pub values: Vec<(String, String)>,
}

impl Config {
    /// `BATCH_SIZE=8 SEQ_LEN=512`, or `(no variables)`.
    pub fn label(&self) -> String {
        if self.values.is_empty() {
            return "(no variables)".into();
        }
        let parts: Vec<String> = self
            .values
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        parts.join(" ")
    }

    /// The value of `name`, if swept.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses one `VAR=v1,v2,…` argument.
pub fn parse_vary(arg: &str) -> Result<Vary, GridError> {
    let (name, list) = arg
        .split_once('=')
        .ok_or_else(|| GridError::NoEquals(arg.into()))?;
    let name = name.trim();
    let valid = name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.chars().next().is_some_and(|c| !c.is_ascii_digit());
    if !valid {
        return Err(GridError::BadName(arg.into()));
    }
    let values: Vec<String> = list.split(',').map(|v| v.trim().to_string()).collect();
    if values.iter().any(String::is_empty) {
        return Err(GridError::NoValues(name.into()));
    }
    let mut seen = BTreeSet::new();
    for v in &values {
        if !seen.insert(v) {
            return Err(GridError::Duplicate {
                name: name.into(),
                value: v.clone(),
            });
        }
    }
    Ok(Vary {
        name: name.into(),
        values,
    })
}

/// Every combination of the lists' values; one empty configuration when
/// nothing is varied (the command runs once).
pub fn product(varies: &[Vary]) -> Result<Vec<Config>, GridError> {
    let mut names = BTreeSet::new();
    for v in varies {
        if !names.insert(&v.name) {
            return Err(GridError::RepeatedVariable(v.name.clone()));
        }
    }
    let size = varies
        .iter()
        .try_fold(1usize, |n, v| n.checked_mul(v.values.len()))
        .unwrap_or(usize::MAX);
    if size > MAX_CONFIGS {
        return Err(GridError::TooLarge(size));
    }
    let mut configs = vec![Config { values: vec![] }];
    for v in varies {
        configs = configs
            .into_iter()
            .flat_map(|c| {
                v.values.iter().map(move |value| {
                    let mut values = c.values.clone();
                    values.push((v.name.clone(), value.clone()));
                    Config { values }
                })
            })
            .collect();
    }
    Ok(configs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grid_is_the_product_with_the_first_variable_slowest() {
        let b = parse_vary("BATCH_SIZE=8,16,32").unwrap();
        let s = parse_vary("SEQ_LEN = 512, 1024").unwrap();
        assert_eq!(s.name, "SEQ_LEN");
        assert_eq!(s.values, vec!["512", "1024"]);
        let grid = product(&[b, s]).unwrap();
        let labels: Vec<String> = grid.iter().map(Config::label).collect();
        assert_eq!(
            labels,
            vec![
                "BATCH_SIZE=8 SEQ_LEN=512",
                "BATCH_SIZE=8 SEQ_LEN=1024",
                "BATCH_SIZE=16 SEQ_LEN=512",
                "BATCH_SIZE=16 SEQ_LEN=1024",
                "BATCH_SIZE=32 SEQ_LEN=512",
                "BATCH_SIZE=32 SEQ_LEN=1024",
            ]
        );
        assert_eq!(grid[3].get("SEQ_LEN"), Some("1024"));
        assert_eq!(grid[3].get("LORA_R"), None);
    }

    #[test]
    fn nothing_varied_runs_the_command_once() {
        let grid = product(&[]).unwrap();
        assert_eq!(grid.len(), 1);
        assert_eq!(grid[0].label(), "(no variables)");
    }

    #[test]
    fn bad_lists_say_what_to_write() {
        assert_eq!(
            parse_vary("BATCH_SIZE"),
            Err(GridError::NoEquals("BATCH_SIZE".into()))
        );
        assert!(matches!(parse_vary("1X=2"), Err(GridError::BadName(_))));
        assert!(matches!(parse_vary("A-B=2"), Err(GridError::BadName(_))));
        assert!(matches!(parse_vary("B=8,,16"), Err(GridError::NoValues(_))));
        assert!(matches!(parse_vary("B="), Err(GridError::NoValues(_))));
        assert!(matches!(
            parse_vary("B=8,16,8"),
            Err(GridError::Duplicate { .. })
        ));
        let b = parse_vary("B=1,2").unwrap();
        assert!(matches!(
            product(&[b.clone(), b]),
            Err(GridError::RepeatedVariable(_))
        ));
        let big: Vec<String> = (0..40).map(|i| i.to_string()).collect();
        let v = |n: &str| parse_vary(&format!("{n}={}", big.join(","))).unwrap();
        assert_eq!(product(&[v("A"), v("B")]), Err(GridError::TooLarge(1600)));
    }
}
