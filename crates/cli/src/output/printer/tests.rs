use super::*;
use clap::Parser;
use serde_json::json;

#[derive(Parser, Debug)]
struct Cli {
    #[command(flatten)]
    print: PrintArgs,
}

fn args(a: &[&str]) -> PrintArgs {
    let mut argv = vec!["x"];
    argv.extend(a);
    Cli::try_parse_from(argv)
        .unwrap_or_else(|e| panic!("{e}"))
        .print
}

fn obj(name: &str, tto: Option<f64>) -> Value {
    let mut status = json!({"risk": "low", "peakPercent": 50.0});
    if let Some(t) = tto {
        status["timeToOomSeconds"] = json!(t);
    }
    json!({"apiVersion": "memprof.dev/v1alpha1", "kind": "MemoryProfile",
           "metadata": {"name": name, "namespace": "ml"}, "spec": {"jobName": name}, "status": status})
}

fn items() -> Vec<Value> {
    vec![obj("b", None), obj("a", Some(90.0)), obj("c", Some(30.0))]
}

fn print(a: &[&str], items: &[Value]) -> Printed {
    args(a).print(
        items,
        |v| v.clone(),
        |rows| {
            let mut t = Table::new(["JOB"]);
            for r in rows {
                t.row([r["metadata"]["name"].as_str().unwrap()]);
            }
            t
        },
        "No MemoryProfiles found in namespace ml.",
    )
}

#[test]
fn json_is_a_v1_list_indented_as_kubectl_indents_it() {
    let out = print(&["-o", "json"], &items()).stdout;
    assert!(
        out.starts_with("{\n    \"apiVersion\": \"v1\",\n    \"items\": [\n"),
        "{out}"
    );
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["kind"], "List");
    assert_eq!(v["metadata"], json!({"resourceVersion": ""}));
    assert_eq!(v["items"].as_array().unwrap().len(), 3);
    let y: Value = serde_yaml::from_str(&print(&["-o", "yaml"], &items()).stdout).unwrap();
    assert_eq!(y, v);
}

#[test]
fn name_prints_kind_dot_group_slash_name() {
    assert_eq!(
        print(&["-o", "name"], &items()).stdout,
        "memoryprofile.memprof.dev/b\nmemoryprofile.memprof.dev/a\nmemoryprofile.memprof.dev/c\n"
    );
}

#[test]
fn jsonpath_reads_the_list_that_json_prints() {
    let out = print(&["-o", "jsonpath={.items[*].metadata.name}"], &items()).stdout;
    assert_eq!(out, "b a c");
    let out = print(&["-o=jsonpath={.kind}"], &[]).stdout;
    assert_eq!(out, "List");
}

#[test]
fn custom_columns_print_none_for_missing_fields_and_honour_no_headers() {
    let spec =
        "custom-columns=NAME:.metadata.name,TTO:.status.timeToOomSeconds,PCT:status.peakPercent";
    let out = print(&["-o", spec], &items()).stdout;
    assert_eq!(
        out,
        "NAME   TTO      PCT\nb      <none>   50\na      90       50\nc      30       50\n"
    );
    let out = print(&["-o", spec, "--no-headers"], &items()).stdout;
    assert_eq!(out.lines().next(), Some("b   <none>   50"));
}

#[test]
fn sort_by_orders_numbers_by_value_and_puts_missing_fields_last() {
    let out = print(
        &["-o", "name", "--sort-by", ".status.timeToOomSeconds"],
        &items(),
    )
    .stdout;
    assert_eq!(
        out,
        "memoryprofile.memprof.dev/c\nmemoryprofile.memprof.dev/a\nmemoryprofile.memprof.dev/b\n"
    );
    let out = print(&["--sort-by={.metadata.name}", "--no-headers"], &items()).stdout;
    assert_eq!(out, "a\nb\nc\n");
}

#[test]
fn an_empty_table_says_so_on_stderr_and_structured_output_stays_valid() {
    let p = print(&[], &[]);
    assert_eq!(p.stdout, "");
    assert_eq!(p.stderr, "No MemoryProfiles found in namespace ml.\n");
    let p = print(&["-o", "json"], &[]);
    assert_eq!(p.stderr, "");
    assert_eq!(
        serde_json::from_str::<Value>(&p.stdout).unwrap()["items"],
        json!([])
    );
    assert_eq!(print(&["-o", "name"], &[]), Printed::default());
    assert_eq!(
        print(&["-o", "custom-columns=N:.metadata.name"], &[]).stdout,
        "N\n"
    );
}

#[test]
fn bad_output_values_are_refused_when_the_flags_are_parsed() {
    let err = |a: &[&str]| {
        let mut argv = vec!["x"];
        argv.extend(a);
        Cli::try_parse_from(argv).unwrap_err().to_string()
    };
    assert!(err(&["-o", "xml"]).contains("unknown output format \"xml\""));
    assert!(err(&["-o", "jsonpath"]).contains("-o jsonpath needs a value"));
    assert!(err(&["-o", "jsonpath={.a"]).contains("unclosed action"));
    assert!(err(&["-o", "custom-columns=NAME"]).contains("expected <header>:<json-path-expr>"));
    assert!(err(&["--sort-by", "{.a"]).contains("unclosed action"));
}

#[test]
fn a_command_that_takes_fewer_formats_refuses_the_others_by_name() {
    #[derive(Parser, Debug)]
    struct Few {
        #[arg(short = 'o', value_parser = OutputParser(&[Kind::Table, Kind::Json]))]
        o: Output,
    }
    let e = Few::try_parse_from(["x", "-o", "name"])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"name\" is not an output of this command; it prints: table, json"),
        "{e}"
    );
    assert_eq!(
        Few::try_parse_from(["x", "-o", "json"]).unwrap().o,
        Output::Json
    );
}

#[test]
fn files_hold_templates_and_columns() {
    let dir = std::env::temp_dir().join(format!("memprof-printer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (t, c) = (dir.join("t"), dir.join("c"));
    std::fs::write(&t, "{.items[0].metadata.name}").unwrap();
    std::fs::write(&c, "NAME   RISK\n.metadata.name   .status.risk\n").unwrap();
    let o = format!("jsonpath-file={}", t.display());
    assert_eq!(print(&["-o", &o], &items()).stdout, "b");
    let o = format!("custom-columns-file={}", c.display());
    assert_eq!(
        print(&["-o", &o], &items()).stdout.lines().nth(1),
        Some("b      low")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_refused_output_is_a_typed_error_with_kubectls_words() {
    assert!(matches!(
        Output::parse("jsonpath"),
        Err(OutputError::NeedsValue(n)) if n == "jsonpath"
    ));
    assert_eq!(
        Output::parse("jsonpath").unwrap_err().to_string(),
        "-o jsonpath needs a value: -o jsonpath=…"
    );
    assert!(Output::parse("xml")
        .unwrap_err()
        .to_string()
        .starts_with("unknown output format \"xml\": table, wide, json, yaml, name, jsonpath=TEMPLATE, jsonpath-file=FILE,"));
    assert!(matches!(
        Output::parse("custom-columns=NAME"),
        Err(OutputError::Column(c)) if c == "NAME"
    ));
    assert!(matches!(
        Output::parse("custom-columns=A:{"),
        Err(OutputError::Template(_))
    ));
    assert!(matches!(
        columns_file("A B\n.a\n"),
        Err(OutputError::ColumnsFileMismatch {
            headers: 2,
            paths: 1
        })
    ));
}
