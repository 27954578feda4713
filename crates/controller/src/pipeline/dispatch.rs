//! The dispatcher: turns the watches' changes into queued Job keys (and
//! tells the status writer what the API server now holds).

use super::state::Context;
use super::watch::{Change, Changes};
use super::{jobs_in, Stop};
use futures::StreamExt;
use std::sync::Arc;

/// Turns changes into queued Job keys until `stop`.
pub(super) async fn dispatch(ctx: Arc<Context>, mut changes: Changes, stop: Stop) {
    loop {
        let change = tokio::select! {
            () = stop.clone() => return,
            c = changes.next() => match c {
                Some(c) => c,
                None => return,
            },
        };
        if !ctx.setup.options.allows(change.namespace()) {
            // Namespaced install: nothing is kept for, or done in, the others.
            continue;
        }
        match change {
            Change::Job(key) | Change::Workload(key) => ctx.queue.add(key),
            Change::Report(key, name) => {
                ctx.setup.metrics.reports_seen.inc();
                ctx.with_state(&key, |s| s.pending.report(&name));
                ctx.queue.add(key);
            }
            Change::Pod(key, name) => {
                // Its report's screening depends on it (trust.rs), and its
                // containers may show an OOM.
                ctx.with_state(&key, |s| s.pending.pod(&name));
                ctx.queue.add(key);
            }
            Change::Profile(key, profile) => {
                if let Some(p) = profile {
                    ctx.writer.observe(&key, &p);
                }
                ctx.queue.add(key);
            }
            Change::Policies(namespace) => {
                for key in jobs_in(&ctx, &namespace) {
                    ctx.queue.add(key);
                }
            }
        }
    }
}
