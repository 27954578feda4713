//! `crds/` holds exactly what `memprof crd` prints: a stale copy fails here.

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
