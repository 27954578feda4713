//! `crds/` holds exactly what `memprof crd` prints: a stale copy fails here.

mod common;

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
    // listed nothing (issue 17).
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
            let fields: Vec<String> = status
                .as_object()
                .map(|o| o.keys().cloned().collect())
                .unwrap_or_default();
            // Published asynchronously after the CRD is established.
            if fields.contains(&"staleRanks".to_string()) {
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
        assert!(fields.iter().any(|x| x == f), "{f} in {fields:?}");
    }
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
