//! Acknowledgements of directives, as the pod's trainer processes push them
//! (contract B): kept bounded and written into the report's `agentAcks`,
//! where the operator reads which ranks acted.

use memprof_api::agent::Push;
use memprof_api::AgentAck;

/// At most this many acknowledgements are kept (and reported).
pub const MAX_KEPT: usize = 16;

/// The newest acknowledgement per (directive id, process), at most
/// [`MAX_KEPT`], oldest first.
#[derive(Clone, Debug, Default)]
pub struct AckLog {
    acks: Vec<AgentAck>,
    /// Bumped whenever what the report would say changes.
    generation: u64,
}

impl AckLog {
    /// Takes the acks of one push, received at `time` (RFC 3339). An ack
    /// repeated unchanged (the agent sends it again when it missed our
    /// answer) changes nothing.
    pub fn observe(&mut self, push: &Push, time: &str) {
        for ack in &push.acks {
            let same = |a: &AgentAck| a.id == ack.id && a.pid == Some(push.pid);
            if let Some(at) = self.acks.iter().position(same) {
                let old = &self.acks[at];
                if old.ok == ack.ok && old.action == ack.action {
                    continue;
                }
                self.acks.remove(at);
            }
            if self.acks.len() == MAX_KEPT {
                self.acks.remove(0);
            }
            self.acks.push(AgentAck {
                id: ack.id.clone(),
                action: ack.action.clone(),
                ok: ack.ok,
                time: time.to_string(),
                pid: Some(push.pid),
                rank: push.rank,
            });
            self.generation += 1;
        }
    }

    /// What the report carries.
    pub fn report(&self) -> Vec<AgentAck> {
        self.acks.clone()
    }

    /// Changes whenever [`AckLog::report`] does: what the write budget compares.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_api::agent::Ack;

    fn push(pid: u32, rank: u32, acks: &[(&str, bool)]) -> Push {
        Push {
            pid,
            rank: Some(rank),
            acks: acks
                .iter()
                .map(|(id, ok)| Ack {
                    id: id.to_string(),
                    action: format!("did {id}"),
                    ok: *ok,
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn one_ack_per_directive_and_process_newest_kept_bounded() {
        let mut log = AckLog::default();
        log.observe(&push(10, 0, &[("d-1", true)]), "t1");
        log.observe(&push(11, 1, &[("d-1", false)]), "t1");
        let g = log.generation();
        log.observe(&push(10, 0, &[("d-1", true)]), "t2");
        assert_eq!(log.generation(), g, "a repeat changes nothing");
        assert_eq!(log.report()[0].time, "t1");
        log.observe(&push(11, 1, &[("d-1", true)]), "t3");
        let r = log.report();
        assert_eq!(r.len(), 2);
        assert_eq!(
            (r[1].rank, r[1].ok, r[1].time.as_str()),
            (Some(1), true, "t3")
        );

        for i in 0..20 {
            log.observe(&push(10, 0, &[(&format!("d-{}", i + 2), true)]), "t4");
        }
        let r = log.report();
        assert_eq!(r.len(), MAX_KEPT);
        assert_eq!(r.last().unwrap().id, "d-21", "the newest kept");
        assert_eq!(r[0].id, "d-6", "the oldest went");
    }
}
