//! The newest checkpoint the pod's trainers announced (agent event
//! `checkpoint`), carried into the report's `lastCheckpoint`, where a
//! remediation that restarts the Job looks for it (docs/remediation.md).
//! One value, whatever the pushes: bounded by construction.

use jiff::Timestamp;
use memprof_api::agent::Push;
use memprof_api::Checkpoint;

/// The newest checkpoint seen, and a generation the write budget compares.
#[derive(Clone, Debug, Default)]
pub struct CheckpointLog {
    newest: Option<(Timestamp, Checkpoint)>,
    /// Bumped whenever what the report would say changes.
    generation: u64,
}

impl CheckpointLog {
    /// Takes the checkpoint events of one push, received at `received`.
    /// Each event's time is clamped to the push's and `received`
    /// ([`Checkpoint::from_event`]): a trainer's clock can make a checkpoint
    /// look older than it is, never newer than its announcement.
    pub fn observe(&mut self, push: &Push, received: Timestamp) {
        for e in &push.events {
            let at = (e.t, push.time);
            let note = e.note.as_deref();
            let Some(c) = Checkpoint::from_event(&e.name, note, e.step, at, received) else {
                continue;
            };
            let Some(t) = c.at() else { continue };
            // The newest wins; of two at one time, the later announced.
            if self.newest.as_ref().is_some_and(|(old, _)| *old > t) {
                continue;
            }
            if self.newest.as_ref().is_some_and(|(_, old)| *old == c) {
                continue;
            }
            self.newest = Some((t, c));
            self.generation += 1;
        }
    }

    /// What the report carries.
    pub fn report(&self) -> Option<Checkpoint> {
        self.newest.as_ref().map(|(_, c)| c.clone())
    }

    /// Changes whenever [`CheckpointLog::report`] does.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::agent::Event;

    fn push(time: f64, events: &[(&str, f64, &str)]) -> Push {
        Push {
            time,
            events: events
                .iter()
                .map(|(name, t, note)| Event {
                    t: *t,
                    name: name.to_string(),
                    note: Some(note.to_string()),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn the_newest_checkpoint_is_kept_and_an_older_one_never_replaces_it() {
        let received: Timestamp = "2026-11-24T12:00:00Z".parse().unwrap();
        let now = received.as_second() as f64;
        let mut log = CheckpointLog::default();
        log.observe(&push(now, &[("eval", now - 9.0, "epoch 1")]), received);
        assert_eq!((log.report(), log.generation()), (None, 0));
        let events = [
            ("checkpoint", now - 60.0, "step=100"),
            ("checkpoint", now - 30.0, "step=200"),
        ];
        log.observe(&push(now, &events), received);
        assert_eq!(log.report().unwrap().step, Some(200));
        let g = log.generation();
        // A late, older one (re-sent after a failed push) changes nothing.
        log.observe(
            &push(now, &[("checkpoint", now - 60.0, "step=100")]),
            received,
        );
        log.observe(
            &push(now, &[("checkpoint", now - 30.0, "step=200")]),
            received,
        );
        assert_eq!(
            (log.report().unwrap().step, log.generation()),
            (Some(200), g)
        );
    }

    #[test]
    fn a_checkpoint_from_the_future_counts_as_of_its_push() {
        let received: Timestamp = "2026-11-24T12:00:00Z".parse().unwrap();
        let now = received.as_second() as f64;
        let mut log = CheckpointLog::default();
        let lie = [("checkpoint", now + 86_400.0, "step=9")];
        log.observe(&push(now - 2.0, &lie), received);
        assert_eq!(log.report().unwrap().time, "2026-11-24T11:59:58Z");
        // An honest later one still replaces it.
        log.observe(
            &push(now, &[("checkpoint", now - 1.0, "step=10")]),
            received,
        );
        assert_eq!(log.report().unwrap().step, Some(10));
    }
}
