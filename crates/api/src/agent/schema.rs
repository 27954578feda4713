//! The wire contract as JSON Schema (draft 2020-12), generated from the
//! serde types of this module: what `memprof agent-schema` prints and
//! `agent/schema/` holds (`make schema`; CI's `make check-schema` fails when
//! the files are stale). The Python agent's tests validate every push the
//! agent builds, and every answer of a real sidecar, against these files, so
//! a field added on one side only fails a test instead of being dropped.
//!
//! The push is described as the sidecar reads it (a field with a default
//! may be left out), the answer as the sidecar writes it (every field is
//! always there). The sidecar ignores fields it does not know; the tests
//! forbid them (an agent field the sidecar drops is lost data).

use schemars::{generate::SchemaSettings, JsonSchema, Schema};

/// The push, as the sidecar's `parse` reads it.
pub fn push_schema() -> Schema {
    root::<super::Push>(SchemaSettings::draft2020_12().for_deserialize())
}

/// The answer to an accepted push, as the sidecar writes it.
pub fn reply_schema() -> Schema {
    root::<super::PushReply>(SchemaSettings::draft2020_12().for_serialize())
}

/// The schema named `push` or `reply` as pretty JSON with a final newline
/// (the bytes of `agent/schema/<name>.json`); `None` for any other name.
pub fn schema_json(name: &str) -> Option<String> {
    let schema = match name {
        "push" => push_schema(),
        "reply" => reply_schema(),
        _ => return None,
    };
    let text = serde_json::to_string_pretty(&schema).expect("a schema always serializes");
    Some(text + "\n")
}

fn root<T: JsonSchema>(settings: SchemaSettings) -> Schema {
    settings.into_generator().into_root_schema_for::<T>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn properties(schema: &serde_json::Value, def: Option<&str>) -> Vec<String> {
        let object = match def {
            Some(name) => &schema["$defs"][name],
            None => schema,
        };
        let mut names: Vec<String> = object["properties"]
            .as_object()
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default();
        names.sort();
        names
    }

    #[test]
    fn the_push_schema_names_the_wire_fields_and_requires_what_the_sidecar_requires() {
        let push = serde_json::to_value(push_schema()).unwrap();
        let top = properties(&push, None);
        for field in [
            "version",
            "time",
            "devices",
            "preOom",
            "acks",
            "sites",
            "droppedEvents",
        ] {
            assert!(top.contains(&field.to_string()), "{field} in {top:?}");
        }
        assert_eq!(push["required"], serde_json::json!(["version", "time"]));
        let device = properties(&push, Some("DeviceStats"));
        assert!(device.contains(&"allocatedBytes".to_string()), "{device:?}");
        let kinds: Vec<&serde_json::Value> = push["$defs"]["PushKind"]["oneOf"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| &k["const"])
            .collect();
        assert_eq!(kinds, ["sample", "oom", "final"]);
    }

    #[test]
    fn the_reply_schema_requires_every_field_the_sidecar_always_writes() {
        let reply = serde_json::to_value(reply_schema()).unwrap();
        let mut required: Vec<String> = serde_json::from_value(reply["required"].clone()).unwrap();
        required.sort();
        assert_eq!(required, ["accepted", "directives", "history", "verdict"]);
        assert!(schema_json("reply").unwrap().ends_with("}\n"));
        assert!(schema_json("other").is_none());
    }
}
