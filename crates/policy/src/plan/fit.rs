//! `scaleBatch` with `mode: fit`: the batch computed by `analysis::batchfit`
//! from the profile's `batchRecommendation` (the one memory model), or the
//! factor when the evidence is too thin or does not back the value (an
//! extrapolation further than a held-out check covered is never acted on),
//! said in the change's note and an Event.

use super::values::env_changes;
use super::{accum, EnvChange, PlanError, Step, REASON_BATCH_FIT, REASON_BATCH_FIT_FALLBACK};
use memprof_analysis::batchfit;
use memprof_api::{truncate_utf8, BatchRecommendation, ScaleBatchAction, ScaleMode, ScaleValue};
use serde_json::Value;

/// The env changes of one `scaleBatch` action, and for `mode: fit` the
/// Event saying what the fit did (or why it fell back to the factor).
pub(super) fn scale_batch(
    job: &Value,
    s: &ScaleBatchAction,
    fit: Option<&BatchRecommendation>,
) -> Result<(Vec<EnvChange>, Option<Step>), PlanError> {
    let scale = ScaleValue {
        factor: s.factor,
        minimum: s.minimum,
        round_to: s.round_to,
    };
    // With `accumulation`, the factor's or the fit's value is the cap memory
    // allows; the micro-batch is then chosen under it to keep the global batch.
    let keep = |changes| accum::keep_if_asked(job, s, changes);
    let by_factor = env_changes(job, &s.env, s.container.as_deref(), &scale, None)?;
    if s.mode != Some(ScaleMode::Fit) {
        return Ok((keep(by_factor)?, None));
    }
    let from = by_factor.iter().map(|c| c.from).max().unwrap_or(0);
    let computed = batchfit::policy_value(
        fit,
        &s.env,
        s.headroom_fraction(),
        u64::from(s.minimum),
        s.round_to.map(u64::from),
        from,
    );
    // `note` goes into the summary (and so the record); `why` into the Event.
    let (changes, reason, note, why) = match computed {
        Ok(f) if f.value < from => {
            let changes = env_changes(job, &s.env, s.container.as_deref(), &scale, Some(f.value))?;
            (changes, REASON_BATCH_FIT, f.note.clone(), f.note)
        }
        other => {
            let (note, why) = fallback(s, from, other);
            (by_factor, REASON_BATCH_FIT_FALLBACK, note, why)
        }
    };
    let changes = keep(changes)?
        .into_iter()
        .map(|c| EnvChange {
            note: Some(note.clone()),
            ..c
        })
        .collect();
    let mut message = format!("scaleBatch {} mode fit: {why}", s.env);
    truncate_utf8(&mut message, 1024);
    Ok((
        changes,
        Some(Step::Event {
            reason: reason.into(),
            message,
        }),
    ))
}

/// The record's note and the Event's sentence when the factor is used: the
/// fit says the current batch fits (it contradicts the trigger), or there
/// is no value to act on (too little evidence, not backed, no usable
/// recommendation).
fn fallback(
    s: &ScaleBatchAction,
    from: u64,
    computed: Result<batchfit::PolicyFit, batchfit::NoFit>,
) -> (String, String) {
    match computed {
        Ok(f) => (
            format!("fit says {from} fits, factor {}", s.factor),
            format!(
                "the fit says {} {from} fits (computed {}: {}), yet the policy fired: the evidence \
                 and the trigger disagree, so the factor {} is used",
                s.env, f.value, f.note, s.factor
            ),
        ),
        Err(why) => {
            let what = why.kind();
            (
                format!("fit: {what}, factor {}", s.factor),
                format!("{why}; so the factor {} is used", s.factor),
            )
        }
    }
}
