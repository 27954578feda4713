//! `scaleBatch` with `accumulation`: keep the global batch. The micro-batch
//! goes down to what memory allows (the factor's or the fit's value, the
//! *cap*), gradient accumulation goes up, and micro × accumulation stays what
//! it was. Ranks are not changed by a recreation, so keeping the per-rank
//! product keeps micro × accumulation × ranks.
//!
//! Why the optimisation, not the throughput, comes first: the learning rate
//! was tuned for the global batch; a remediation that silently changes it
//! changes the run. So an exact split is preferred even at a smaller
//! micro-batch than the cap, as long as it stays above half the cap (a
//! bounded throughput cost); only when none exists is the product allowed
//! to grow, to the nearest value not below it, and the change says so.

use super::{EnvChange, PlanError};
use memprof_api::ScaleBatchAction;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How many micro-batch candidates below the cap are tried for an exact split.
const MAX_CANDIDATES: u64 = 4096;

/// The accumulation change riding on a micro-batch change.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AccumulationChange {
    /// Env var.
    pub env: String,
    /// Value before (1 when the container did not set it).
    pub from: u64,
    /// Value after.
    pub to: u64,
    /// The container did not set the var: the recreated Job gets it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub added: bool,
}

/// Micro-batch and accumulation that keep (or nearly keep) the per-rank batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeptBatch {
    /// New micro-batch.
    pub micro: u64,
    /// New accumulation steps.
    pub accumulation: u64,
    /// micro × accumulation before.
    pub before: u64,
    /// micro × accumulation after (≥ `before`; equal when exact).
    pub after: u64,
}

impl KeptBatch {
    /// Whether the product is kept exactly.
    pub fn exact(&self) -> bool {
        self.before == self.after
    }
}

/// The micro-batch and accumulation replacing `micro × accumulation`, with
/// the micro-batch at most `cap` (< `micro`). A micro-batch must be a
/// multiple of `round_to` (when > 1) and at least `minimum`, or be `cap`
/// itself (the factor's own rounding allows `minimum` off the multiple).
///
/// First choice: the largest micro-batch in [⌈cap/2⌉, cap] that divides the
/// product (exact). Else: the fewest accumulation steps the cap allows,
/// a = ⌈P/cap⌉, and the smallest allowed micro-batch m with m × a ≥ P: the
/// nearest product not below P for that accumulation. `None` when the
/// product overflows.
pub fn keep_global(
    micro: u64,
    accumulation: u64,
    cap: u64,
    minimum: u64,
    round_to: Option<u64>,
) -> Option<KeptBatch> {
    let before = micro.checked_mul(accumulation.max(1))?;
    let cap = cap.clamp(1, micro.max(1));
    let r = round_to.filter(|r| *r > 1).unwrap_or(1);
    let allowed = |m: u64| m == cap || (m % r == 0 && m >= minimum);
    let low = cap
        .div_ceil(2)
        .max(cap.saturating_sub(MAX_CANDIDATES))
        .max(1);
    if let Some(m) = (low..=cap).rev().find(|m| allowed(*m) && before % m == 0) {
        return Some(KeptBatch {
            micro: m,
            accumulation: before / m,
            before,
            after: before,
        });
    }
    let steps = before.div_ceil(cap);
    let at_least = before.div_ceil(steps).max(minimum);
    let m = at_least.div_ceil(r).checked_mul(r)?.min(cap);
    let accumulation = before.div_ceil(m);
    Some(KeptBatch {
        micro: m,
        accumulation,
        before,
        after: m.checked_mul(accumulation)?,
    })
}

/// The literal integer value (at least 1) of `env` in the container named
/// `container`; `Ok(None)` when the container does not set it. The reading
/// is the plan's own (`super::values::env_number`); an accumulation of 0 is refused.
fn literal(job: &Value, container: &str, env: &str) -> Result<Option<u64>, PlanError> {
    let found = job["spec"]["template"]["spec"]["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == container));
    let Some(c) = found else { return Ok(None) };
    match super::values::env_number(c, env, container)? {
        Some(0) => Err(PlanError::NotANumber {
            env: env.into(),
            container: container.into(),
            value: "0".into(),
        }),
        v => Ok(v),
    }
}

/// Rewrites each micro-batch change (whose `to` is the cap memory allows)
/// so that micro × accumulation is kept, adding the accumulation change.
pub(super) fn apply(
    job: &Value,
    env: &str,
    changes: Vec<EnvChange>,
    minimum: u64,
    round_to: Option<u64>,
) -> Result<Vec<EnvChange>, PlanError> {
    changes
        .into_iter()
        .map(|c| {
            let found = literal(job, &c.container, env)?;
            let from = found.unwrap_or(1);
            let kept = keep_global(c.from, from, c.to, minimum, round_to).ok_or_else(|| {
                PlanError::BatchOverflow {
                    env: c.env.clone(),
                    container: c.container.clone(),
                }
            })?;
            Ok(EnvChange {
                to: kept.micro,
                accumulation: Some(AccumulationChange {
                    env: env.into(),
                    from,
                    to: kept.accumulation,
                    added: found.is_none(),
                }),
                ..c
            })
        })
        .collect()
}

/// [`apply`] when the action names an accumulation var, else the changes as they are.
pub(super) fn keep_if_asked(
    job: &Value,
    s: &ScaleBatchAction,
    changes: Vec<EnvChange>,
) -> Result<Vec<EnvChange>, PlanError> {
    match &s.accumulation {
        Some(a) => apply(
            job,
            &a.env,
            changes,
            u64::from(s.minimum),
            s.round_to.map(u64::from),
        ),
        None => Ok(changes),
    }
}

/// Sets env `name` of container `c` to `value`, adding the var if the
/// container does not set it (an accumulation var the trainer defaults to 1).
pub(super) fn set_env(c: &mut Value, name: &str, value: u64) {
    if !c["env"].is_array() {
        c["env"] = Value::Array(Vec::new());
    }
    let Some(vars) = c["env"].as_array_mut() else {
        return;
    };
    match vars.iter_mut().find(|v| v["name"] == name) {
        Some(v) => v["value"] = value.to_string().into(),
        None => vars.push(serde_json::json!({"name": name, "value": value.to_string()})),
    }
}

/// `BATCH_SIZE×GRAD_ACCUM_STEPS 32×1 → 16×2`, and when the product grows,
/// by how much (the record must say the optimisation changed).
pub fn describe(c: &EnvChange) -> Option<String> {
    let a = c.accumulation.as_ref()?;
    let before = c.from.saturating_mul(a.from);
    let after = c.to.saturating_mul(a.to);
    let kept = if before == after {
        String::new()
    } else {
        format!(" (batch per rank {before} → {after}, nearest not below)")
    };
    Some(format!(
        "scaleBatch {}×{} {}×{} → {}×{}{kept}",
        c.env, a.env, c.from, a.from, c.to, a.to
    ))
}

/// The arithmetic for `memprof policy explain`, one line per distinct change.
pub fn explain_lines(changes: &[EnvChange], ranks: Option<u32>) -> Vec<String> {
    let mut out = Vec::new();
    for c in changes {
        let Some(a) = &c.accumulation else { continue };
        let (before, after) = (c.from.saturating_mul(a.from), c.to.saturating_mul(a.to));
        let r = ranks.map_or_else(|| "ranks".to_string(), |r| r.to_string());
        let global = |p: u64| {
            ranks.map_or_else(String::new, |r| {
                format!(" = {}", p.saturating_mul(u64::from(r)))
            })
        };
        let line = format!(
            "keep global batch ({} {}): {}×{}×{r}{} → {}×{}×{r}{} ({})",
            c.container,
            format_args!("{}×{}×ranks", c.env, a.env),
            c.from,
            a.from,
            global(before),
            c.to,
            a.to,
            global(after),
            if before == after {
                "exact".to_string()
            } else {
                format!("{after} is the nearest not below {before} per rank")
            }
        );
        if !out.contains(&line) {
            out.push(line);
        }
    }
    out
}
