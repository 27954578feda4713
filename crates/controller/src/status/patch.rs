//! Pure: the body of a status write, in either of the writer's two ways.
//!
//! Why two: a server-side apply of the whole status makes the API server
//! merge it field by field and recompute `managedFields`; a JSON merge patch
//! of only what changed (RFC 7386) sends fewer bytes and leaves the API server
//! less to do. Both carry the resourceVersion the status was composed on, so
//! either is refused (409) when the profile changed since: the difference is
//! taken against exactly what the server holds at that version, and applying
//! it there yields exactly the composed status.

pub use crate::operator::WriteMode;
use memprof_api::{MemoryProfile, MemoryProfileStatus};
use serde_json::{Map, Value};

/// The JSON merge patch (RFC 7386) that turns `old` into `new`: changed
/// and added members as they are in `new`, removed ones as `null`, objects
/// recursively, arrays and scalars whole. `None`: nothing differs.
pub fn merge_diff(old: &Value, new: &Value) -> Option<Value> {
    if old == new {
        return None;
    }
    let (Value::Object(old), Value::Object(new)) = (old, new) else {
        return Some(new.clone());
    };
    let mut patch = Map::new();
    for (key, value) in new {
        let changed = match old.get(key) {
            None => Some(value.clone()),
            // An object that gains a member: only the member, unless `null`s
            // inside `value` would be read as deletions of nothing (harmless).
            Some(before) => merge_diff(before, value),
        };
        if let Some(change) = changed {
            patch.insert(key.clone(), change);
        }
    }
    for key in old.keys().filter(|k| !new.contains_key(*k)) {
        patch.insert(key.clone(), Value::Null);
    }
    Some(Value::Object(patch))
}

/// The body that writes `status` over `recorded`, which the server holds at
/// resourceVersion `rv`, in `mode`.
pub fn body(
    mode: WriteMode,
    name: &str,
    rv: &str,
    recorded: Option<&MemoryProfileStatus>,
    status: &MemoryProfileStatus,
) -> Value {
    use kube::Resource;
    // A precondition either way: composed on this version, or refused (409).
    let metadata = serde_json::json!({ "name": name, "resourceVersion": rv });
    match mode {
        WriteMode::Apply => serde_json::json!({
            "apiVersion": MemoryProfile::api_version(&()),
            "kind": MemoryProfile::kind(&()),
            "metadata": metadata,
            "status": status,
        }),
        WriteMode::Merge => {
            let new = serde_json::to_value(status).unwrap_or(Value::Null);
            // No status yet: the whole status (`null` would not merge into it).
            let old = recorded
                .and_then(|r| serde_json::to_value(r).ok())
                .unwrap_or(Value::Object(Map::new()));
            let status = merge_diff(&old, &new).unwrap_or(Value::Object(Map::new()));
            serde_json::json!({ "metadata": metadata, "status": status })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::{RankSummary, RiskLevel};
    use serde_json::json;

    /// RFC 7386's MergePatch, to check a diff by applying it.
    fn merge(target: &mut Value, patch: &Value) {
        let Value::Object(patch) = patch else {
            *target = patch.clone();
            return;
        };
        if !target.is_object() {
            *target = Value::Object(Map::new());
        }
        let target = target.as_object_mut().expect("an object");
        for (key, value) in patch {
            if value.is_null() {
                target.remove(key);
            } else {
                merge(target.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }

    fn rank(r: u32) -> RankSummary {
        let mut s = RankSummary::default();
        s.location.rank = Some(r);
        s
    }

    #[test]
    fn a_merge_diff_applied_to_the_old_status_gives_the_new_one() {
        let old = MemoryProfileStatus {
            risk: RiskLevel::High,
            time_to_oom_seconds: Some(400.0),
            time_to_oom: Some("6m40s".into()),
            peak_used_bytes: 7,
            top_ranks: vec![rank(3)],
            ..Default::default()
        };
        let new = MemoryProfileStatus {
            risk: RiskLevel::Low,
            time_to_oom_seconds: None,
            time_to_oom: None,
            peak_used_bytes: 8,
            top_ranks: vec![rank(5), rank(3)],
            last_action: Some("scaleBatch".into()),
            ..Default::default()
        };
        let (old_v, new_v) = (
            serde_json::to_value(&old).unwrap(),
            serde_json::to_value(&new).unwrap(),
        );
        let patch = merge_diff(&old_v, &new_v).expect("they differ");
        // Only what changed travels; a removed field is `null`.
        assert_eq!(patch["timeToOomSeconds"], Value::Null);
        assert!(patch.get("ranks").is_none(), "unchanged: {patch}");
        let mut applied = old_v.clone();
        merge(&mut applied, &patch);
        let back: MemoryProfileStatus = serde_json::from_value(applied).unwrap();
        assert_eq!(back, new);
        assert_eq!(merge_diff(&new_v, &new_v), None);
    }

    #[test]
    fn nested_objects_carry_only_their_changed_members() {
        let old = json!({"a": {"x": 1, "y": 2}, "b": [1, 2], "c": 3});
        let new = json!({"a": {"x": 1, "y": 5}, "b": [1], "d": {"z": 1}});
        let patch = merge_diff(&old, &new).unwrap();
        assert_eq!(
            patch,
            json!({"a": {"y": 5}, "b": [1], "c": null, "d": {"z": 1}})
        );
        let mut applied = old.clone();
        merge(&mut applied, &patch);
        assert_eq!(applied, new);
    }

    #[test]
    fn both_bodies_carry_the_resource_version_precondition() {
        let st = MemoryProfileStatus::default();
        for mode in [WriteMode::Apply, WriteMode::Merge] {
            let b = body(mode, "j", "42", None, &st);
            assert_eq!(b["metadata"]["resourceVersion"], "42", "{mode:?}");
        }
        let merge_body = body(WriteMode::Merge, "j", "42", None, &st);
        assert_eq!(merge_body["status"], serde_json::to_value(&st).unwrap());
    }
}
