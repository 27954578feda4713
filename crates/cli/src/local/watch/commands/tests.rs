//! Keys to actions to state and files, with no terminal: what seed 000's
//! interactive commands do in `memprof watch`.

use super::*;
use crate::local::profile::sidecar::Transition;
use crate::local::watch::fixtures::{screen, watched};
use crate::local::watch::recording::RECORDING_LIMIT;
use memprof_api::GpuReport;
use memprof_api::MemoryReportSpec;
use memprof_api::RiskLevel;

const G: u64 = 1 << 30;

fn written(e: Effect) -> (PathBuf, serde_json::Value) {
    match e {
        Effect::Write { path, contents } => (path, serde_json::from_str(&contents).unwrap()),
        other => panic!("no file asked for: {other:?}"),
    }
}

#[test]
fn every_key_has_its_action_and_others_none() {
    for (k, a) in [
        ('q', Action::Quit),
        ('\t', Action::NextView),
        ('l', Action::Show(View::Log)),
        ('↓', Action::Down),
        ('r', Action::Record),
        ('m', Action::Mark),
        ('s', Action::Save),
        ('0', Action::Gpu(0)),
        ('7', Action::Gpu(7)),
    ] {
        assert_eq!(action(k), Some(a), "{k:?}");
    }
    assert_eq!(action('x'), None);
    assert_eq!(watched().key('x'), Effect::Nothing);
}

#[test]
fn a_digit_switches_to_that_gpu_or_says_there_is_none() {
    let mut s = watched();
    s.view = View::Log;
    assert_eq!(s.key('1'), Effect::Nothing);
    assert_eq!((s.selected, s.view), (1, View::Gpus));
    assert!(screen(&s).contains("GPU 1 used memory"), "{}", screen(&s));
    s.key('5');
    assert_eq!(s.selected, 1, "unchanged");
    assert_eq!(s.notice.as_deref(), Some("no GPU 5 here (2 GPU(s))"));
    // By the GPU's index, not its row: a box that shows GPUs 2 and 3.
    let mut r = s.report.clone().unwrap();
    r.gpus = vec![
        GpuReport {
            index: 2,
            ..r.gpus[0].clone()
        },
        GpuReport {
            index: 3,
            ..r.gpus[1].clone()
        },
    ];
    s.observe(r);
    s.key('3');
    assert_eq!(s.selected, 1);
}

#[test]
fn save_writes_the_newest_report_as_rollup_and_fragment_read_it() {
    let mut s = State::default();
    assert_eq!(s.key('s'), Effect::Nothing, "no report yet");
    assert_eq!(s.notice.as_deref(), Some("no report yet, nothing saved"));
    let mut s = watched();
    s.save_dir = "runs".into();
    let (path, doc) = written(s.key('s'));
    assert_eq!(path, PathBuf::from("runs/memprof-watch-report-1.json"));
    let spec: MemoryReportSpec = serde_json::from_value(doc).unwrap();
    assert_eq!(
        spec.gpus[0].used_bytes,
        49 * G,
        "the newest report (step 19)"
    );
    s.wrote(&path, Ok(()));
    assert!(screen(&s).contains("wrote runs/memprof-watch-report-1.json"));
    let (second, _) = written(s.key('s'));
    assert_eq!(second, PathBuf::from("runs/memprof-watch-report-2.json"));
    s.wrote(&second, Err(std::io::Error::other("disk full")));
    assert_eq!(
        s.notice.as_deref(),
        Some("cannot write runs/memprof-watch-report-2.json: disk full")
    );
}

#[test]
fn a_recording_keeps_the_reports_and_marks_between_its_two_presses() {
    let mut s = watched();
    s.elapsed = 5.0;
    s.key('m'); // before the recording: not in it
    assert_eq!(s.key('r'), Effect::Nothing);
    assert!(s.recording.is_some());
    let rec_screen = screen(&s);
    assert!(
        rec_screen.contains("● REC 0 s, 1 report(s)"),
        "{rec_screen}"
    );
    let newest = s.report.clone().unwrap();
    for (t, step) in [(6.0, 20), (7.0, 21)] {
        s.elapsed = t;
        let mut r = newest.clone();
        r.gpus[0].used_bytes = (30 + step) * G;
        s.observe(r);
    }
    s.key('j'); // GPU 1 selected: the mark names it
    s.key('m');
    assert_eq!(
        s.notice.as_deref(),
        Some("7.0s  mark 2 (GPU 1: 20.0GiB used) ([l] lists the marks)")
    );
    s.elapsed = 9.5;
    let (path, doc) = written(s.key('r'));
    assert!(s.recording.is_none(), "stopped");
    s.wrote(&path, Ok(()));
    assert_eq!(path, PathBuf::from("memprof-watch-recording-1.json"));
    assert_eq!(
        (
            doc["startedAtSeconds"].as_f64(),
            doc["stoppedAtSeconds"].as_f64()
        ),
        (Some(5.0), Some(9.5))
    );
    let reports = doc["reports"].as_array().unwrap();
    assert_eq!(
        reports.len(),
        3,
        "the one shown at the start and two polled"
    );
    assert_eq!(reports[2]["gpus"][0]["usedBytes"], 51 * G);
    assert_eq!(
        doc["marks"],
        serde_json::json!([{"number": 2, "elapsedSeconds": 7.0, "gpu": 1, "usedBytes": 20 * G}])
    );
    // The log lists both marks among the transitions, in time order.
    s.key('l');
    let log = screen(&s);
    let (m1, m2) = (
        log.find("5.0s  mark 1 (GPU 0").unwrap(),
        log.find("7.0s  mark 2 (GPU 1").unwrap(),
    );
    assert!(m1 < m2, "{log}");
    // Not recording: a report is no longer kept.
    s.observe(newest);
    assert!(s.recording.is_none());
}

#[test]
fn a_forgotten_recording_keeps_the_last_hour() {
    let mut rec = Recording::default();
    let r = MemoryReportSpec::default();
    for _ in 0..RECORDING_LIMIT + 5 {
        rec.add(&r);
    }
    assert_eq!((rec.reports.len(), rec.dropped), (RECORDING_LIMIT, 5));
}

#[test]
fn keys_switch_views_and_move_the_selection() {
    let mut s = watched();
    assert_eq!(s.key('j'), Effect::Nothing);
    assert_eq!(s.selected, 1);
    assert!(screen(&s).contains("GPU 1 used memory"));
    s.key('j');
    assert_eq!(s.selected, 1, "stays on the last GPU");
    s.key('k');
    assert_eq!(s.selected, 0);

    s.key('a');
    let agent = screen(&s);
    assert!(
        agent.contains("allocator (agent in 1 rank(s)): leak"),
        "the agent view is report's renderer:\n{agent}"
    );
    assert!(agent.contains("the trainer's allocator"), "{agent}");

    s.key('l');
    assert!(screen(&s).contains("no risk transition or mark yet"));
    s.transitions.push(Transition {
        elapsed_seconds: 4.0,
        from: RiskLevel::Low,
        to: RiskLevel::High,
        gpu: Some(0),
        used_bytes: None,
        growth_bytes_per_second: None,
        time_to_oom_seconds: Some(170.0),
    });
    assert!(screen(&s).contains("risk low -> high (GPU 0), OOM in 2m50s"));
    assert_eq!(s.key('q'), Effect::Quit);
}
