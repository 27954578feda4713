//! Comparing sweep results and reports, on small recorded files.

use super::*;

fn sweep(runs: &str, models: &str) -> String {
    format!(
        r#"{{"kind":"memprofSweep","version":1,"startedAt":"2026-11-22T20:00:00Z",
        "command":["python","train.py"],"variables":["BATCH_SIZE"],"stepBudget":20,
        "timeoutSeconds":600.0,"metric":"reserved","headroom":0.1,"limitBytes":null,
        "nvml":false,"interrupted":false,"runs":[{runs}],"models":[{models}]}}"#
    )
}

fn run(index: usize, b: u32, status: &str, reserved: Option<u64>, optimizer: u64) -> String {
    format!(
        r#"{{"index":{index},"values":{{"BATCH_SIZE":"{b}"}},"status":"{status}","exitCode":0,
        "oom":{},"oomMessage":null,"timedOut":false,"durationSeconds":3.0,"steps":20,
        "peakAllocatedBytes":null,"peakReservedBytes":{},"nvmlPeakBytes":null,"nvmlNote":null,
        "deviceTotalBytes":80000000000,"stepSecondsMedian":0.5,"tokensPerSecond":null,
        "samplesPerSecond":null,"note":null,"stderrTail":null,
        "breakdown":{{"parametersBytes":1000,"gradientsBytes":10,"optimizerBytes":{optimizer},
           "staticBytes":{},"byModuleType":[{{"type":"lora","parameters":5,"parametersBytes":10,"gradientsBytes":10,"optimizerBytes":{optimizer}}}]}}}}"#,
        status == "oom",
        reserved.map_or("null".into(), |r| r.to_string()),
        1010 + optimizer
    )
}

fn report(peak: u64, reserved: u64, breakdown: &str) -> String {
    format!(
        r#"{{"podName":"standalone","sampledAt":"2026-11-22T20:00:00Z","intervalMs":1000,
        "summary":{{"gpuCount":1,"risk":"low","used":"-","peak":"-","source":"nvml"}},
        "gpus":[{{"index":0,"uuid":"GPU-1","model":"H100","totalBytes":80000000000,"usedBytes":1000,
                  "peakBytes":{peak},"growthBytesPerSecond":0.0,"risk":"low","confidence":0.5,
                  "leakSuspected":false,"spikeDetected":false,"source":"nvml"}}],
        "allocator":{{"allocatedBytes":100,"reservedBytes":{reserved},"allocRetries":0,"numOoms":0,
                      "growth":"steady"}},
        "breakdown":{breakdown},
        "conditions":[]}}"#
    )
}

fn loaded(text: &str) -> Loaded {
    load(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn files_are_recognised_by_their_shape() {
    assert!(matches!(loaded(&sweep("", "")), Loaded::Sweep(_)));
    assert!(matches!(loaded(&report(1, 2, "null")), Loaded::Report(_)));
    let object = format!(
        r#"{{"apiVersion":"memprof.dev/v1alpha1","kind":"MemoryReport","spec":{}}}"#,
        report(1, 2, "null")
    );
    assert!(matches!(loaded(&object), Loaded::Report(_)));
    assert!(matches!(load("{}"), Err(LoadError::Neither)));
    assert!(load("{}").unwrap_err().to_string().contains("no \"kind\""));
    assert!(load("not json")
        .unwrap_err()
        .to_string()
        .starts_with("not JSON"));
    let err = compare(
        "a.json",
        &loaded(&sweep("", "")),
        "b.json",
        &loaded(&report(1, 2, "null")),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "a.json is a sweep result and b.json a report: compare two sweep results or two reports"
    );
}

#[test]
fn two_sweeps_say_what_grew_per_configuration_and_what_started_to_oom() {
    let a = sweep(
        &[
            run(0, 8, "ok", Some(10_000_000_000), 100),
            run(1, 16, "ok", Some(18_000_000_000), 100),
        ]
        .join(","),
        "",
    );
    // B: optimizer state grew by 2 GB (another optimizer), 16 now OOMs, 32 is new.
    let b = sweep(
        &[
            run(0, 8, "ok", Some(12_000_000_000), 2_000_000_100),
            run(1, 16, "oom", None, 2_000_000_100),
            run(2, 32, "oom", None, 2_000_000_100),
        ]
        .join(","),
        "",
    );
    let c = compare("a", &loaded(&a), "b", &loaded(&b)).unwrap();
    assert_eq!(c.kind, "sweep");
    let find = |scope: &str, item: &str| {
        c.rows
            .iter()
            .find(|r| r.scope == scope && r.item == item)
            .unwrap()
            .clone()
    };
    let peak = find("BATCH_SIZE=8", "peak reserved");
    assert_eq!(peak.delta, Some(2e9));
    assert_eq!(peak.delta_percent, Some(20.0));
    assert_eq!(
        find("BATCH_SIZE=8", "breakdown optimizerBytes").delta,
        Some(2e9)
    );
    assert_eq!(
        find("BATCH_SIZE=8", "breakdown lora (params+grads+optimizer)").delta,
        Some(2e9)
    );
    assert_eq!(find("BATCH_SIZE=16", "status").b, Value::from("oom"));
    assert_eq!(find("BATCH_SIZE=32", "status").a, Value::Null, "only in B");
    // The headline: the biggest growths first, then the state changes.
    assert_eq!(
        c.grew[0],
        "BATCH_SIZE=8: peak reserved grew 1.9GiB (+20.0%)"
    );
    assert!(
        c.grew
            .contains(&"BATCH_SIZE=16: status ok → oom".to_string()),
        "{:?}",
        c.grew
    );
    assert!(
        c.grew
            .contains(&"BATCH_SIZE=32: status - → oom".to_string()),
        "{:?}",
        c.grew
    );
    let text = render(&c, Format::Table);
    assert!(
        text.contains("What grew (B against A):\n  BATCH_SIZE=8: peak reserved grew"),
        "{text}"
    );
    assert!(text.contains("+1.9GiB (+20.0%)"), "{text}");
    let unchanged = |t: &str| {
        t.lines()
            .any(|l| l.starts_with("BATCH_SIZE=8 ") && l.contains("step time"))
    };
    assert!(
        !unchanged(&text),
        "unchanged items only with -o wide: {text}"
    );
    assert!(unchanged(&render(&c, Format::Wide)));
    let json: Value = serde_json::from_str(&render(&c, Format::Json)).unwrap();
    assert_eq!(json["kind"], "sweep");
}

#[test]
fn two_sweeps_compare_their_models() {
    let model = |safe: f64, per_unit: f64| {
        format!(
            r#"{{"variable":"BATCH_SIZE","fixed":{{}},"metric":"reserved","verdict":"fitted",
            "points":[],"oomValues":[],"fit":{{"curve":{{"family":"linear","staticBytes":6e9,"perUnitBytes":{per_unit}}},
            "n":3,"xMin":8.0,"xMax":32.0,"rmsResidualBytes":0.0,"maxResidualBytes":0.0,"heldOut":[],
            "heldOutRmsBytes":null,"marginBytes":6.7e7,"supportMin":8.0,"supportMax":32.0,"notes":[]}},
            "noModel":null,"deviceTotalBytes":8e10,"headroom":0.1,"limitBytes":7.2e10,"step":8.0,
            "largestSafe":{safe},"largestSafePeakBytes":null,"bound":null,"predicted":null,"verified":true,
            "search":null,"trials":[],"agrees":true,"notes":[]}}"#
        )
    };
    let a = sweep("", &model(128.0, 5e8));
    let b = sweep("", &model(64.0, 1e9));
    let c = compare("a", &loaded(&a), "b", &loaded(&b)).unwrap();
    let per_unit = c
        .rows
        .iter()
        .find(|r| r.scope == "model BATCH_SIZE" && r.item == "per unit")
        .unwrap();
    assert_eq!(per_unit.delta, Some(5e8));
    let safe = c.rows.iter().find(|r| r.item == "largest safe").unwrap();
    assert_eq!(
        (safe.a.as_f64(), safe.b.as_f64()),
        (Some(128.0), Some(64.0))
    );
}

#[test]
fn two_reports_compare_gpu_peaks_allocator_and_breakdown() {
    let a = report(
        40_000_000_000,
        30_000_000_000,
        r#"{"parametersBytes":100,"optimizerBytes":200}"#,
    );
    let b = report(
        50_000_000_000,
        30_000_000_000,
        r#"{"parametersBytes":100,"optimizerBytes":700}"#,
    );
    let c = compare("a", &loaded(&a), "b", &loaded(&b)).unwrap();
    assert_eq!(c.kind, "report");
    let gpu = c
        .rows
        .iter()
        .find(|r| r.scope == "GPU 0" && r.item == "peak")
        .unwrap();
    assert_eq!(gpu.delta, Some(1e10));
    let reserved = c.rows.iter().find(|r| r.item == "reserved").unwrap();
    assert_eq!(reserved.delta, Some(0.0));
    let opt = c
        .rows
        .iter()
        .find(|r| r.item == "breakdown optimizerBytes")
        .unwrap();
    assert_eq!(opt.delta, Some(500.0));
    assert_eq!(c.grew[0], "GPU 0: peak grew 9.3GiB (+25.0%)");
    assert!(
        !c.rows.iter().any(|r| r.item == "fragmentation"),
        "absent in both: no row"
    );
    let same = compare("a", &loaded(&a), "a", &loaded(&a)).unwrap();
    assert_eq!(same.grew, vec!["nothing grew".to_string()]);
    assert!(render(&same, Format::Table).contains("no item differs"));
}
