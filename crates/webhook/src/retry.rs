//! The webhook's two loops against the API server: until it answers, and
//! for as long as the operator runs. One backoff for both
//! ([`memprof_runtime::backoff::WEBHOOK_API`]: 1 s doubling to 30 s, never
//! giving up), each failure logged with what to do.

use backon::Retryable;
use memprof_runtime::backoff::WEBHOOK_API;
use std::future::Future;
use std::time::Duration;

/// How often a kept-up thing (the admission key, the webhook's path) is read again.
pub const REFRESH_EVERY: Duration = Duration::from_secs(30);

/// Retries `f` until it succeeds, logging each failure as `what`: the
/// webhook is not worth crashing the operator for.
pub async fn until_ok<T, E, F, Fut>(what: &str, f: F) -> T
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let logged = f
        .retry(WEBHOOK_API.builder())
        .notify(|e: &E, delay| tracing::error!(error = %e, retry_in = ?delay, "{what}"));
    match logged.await {
        Ok(v) => v,
        Err(_) => unreachable!("a backoff without a maximum never gives up"),
    }
}

/// Runs `f` until it succeeds (as [`until_ok`]), then again every
/// [`REFRESH_EVERY`], until `shutdown`.
pub async fn every_refresh<T, E, F, Fut>(what: &str, mut f: F, shutdown: impl Future<Output = ()>)
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            _ = until_ok(what, &mut f) => {}
            () = &mut shutdown => return,
        }
        tokio::select! {
            () = tokio::time::sleep(REFRESH_EVERY) => {}
            () = &mut shutdown => return,
        }
    }
}
