//! Development driver: `cargo run -p memprof-analysis --example evaluate -- DIR...`
//! (a record.sh folder or fixture traces); `memprof analyze --evaluate` is the tool.
use memprof_analysis::evaluate::{evaluate, recording, render};
use memprof_api::thresholds::Thresholds;

fn main() {
    let mut recs = Vec::new();
    for arg in std::env::args().skip(1) {
        let p = std::path::Path::new(&arg);
        if p.is_dir() {
            let read = |name: &str| std::fs::read_to_string(p.join(name)).ok();
            for (name, kind) in recording::set_scenarios(&read) {
                match recording::read_scenario(&read, &name, kind) {
                    Ok(r) => recs.push(r),
                    Err(e) => eprintln!("{e}"),
                }
            }
        } else {
            let text = std::fs::read_to_string(p).unwrap();
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            recs.push(recording::read_fixture(&name, &text).unwrap());
        }
    }
    let e = evaluate(&recs, &Thresholds::default());
    print!("{}", render(&e));
}
