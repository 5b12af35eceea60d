//! What the engine keeps per (client, namespace): the session floors, the highest state
//! seen, and the small running state of the detectors that follow one client's attempts in
//! order (untrusted states, follower reads turned off, failing sends, cluster switches).

use std::collections::{BTreeSet, VecDeque};
use std::rc::Rc;

use lagscope_model::{StateId, UnixNanos};

use super::compact::{Attempt, Call};
use super::intern::Sym;
use crate::floor::{FloorContribution, FloorSource};

/// Calls per client kept for causes that look back (a lower state brought back by a later
/// response, HDFS-16837): as many as the batch detector searches.
const RECENT_CALLS: usize = crate::detectors::carried_state_regression::OVERWRITE_LOOKBACK_CALLS;

/// One attempt of a processed call.
#[derive(Debug, Clone)]
pub(crate) struct AttemptAt {
    pub(crate) call: Rc<Call>,
    pub(crate) index: usize,
}

impl AttemptAt {
    pub(crate) fn attempt(&self) -> &Attempt {
        &self.call.attempts[self.index]
    }
}

/// A state the client saw, and the call and attempt it came from.
#[derive(Debug, Clone)]
pub(crate) struct Contribution {
    pub(crate) state: StateId,
    pub(crate) completed: UnixNanos,
    pub(crate) source: FloorSource,
    pub(crate) at: AttemptAt,
}

impl Contribution {
    pub(crate) fn floor(&self) -> FloorContribution {
        FloorContribution {
            state: self.state,
            call_index: 0,
            attempt_index: self.at.index,
            source: self.source,
            completed_unix_nano: self.completed,
        }
    }
}

/// A client's requests carrying a state beyond anything committed, summed up.
#[derive(Debug)]
pub(crate) struct UntrustedRun {
    pub(crate) first: AttemptAt,
    pub(crate) committed: StateId,
    pub(crate) last_end: UnixNanos,
    pub(crate) carried: StateId,
    pub(crate) requests: usize,
    pub(crate) refused: usize,
    /// (router, server) pools.
    pub(crate) pools: BTreeSet<(Sym, Sym)>,
}

/// The latest point follower reads were turned off after which no read went to a follower
/// (so far): a rejected follower read ([`Rejection`]) or the client's own log line
/// ([`LoggedDisable`]), and the reads since.
#[derive(Debug)]
pub(crate) struct Disable<Origin> {
    pub(crate) origin: Origin,
    pub(crate) used_followers_before: bool,
    pub(crate) consistency_before: Sym,
    pub(crate) reads_after: usize,
    pub(crate) consistencies_after: BTreeSet<Sym>,
    pub(crate) last_end: UnixNanos,
}

impl<Origin> Disable<Origin> {
    /// Starts at `origin` with what the client had done until then.
    pub(crate) fn new(
        origin: Origin,
        used_followers_before: bool,
        consistency_before: Sym,
        last_end: UnixNanos,
    ) -> Self {
        Self {
            origin,
            used_followers_before,
            consistency_before,
            reads_after: 0,
            consistencies_after: BTreeSet::new(),
            last_end,
        }
    }

    /// Whether a read answered after it counts as one that went elsewhere
    /// ([`crate::detectors::follower_read_disabled`]'s rule): its server known (its span
    /// joined), or its consistency other than the follower reads' before.
    pub(crate) fn counts(&self, served_by: Sym, consistency: Sym) -> bool {
        served_by != Sym::NONE
            || (consistency != Sym::NONE
                && self.consistency_before != Sym::NONE
                && consistency != self.consistency_before)
    }

    /// Counts a read served after it.
    pub(crate) fn count(&mut self, consistency: Sym, end: UnixNanos) {
        self.reads_after += 1;
        if consistency.is_some() {
            self.consistencies_after.insert(consistency);
        }
        self.last_end = self.last_end.max(end);
    }

    /// Whether it turned follower reads off for good, as far as the reads show.
    pub(crate) fn for_good(&self, min_reads_after: usize) -> bool {
        self.used_followers_before && self.reads_after >= min_reads_after
    }
}

/// A rejected follower read.
pub(crate) type Rejection = Disable<AttemptAt>;

/// The client's log line: (time, the OM that refused).
pub(crate) type LoggedDisable = Disable<(UnixNanos, Sym)>;

/// Consecutive failed sends to one cluster URL.
#[derive(Debug)]
pub(crate) struct FailingRun {
    pub(crate) first: AttemptAt,
    pub(crate) address: Sym,
    pub(crate) end: UnixNanos,
    pub(crate) sends: usize,
}

/// A switch between cluster URLs: (time, from, to, the attempt to the new one, and, for a
/// switch back that did not wait, `failover_flapping::early_switch_back`, judged when the
/// switch is taken, while the probe's verdicts up to it are all in and none has been pruned).
pub(crate) type Switch = (UnixNanos, Sym, Sym, AttemptAt, Option<crate::detectors::failover_flapping::EarlySwitch>);

/// Everything the engine keeps about one (client, namespace).
#[derive(Debug)]
pub(crate) struct ClientState {
    pub(crate) client: Sym,
    pub(crate) namespace: Sym,
    pub(crate) cluster: Sym,
    pub(crate) system: Sym,
    /// Floor contributions of processed calls not yet completed at the latest call's start.
    pending_floor: Vec<Contribution>,
    /// The same for the highest state seen (carried-state regressions).
    pending_seen: Vec<Contribution>,
    pub(crate) writes: Option<Contribution>,
    pub(crate) reads: Option<Contribution>,
    pub(crate) seen: Option<Contribution>,
    pub(crate) recent: VecDeque<Rc<Call>>,
    pub(crate) untrusted: Option<UntrustedRun>,
    /// The client's checks put off in the engine's queue (`engine::Deferred`): while there
    /// are any, its next ones wait behind them, and it is not evicted.
    pub(crate) deferred: u32,
    /// The latest end time of the client's attempts seen (for idle eviction).
    pub(crate) last_seen: UnixNanos,
    pub(crate) used_followers: bool,
    pub(crate) last_follower_consistency: Sym,
    pub(crate) rejection: Option<Rejection>,
    /// The client's logged disable in force, and how many of its lines have taken effect.
    pub(crate) logged: Option<LoggedDisable>,
    pub(crate) logged_next: usize,
    pub(crate) failing: Option<FailingRun>,
    /// The cluster URL of the latest attempt that named one.
    pub(crate) last_address: Sym,
    pub(crate) switches: Vec<Switch>,
}

impl ClientState {
    pub(crate) fn new(client: Sym, namespace: Sym, cluster: Sym, system: Sym) -> Self {
        Self {
            client,
            namespace,
            cluster,
            system,
            pending_floor: Vec::new(),
            pending_seen: Vec::new(),
            writes: None,
            reads: None,
            seen: None,
            recent: VecDeque::new(),
            untrusted: None,
            deferred: 0,
            last_seen: i64::MIN,
            used_followers: false,
            last_follower_consistency: Sym::NONE,
            rejection: None,
            logged: None,
            logged_next: 0,
            failing: None,
            last_address: Sym::NONE,
            switches: Vec::new(),
        }
    }

    /// Folds every contribution completed by `start` into the floors and the highest seen
    /// state, in completion order (ties in processing order), as the batch sweep does.
    pub(crate) fn fold(&mut self, start: UnixNanos) {
        for contribution in ready(&mut self.pending_floor, start) {
            let slot = match contribution.source {
                FloorSource::Write => &mut self.writes,
                FloorSource::Read => &mut self.reads,
            };
            raise(slot, contribution);
        }
        for contribution in ready(&mut self.pending_seen, start) {
            raise(&mut self.seen, contribution);
        }
    }

    /// What a processed call adds: its floor contribution (a write's returned state, a
    /// read's served state), the highest state it returned, and a place among the recent
    /// calls.
    pub(crate) fn contribute(&mut self, call: &Rc<Call>, read: Sym, write: Sym) {
        let successful = || call.attempts.iter().enumerate().filter(|(_, attempt)| attempt.ok);
        let floor_source = if call.op == write {
            Some(FloorSource::Write)
        } else if call.op == read {
            Some(FloorSource::Read)
        } else {
            None
        };
        if let Some(source) = floor_source {
            let best = last_max(successful().filter_map(|(index, attempt)| {
                let value = if source == FloorSource::Write { attempt.returned() } else { attempt.served() };
                Some((value?, index, attempt.end))
            }));
            if let Some((state, index, completed)) = best {
                let at = AttemptAt { call: call.clone(), index };
                self.pending_floor.push(Contribution { state, completed, source, at });
            }
        }
        let source = if call.op == write { FloorSource::Write } else { FloorSource::Read };
        let best =
            last_max(successful().filter_map(|(index, attempt)| Some((attempt.returned()?, index, attempt.end))));
        if let Some((state, index, completed)) = best {
            let at = AttemptAt { call: call.clone(), index };
            self.pending_seen.push(Contribution { state, completed, source, at });
        }
        if self.recent.len() == RECENT_CALLS {
            self.recent.pop_front();
        }
        self.recent.push_back(call.clone());
    }
}

/// The contributions of `list` completed by `start`, in completion order, taken out (drained
/// in place: this runs for every call).
fn ready(list: &mut Vec<Contribution>, start: UnixNanos) -> std::vec::Drain<'_, Contribution> {
    if list.iter().all(|contribution| contribution.completed > start) {
        return list.drain(..0);
    }
    list.sort_by_key(|contribution| contribution.completed);
    let ready = list.partition_point(|contribution| contribution.completed <= start);
    list.drain(..ready)
}

fn raise(slot: &mut Option<Contribution>, contribution: Contribution) {
    if slot.as_ref().is_none_or(|current| contribution.state > current.state) {
        *slot = Some(contribution);
    }
}

/// The last of the highest values (as `Iterator::max_by_key` picks).
fn last_max(items: impl Iterator<Item = (StateId, usize, UnixNanos)>) -> Option<(StateId, usize, UnixNanos)> {
    items.fold(None, |best, item| match best {
        Some(current) if current.0 > item.0 => Some(current),
        _ => Some(item),
    })
}
