//! Verification after the grid: per model (swept variable and group), the
//! search of `memprof_analysis::memsearch` asks for a run; the run is done
//! and recorded like a grid run (its `trial` says why), the model is
//! refitted with it, and so on until the search is done or `--verify-runs`
//! is spent. `--no-verify` skips this; the prediction is then printed as
//! not verified.

use crate::local::sweep::grid::Config;
use crate::local::sweep::model::{self, num, Target};
use crate::local::sweep::record::RunRecord;
use crate::local::sweep::runner::RunError;
use crate::local::sweep::session::Session;
use memprof_analysis::memsearch::Next;
use std::collections::BTreeMap;

/// Runs what the search asks for, at most `budget` runs per model, adding
/// them to `runs`. Returns true when Ctrl-C interrupted it.
pub async fn verify(
    session: &mut Session<'_>,
    variables: &[String],
    target: &Target,
    budget: usize,
    runs: &mut Vec<RunRecord>,
) -> Result<bool, RunError> {
    if budget == 0 {
        return Ok(false);
    }
    let keys: Vec<(String, BTreeMap<String, String>)> = model::models(variables, runs, target)
        .into_iter()
        .map(|m| (m.variable, m.fixed))
        .collect();
    for (var, fixed) in keys {
        for _ in 0..budget {
            let Some((x, why)) = next_run(variables, target, runs, &var, &fixed) else {
                break;
            };
            let config = config_of(variables, &var, x, &fixed);
            match session.run(&config, Some(why)).await? {
                Some(r) => runs.push(r),
                None => return Ok(true),
            }
        }
    }
    Ok(false)
}

/// The run the search of model (`var`, `fixed`) asks for, if any.
fn next_run(
    variables: &[String],
    target: &Target,
    runs: &[RunRecord],
    var: &str,
    fixed: &BTreeMap<String, String>,
) -> Option<(f64, String)> {
    let m = model::models(variables, runs, target)
        .into_iter()
        .find(|m| m.variable == var && &m.fixed == fixed)?;
    match m.search? {
        Next::Run { x, why } => Some((x, why)),
        Next::Done { .. } => None,
    }
}

/// The configuration with `var = x` and the other variables at `fixed`,
/// in `--vary` order.
pub fn config_of(
    variables: &[String],
    var: &str,
    x: f64,
    fixed: &BTreeMap<String, String>,
) -> Config {
    Config {
        values: variables
            .iter()
            .filter_map(|v| {
                if v == var {
                    Some((v.clone(), num(x)))
                } else {
                    fixed.get(v).map(|f| (v.clone(), f.clone()))
                }
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trial_keeps_the_other_variables_in_vary_order() {
        let vars = vec!["BATCH_SIZE".to_string(), "SEQ_LEN".to_string()];
        let fixed: BTreeMap<String, String> = [("BATCH_SIZE".into(), "4".into())].into();
        let c = config_of(&vars, "SEQ_LEN", 5120.0, &fixed);
        assert_eq!(c.label(), "BATCH_SIZE=4 SEQ_LEN=5120");
    }
}
