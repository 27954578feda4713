//! The values a plan changes: the env var a `scaleBatch` action scales in
//! each container and the key a `setConfigMapKey` action writes, read from
//! the Job and the ConfigMaps as they are and scaled down with [`scale`].
//! Its own file because reading a literal number out of a manifest (and
//! refusing what is not one) is the part of planning with the most ways to
//! fail, apart from how the steps are put together (`plan.rs`).

use super::{EnvChange, PlanError, PlanInput, Step};
use memprof_api::{ScaleValue, SetConfigMapKeyAction};
use serde_json::Value;

/// `value × factor`, rounded down to a multiple of `round_to`, at least `minimum`.
pub fn scale(value: u64, factor: f64, minimum: u64, round_to: Option<u64>) -> u64 {
    let mut v = (value as f64 * factor).floor().max(0.0) as u64;
    if let Some(r) = round_to.filter(|r| *r > 1) {
        v -= v % r;
    }
    v.max(minimum)
}

fn scale_value(s: &ScaleValue, value: u64) -> u64 {
    scale(
        value,
        s.factor,
        u64::from(s.minimum),
        s.round_to.map(u64::from),
    )
}

/// A `setConfigMapKey` action's step: the key's value now and the one to
/// write, in an opted-in ConfigMap only.
pub(super) fn set_config_map_key_step(
    input: &PlanInput<'_>,
    c: &SetConfigMapKeyAction,
) -> Result<Step, PlanError> {
    if input.not_opted_in.contains(&c.config_map) {
        return Err(PlanError::ConfigMapNotOptedIn {
            name: c.config_map.clone(),
        });
    }
    let data = input
        .config_maps
        .get(&c.config_map)
        .ok_or_else(|| PlanError::ConfigMapMissing {
            name: c.config_map.clone(),
        })?;
    let from = data.get(&c.key).cloned();
    let to = match (&c.value, &c.scale) {
        (Some(v), _) => v.clone(),
        (None, Some(s)) => scaled_config_value(c, s, from.as_deref().unwrap_or_default())?,
        // The schema's oneOf makes this unreachable on a server; a
        // policy built in code still gets a clear answer.
        (None, None) => from.clone().unwrap_or_default(),
    };
    Ok(Step::SetConfigMapKey {
        config_map: c.config_map.clone(),
        key: c.key.clone(),
        from,
        to,
    })
}

/// `raw` (a ConfigMap value) scaled down by `s`; an error when it is not a
/// number or is already at its minimum.
fn scaled_config_value(
    c: &SetConfigMapKeyAction,
    s: &ScaleValue,
    raw: &str,
) -> Result<String, PlanError> {
    let old: u64 = raw
        .trim()
        .parse()
        .map_err(|_| PlanError::ConfigMapNotANumber {
            name: c.config_map.clone(),
            key: c.key.clone(),
            value: raw.to_string(),
        })?;
    let new = scale_value(s, old);
    if new >= old {
        return Err(PlanError::AtMinimum {
            what: format!("ConfigMap {} key {}", c.config_map, c.key),
            value: old,
            minimum: u64::from(s.minimum),
        });
    }
    Ok(new.to_string())
}

/// The env changes one `scaleBatch` action makes.
pub(super) fn env_changes(
    job: &Value,
    env: &str,
    container: Option<&str>,
    scale: &ScaleValue,
    fixed: Option<u64>,
) -> Result<Vec<EnvChange>, PlanError> {
    let containers = job["spec"]["template"]["spec"]["containers"]
        .as_array()
        .ok_or(PlanError::MalformedJob("spec.template.spec.containers"))?;
    let mut changes = Vec::new();
    let mut at_minimum = None;
    for c in containers {
        let name = c["name"].as_str().unwrap_or_default();
        if container.is_some_and(|want| want != name) {
            continue;
        }
        let Some(from) = env_number(c, env, name)? else {
            continue;
        };
        let to = fixed.unwrap_or_else(|| scale_value(scale, from));
        if to >= from {
            at_minimum = Some(from);
            continue;
        }
        changes.push(EnvChange {
            container: name.into(),
            env: env.into(),
            from,
            to,
            note: None,
            accumulation: None,
        });
    }
    if changes.is_empty() {
        return Err(match at_minimum {
            Some(value) => PlanError::AtMinimum {
                what: format!("env {env}"),
                value,
                minimum: u64::from(scale.minimum),
            },
            None => PlanError::NoSuchEnv {
                env: env.into(),
                container: container.map(str::to_string),
            },
        });
    }
    Ok(changes)
}

/// The number container `c` (named `name`) sets `env` to; `None` when it
/// does not set it; an error when the value is not a literal number (a
/// `valueFrom` cannot be rewritten in the Job's manifest).
pub(super) fn env_number(c: &Value, env: &str, name: &str) -> Result<Option<u64>, PlanError> {
    let Some(var) = c["env"]
        .as_array()
        .and_then(|vars| vars.iter().find(|v| v["name"] == env))
    else {
        return Ok(None);
    };
    let raw = match (
        var.get("value").and_then(Value::as_str),
        var.get("valueFrom"),
    ) {
        (Some(v), _) => v,
        (None, Some(_)) => {
            return Err(PlanError::NotLiteral {
                env: env.into(),
                container: name.into(),
            })
        }
        (None, None) => "",
    };
    raw.trim()
        .parse()
        .map(Some)
        .map_err(|_| PlanError::NotANumber {
            env: env.into(),
            container: name.into(),
            value: raw.into(),
        })
}
