//! The NameNodes of one nameservice: the active's edit log (committed txids over time) and
//! observers that tail it.

use crate::{MILLISECOND, Nanos, SECOND};

pub type StateId = i64;

/// Observer: a request whose state is further ahead than this is refused at once with
/// "Observer Node is too far behind" (GlobalStateIdContext: 10000 txn/s × the client's wait
/// time × 0.8; the client here waits 1 s).
pub const TOO_FAR_AHEAD: StateId = 8_000;
/// Observer: how long a requeued call may wait for the tailer before the caller times out.
pub const MAX_REQUEUE_WAIT: Nanos = 5 * SECOND;
/// Observer: a requeued call comes back to a handler about this often.
pub const REQUEUE_INTERVAL: Nanos = 5 * MILLISECOND;

/// The nameservice's edit log: every txid the active wrote, with when.
#[derive(Debug, Clone)]
pub struct EditLog {
    /// (time, txid), both increasing.
    history: Vec<(Nanos, StateId)>,
}

impl EditLog {
    pub fn new(first_txid: StateId) -> Self {
        Self { history: vec![(Nanos::MIN, first_txid)] }
    }

    /// The active writes `count` edits at `at` (never before the last write); returns the
    /// last txid written.
    pub fn write(&mut self, at: Nanos, count: StateId) -> StateId {
        let (last_at, last_txid) = *self.history.last().unwrap_or(&(Nanos::MIN, 0));
        let txid = last_txid + count.max(1);
        self.history.push((at.max(last_at), txid));
        txid
    }

    /// The active's last written txid at `at`.
    pub fn written_at(&self, at: Nanos) -> StateId {
        let index = self.history.partition_point(|(time, _)| *time <= at);
        self.history[index.saturating_sub(1)].1
    }

    /// When the active first wrote a txid above `state` (what replaced the data at `state`).
    pub fn replaced_at(&self, state: StateId) -> Option<Nanos> {
        let index = self.history.partition_point(|(_, txid)| *txid <= state);
        self.history.get(index).map(|(time, _)| *time)
    }

    pub fn last(&self) -> StateId {
        self.history.last().map_or(0, |entry| entry.1)
    }
}

/// An observer: applies what the active wrote, `lag` behind, in batches every `tail_period`;
/// frozen while its tailer is stalled, then catching up at `catch_up_rate` txids per second.
#[derive(Debug, Clone)]
pub struct Observer {
    pub node: String,
    pub lag: Nanos,
    pub tail_period: Nanos,
    pub stall: Option<(Nanos, Nanos)>,
    pub catch_up_rate: f64,
}

impl Observer {
    pub fn applied_at(&self, log: &EditLog, at: Nanos) -> StateId {
        let tailing = |time: Nanos| {
            let tick = (time - self.lag).div_euclid(self.tail_period) * self.tail_period;
            log.written_at(tick)
        };
        match self.stall {
            Some((start, _)) if at >= start && at < self.stall_end() => tailing(start),
            Some((start, end)) if at >= end => {
                let frozen = tailing(start);
                let caught_up = frozen + (self.catch_up_rate * (at - end) as f64 / SECOND as f64) as StateId;
                tailing(at).min(caught_up)
            }
            _ => tailing(at),
        }
    }

    fn stall_end(&self) -> Nanos {
        self.stall.map_or(Nanos::MIN, |(_, end)| end)
    }

    /// When the stalled observer has caught up with the active again.
    pub fn caught_up_at(&self, log: &EditLog, until: Nanos) -> Option<Nanos> {
        let (_, end) = self.stall?;
        let mut at = end;
        while at <= until {
            if self.applied_at(log, at) >= log.written_at(at - self.lag - self.tail_period) {
                return Some(at);
            }
            at += 10 * MILLISECOND;
        }
        None
    }

    /// The first time at or after `from` (within the requeue limit) at which the observer
    /// has applied `state`.
    pub fn time_reaching(&self, log: &EditLog, state: StateId, from: Nanos) -> Option<Nanos> {
        let mut at = from;
        while at <= from + MAX_REQUEUE_WAIT {
            if self.applied_at(log, at) >= state {
                return Some(at);
            }
            at += REQUEUE_INTERVAL;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observer_trails_the_log_and_freezes_while_stalled() {
        let mut log = EditLog::new(100);
        for second in 0..60 {
            log.write(second * SECOND, 10);
        }
        let observer = Observer {
            node: "nn-obs1".to_string(),
            lag: 200 * MILLISECOND,
            tail_period: 100 * MILLISECOND,
            stall: Some((10 * SECOND, 20 * SECOND)),
            catch_up_rate: 100.0,
        };
        assert_eq!(log.written_at(5 * SECOND), 160);
        assert_eq!(observer.applied_at(&log, 5 * SECOND + 100 * MILLISECOND), 150, "still behind the write at 5 s");
        assert_eq!(observer.applied_at(&log, 5 * SECOND + 200 * MILLISECOND), 160);
        assert_eq!(observer.applied_at(&log, 15 * SECOND), 200, "frozen at the stall");
        assert_eq!(observer.applied_at(&log, 21 * SECOND), 300, "catching up at 100 txid/s");
        assert_eq!(observer.time_reaching(&log, 160, 5 * SECOND), Some(5 * SECOND + 200 * MILLISECOND));
        assert_eq!(observer.time_reaching(&log, 400, 12 * SECOND), None, "beyond the requeue limit");
        assert!(observer.caught_up_at(&log, 60 * SECOND).is_some_and(|at| at > 20 * SECOND));
    }
}
