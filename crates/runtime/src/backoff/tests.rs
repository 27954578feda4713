use super::*;

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// The first `n` delays of a schedule, in seconds (rounded to the ms:
/// backon doubles in f32).
fn first(s: &Schedule, n: usize) -> Vec<f64> {
    s.delays()
        .take(n)
        .map(|d| (secs(d) * 1000.0).round() / 1000.0)
        .collect()
}

#[test]
fn the_reconcile_doubles_from_half_a_second_to_five_minutes() {
    assert_eq!(
        first(&RECONCILE, 11),
        [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 300.0]
    );
    assert_eq!(RECONCILE.after(1), Duration::from_millis(500));
    assert_eq!(RECONCILE.after(u32::MAX), Duration::from_secs(300));
}

#[test]
fn remediation_doubles_from_half_a_second_to_two_minutes() {
    assert_eq!(
        first(&REMEDIATION, 10),
        [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 120.0, 120.0]
    );
    assert_eq!(REMEDIATION.after(u32::MAX), Duration::from_secs(120));
}

#[test]
fn a_held_deletion_is_looked_at_from_one_second_to_five_minutes() {
    assert_eq!(
        first(&DELETION_WAIT, 11),
        [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 300.0, 300.0]
    );
    assert_eq!(DELETION_WAIT.after(0), Duration::from_secs(1));
}

#[test]
fn the_recreate_poll_doubles_from_fifty_ms_to_a_second() {
    assert_eq!(
        first(&RECREATE_POLL, 7),
        [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    );
}

#[test]
fn status_writes_double_from_half_a_second_to_a_minute() {
    assert_eq!(
        first(&STATUS_WRITE, 9),
        [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    );
    assert_eq!(STATUS_WRITE.after(u32::MAX), Duration::from_secs(60));
}

#[test]
fn a_task_restarts_after_one_second_doubling_to_a_minute() {
    let delays: Vec<u64> = (1..=8).map(|n| TASK_RESTART.after(n).as_secs()).collect();
    assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60]);
    assert_eq!(TASK_RESTART.after(u32::MAX), Duration::from_secs(60));
}

#[test]
fn the_webhook_retries_from_one_second_to_thirty() {
    assert_eq!(
        first(&WEBHOOK_API, 7),
        [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    );
}

#[test]
fn report_writes_double_from_one_second_to_a_minute_with_jitter_and_never_end() {
    let delays: Vec<Duration> = REPORT_WRITE.delays().take(12).collect();
    assert_eq!(delays.len(), 12, "never gives up");
    // Jitter adds up to one more delay on top.
    for (d, base) in delays
        .iter()
        .zip([1u64, 2, 4, 8, 16, 32, 60, 60, 60, 60, 60, 60])
    {
        let base = Duration::from_secs(base);
        assert!(*d >= base && *d <= 2 * base, "{d:?} against {base:?}");
    }
}

#[test]
fn no_schedule_gives_up() {
    for s in [
        RECONCILE,
        REMEDIATION,
        DELETION_WAIT,
        RECREATE_POLL,
        STATUS_WRITE,
        TASK_RESTART,
        WEBHOOK_API,
        REPORT_WRITE,
    ] {
        assert_eq!(s.delays().take(100).count(), 100, "{s:?}");
    }
}

#[test]
fn a_namesake_wait_doubles_from_two_seconds_to_a_minute() {
    assert_eq!(
        first(&NAMESAKE_WAIT, 7),
        [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    );
    assert_eq!(NAMESAKE_WAIT.after(0), Duration::from_secs(2));
    assert_eq!(NAMESAKE_WAIT.after(u32::MAX), Duration::from_secs(60));
}
