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
    if let Ok(name) = std::env::var("DUMP") {
        use memprof_analysis::evaluate::replay::{replay, Mode};
        for r in recs.iter().filter(|r| r.name == name) {
            let origin = r.truth.leak_from.unwrap_or(r.truth.start);
            for x in replay(r, &Thresholds::default(), Mode::Agent).readings {
                println!(
                    "{:.1} leak={} risk={} tto={:?} agent={}",
                    x.t - origin,
                    x.leak,
                    x.risk,
                    x.tto.map(|t| (t * 10.0).round() / 10.0),
                    x.from_agent
                );
            }
        }
        for r in recs.iter().filter(|r| r.name == name) {
            let origin = r.truth.leak_from.unwrap_or(r.truth.start);
            let mut st = memprof_analysis::allocator::AgentState::new(&Thresholds::default());
            for (_, p) in &r.pushes {
                st.observe(p);
                let a = st.assess();
                if let Some(a) = a.first() {
                    let d = &st.devices()[0];
                    println!("A {:.1} risk={} tto={:?} g={:.0}MB/s used={:.1} total={:.1} ceil={:?} growth={:?}", p.time - origin, a.risk.risk, a.risk.time_to_oom_seconds.map(|x| (x*10.0).round()/10.0), a.risk.growth_bytes_per_second/1e6, a.risk.used as f64/1e9, a.risk.total as f64/1e9, d.ceiling().map(|c| (c/1e8).round()/10.0), a.growth);
                }
            }
        }
        return;
    }
    let e = evaluate(&recs, &Thresholds::default());
    print!("{}", render(&e));
}

#[allow(dead_code)]
fn dump() {}
