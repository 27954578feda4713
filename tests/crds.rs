//! `crds/` holds exactly what `memprof crd` prints: a stale copy fails here.

use crate::common;

#[test]
fn crds_directory_matches_the_api_types() {
    let generated = memprof::api::crds_yaml();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/crds/memprof.yaml");
    let committed =
        std::fs::read_to_string(path).expect("crds/memprof.yaml exists: run `make crds`");
    assert!(
        generated == committed,
        "crds/memprof.yaml is stale: run `make crds` and commit the result"
    );
}

#[test]
fn every_crd_field_has_a_description_for_kubectl_explain() {
    // Walks every schema property and fails on one without a description.
    fn walk(path: &str, v: &serde_json::Value, missing: &mut Vec<String>) {
        if let Some(props) = v.get("properties").and_then(|p| p.as_object()) {
            for (name, sub) in props {
                let p = format!("{path}.{name}");
                // metadata and the top-level apiVersion/kind are Kubernetes' own.
                let exempt = matches!(p.as_str(), ".apiVersion" | ".kind" | ".metadata");
                if !exempt && sub.get("description").is_none() {
                    missing.push(p.clone());
                }
                walk(&p, sub, missing);
            }
        }
        if let Some(items) = v.get("items") {
            walk(&format!("{path}[]"), items, missing);
        }
    }
    for crd in memprof::api::crds() {
        let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
        let mut missing = vec![];
        walk("", &schema["openAPIV3Schema"], &mut missing);
        assert!(
            missing.is_empty(),
            "{}: fields without a doc comment: {missing:?}",
            crd.metadata.name.unwrap_or_default()
        );
    }
}

#[test]
fn every_string_and_list_a_report_or_profile_carries_is_bounded() {
    // A tenant's pod writes MemoryReports and the operator copies parts of
    // them into MemoryProfiles: an unbounded string (a 1 MiB `sampledAt`)
    // would block every status write. Every string needs maxLength (or an
    // enum, which bounds it too), every list maxItems.
    fn walk(path: &str, v: &serde_json::Value, unbounded: &mut Vec<String>) {
        let exempt =
            matches!(path, ".apiVersion" | ".kind" | ".metadata") || path.starts_with(".metadata");
        match v.get("type").and_then(|t| t.as_str()) {
            Some("string")
                if !exempt && v.get("maxLength").is_none() && v.get("enum").is_none() =>
            {
                unbounded.push(path.to_string())
            }
            Some("array") if v.get("maxItems").is_none() => unbounded.push(format!("{path}[]")),
            _ => {}
        }
        if let Some(props) = v.get("properties").and_then(|p| p.as_object()) {
            for (name, sub) in props {
                walk(&format!("{path}.{name}"), sub, unbounded);
            }
        }
        if let Some(items) = v.get("items") {
            walk(&format!("{path}[]"), items, unbounded);
        }
        for key in ["anyOf", "oneOf", "allOf"] {
            for sub in v.get(key).and_then(|s| s.as_array()).into_iter().flatten() {
                walk(path, sub, unbounded);
            }
        }
    }
    for crd in memprof::api::crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
        let mut unbounded = vec![];
        walk("", &schema["openAPIV3Schema"], &mut unbounded);
        // A policy's selector too: any namespace editor writes policies and
        // the operator caches them (its matchLabels map: maxProperties, below).
        assert!(
            unbounded.is_empty(),
            "{name}: unbounded fields: {unbounded:#?}"
        );
        if name.starts_with("remediationpolicies") {
            let labels = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["selector"]
                ["properties"]["matchLabels"];
            assert!(labels["maxProperties"].is_u64(), "{labels}");
        }
    }
}

#[test]
fn no_status_is_nullable_so_a_1_20_server_publishes_its_fields() {
    // A server that publishes only OpenAPI v2 (1.20) drops a nullable
    // property's type and fields: `kubectl explain memoryprofile.status`
    // listed nothing.
    for crd in memprof::api::crds() {
        let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
        let status = &schema["openAPIV3Schema"]["properties"]["status"];
        if status.is_null() {
            continue;
        }
        let name = crd.metadata.name.clone().unwrap_or_default();
        assert_ne!(
            status.get("nullable"),
            Some(&serde_json::json!(true)),
            "{name}"
        );
        assert_eq!(status["type"], "object", "{name}");
    }
}

/// `kubectl explain memoryprofile.status` showed `<>` for 70 fields (issue
/// 33): the API server publishes the schema to OpenAPI v2 without the type
/// of a nullable property, an array without items or an object that keeps
/// unknown fields (apiextensions-apiserver's `ToStructuralOpenAPIV2`).
/// Every property of the status, at every depth, keeps its type there.
#[test]
fn every_profile_status_field_has_a_type_as_kubectl_explain_reads_it() {
    fn walk(path: &str, v: &serde_json::Value, untyped: &mut Vec<String>) {
        let published_type = match v.get("type").and_then(|t| t.as_str()) {
            _ if v.get("nullable") == Some(&serde_json::json!(true)) => None,
            _ if v.get("x-kubernetes-preserve-unknown-fields")
                == Some(&serde_json::json!(true)) =>
            {
                None
            }
            Some("array") if v.get("items").is_none() => None,
            t => t,
        };
        if published_type.is_none() {
            untyped.push(path.to_string());
        }
        if let Some(props) = v.get("properties").and_then(|p| p.as_object()) {
            for (name, sub) in props {
                walk(&format!("{path}.{name}"), sub, untyped);
            }
        }
        if let Some(items) = v.get("items") {
            walk(&format!("{path}[]"), items, untyped);
        }
        if let Some(values) = v.get("additionalProperties").filter(|a| a.is_object()) {
            walk(&format!("{path}{{}}"), values, untyped);
        }
    }
    let crd = memprof::api::crds()
        .into_iter()
        .find(|c| c.spec.names.plural == "memoryprofiles")
        .expect("the MemoryProfile CRD");
    let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
    let mut untyped = vec![];
    walk(
        ".status",
        &schema["openAPIV3Schema"]["properties"]["status"],
        &mut untyped,
    );
    assert!(
        untyped.is_empty(),
        "status fields without a type in OpenAPI v2: {untyped:#?}"
    );
}

/// What `kubectl explain memoryprofile.status` reads on this server: the
/// fields of `status` in the published OpenAPI v2 document.
#[tokio::test]
async fn the_served_openapi_lists_the_profile_status_fields() {
    let Some(client) = common::cluster().await else {
        return;
    };
    let fields = common::eventually("MemoryProfile status fields in /openapi/v2", || {
        let client = client.clone();
        async move {
            let req = hyper::Request::get("/openapi/v2").body(Vec::new()).unwrap();
            let doc: serde_json::Value = client.request(req).await.map_err(|e| e.to_string())?;
            let status = &doc["definitions"]["dev.memprof.v1alpha1.MemoryProfile"]["properties"]
                ["status"]["properties"];
            let fields: Vec<(String, Option<String>)> = status
                .as_object()
                .map(|o| {
                    o.iter()
                        .map(|(k, v)| (k.clone(), v["type"].as_str().map(String::from)))
                        .collect()
                })
                .unwrap_or_default();
            // Published asynchronously after the CRD is established.
            if fields.iter().any(|(f, _)| f == "staleRanks") {
                Ok(fields)
            } else {
                Err(format!("status fields: {fields:?}"))
            }
        }
    })
    .await;
    for f in [
        "risk",
        "ranks",
        "ranksStale",
        "timeToOomSeconds",
        "conditions",
    ] {
        assert!(fields.iter().any(|(x, _)| x == f), "{f} in {fields:?}");
    }
    // Each with its type, as kubectl explain shows it (it showed `<>`).
    let untyped: Vec<&String> = fields
        .iter()
        .filter(|(_, t)| t.is_none())
        .map(|(f, _)| f)
        .collect();
    assert!(untyped.is_empty(), "published without a type: {untyped:?}");
}

/// The policy cache is bounded by the schema, selector included: the API
/// server refuses a policy whose selector lists more labels than it allows.
#[tokio::test]
async fn the_api_server_refuses_a_policy_selector_over_its_bounds() {
    let Some(client) = common::cluster().await else {
        return;
    };
    let ns = common::TestNamespace::create(&client).await;
    let policies: kube::Api<memprof::api::RemediationPolicy> =
        kube::Api::namespaced(client.clone(), &ns.name);
    let policy = |labels: usize| -> memprof::api::RemediationPolicy {
        let match_labels: serde_json::Map<String, serde_json::Value> = (0..labels)
            .map(|i| (format!("team.example/k{i}"), serde_json::json!("v")))
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "memprof.dev/v1alpha1", "kind": "RemediationPolicy",
            "metadata": {"name": format!("p{labels}")},
            "spec": {"selector": {"matchLabels": match_labels},
                     "triggers": [{"oomObserved": true}], "actions": [{"event": {"reason": "R"}}]},
        }))
        .unwrap()
    };
    let pp = kube::api::PostParams::default();
    policies
        .create(&pp, &policy(32))
        .await
        .expect("32 labels are allowed");
    let refused = policies.create(&pp, &policy(33)).await.unwrap_err();
    assert!(
        matches!(&refused, kube::Error::Api(e) if e.code == 422),
        "{refused}"
    );
}
