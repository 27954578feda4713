use super::*;
use serde_json::json;

fn list() -> Value {
    json!({
        "apiVersion": "v1", "kind": "List",
        "items": [
            {"metadata": {"name": "calm", "labels": {"memprof.dev/job": "calm"}},
             "spec": {"jobName": "calm"}, "status": {"peakPercent": 25.0, "risk": "low"}},
            {"metadata": {"name": "train", "labels": {"app.kubernetes.io/name": "x"}},
             "spec": {"jobName": "train"}, "status": {"peakPercent": 87.5, "risk": "critical"}},
        ]
    })
}

fn run(t: &str) -> String {
    Template::parse(t)
        .unwrap_or_else(|e| panic!("{e}"))
        .render(&list())
}

#[test]
fn the_common_kubectl_forms_print_as_kubectl_prints_them() {
    // Each expected string is what kubectl 1.32 printed for the same
    // template over the same objects.
    assert_eq!(run("{.items[*].metadata.name}"), "calm train");
    assert_eq!(
        run(r#"{range .items[*]}{.metadata.name}{"\t"}{.metadata.labels}{"\n"}{end}"#),
        "calm\t{\"memprof.dev/job\":\"calm\"}\ntrain\t{\"app.kubernetes.io/name\":\"x\"}\n"
    );
    assert_eq!(
        run(r#"{.items[?(@.spec.jobName=="calm")].metadata.name}"#),
        "calm"
    );
    assert_eq!(run("{..jobName}"), "calm train");
    assert_eq!(
        run("{.items[-1:].metadata.name}{.items[0].spec}{.kind}"),
        "train{\"jobName\":\"calm\"}List"
    );
    assert_eq!(
        run(r"{.items[1].metadata.labels.app\.kubernetes\.io/name}"),
        "x"
    );
    assert_eq!(
        run("{.items[1].metadata.labels['app.kubernetes.io/name']}"),
        "x"
    );
    assert_eq!(run("{.items[0].metadata.nope}|{.items[5]}|"), "||");
    assert_eq!(
        run("names: {.items[*].metadata.name}!"),
        "names: calm train!"
    );
}

#[test]
fn whole_floats_print_as_integers_as_go_does() {
    assert_eq!(run("{.items[*].status.peakPercent}"), "25 87.5");
    assert_eq!(
        go_numbers(json!({"a": [1.0, 1.5, 2]})),
        json!({"a": [1, 1.5, 2]})
    );
}

#[test]
fn inside_range_paths_start_at_the_element_and_dollar_at_the_root() {
    assert_eq!(
        run("{range .items[*]}{@.metadata.name}/{$.kind} {end}"),
        "calm/List train/List "
    );
    assert_eq!(
        run(r#"{range .items[*]}{range .metadata.labels.*}[{@}]{end}{end}"#),
        "[calm][x]"
    );
}

#[test]
fn a_bare_path_is_a_template_of_one_action() {
    let t = Template::parse(".metadata.name").unwrap();
    assert_eq!(t.render(&list()["items"][0]), "calm");
    let t = Template::parse("metadata.name").unwrap();
    assert_eq!(t.render(&list()["items"][1]), "train");
    assert_eq!(
        Template::parse("{.status.peakPercent}")
            .unwrap()
            .values(&list()["items"][1]),
        [&json!(87.5)]
    );
}

#[test]
fn bad_templates_say_what_is_wrong() {
    let e = Template::parse("{.items[*].metadata.name").unwrap_err();
    assert!(matches!(e, JsonPathError::Unclosed { at: 0, .. }), "{e}");
    assert!(matches!(
        Template::parse("{range .items[*]}{.a}"),
        Err(JsonPathError::Range(_))
    ));
    assert!(matches!(
        Template::parse("{.a}{end}"),
        Err(JsonPathError::Range(_))
    ));
    let e = Template::parse("{.a[?(@.b=~'x')]}")
        .unwrap_err()
        .to_string();
    assert!(e.contains("use match("), "{e}");
    let e = Template::parse("{.a,.b}").unwrap_err().to_string();
    assert!(e.contains("one {…} per path"), "{e}");
    let e = Template::parse("{.a[}").unwrap_err().to_string();
    assert!(e.contains("unclosed ["), "{e}");
}

#[test]
fn a_closing_brace_inside_quotes_does_not_end_the_action() {
    assert_eq!(run(r#"{"}{"}"#), "}{");
    assert_eq!(
        run(r#"{.items[?(@.spec.jobName=="}")].metadata.name}x"#),
        "x"
    );
}
