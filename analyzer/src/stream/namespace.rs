//! What the engine knows about a namespace, across its clients: the committed states its
//! servers reported over time, which nodes answered when, and which reported ACTIVE.

use std::collections::VecDeque;

use lagscope_model::{StateId, UnixNanos};

use super::intern::Sym;

/// When each new highest committed state was first reported: a staircase strictly rising in
/// time and state. Reports may arrive out of order; entries older than the retention are
/// dropped (their maximum is kept as the floor of what is known).
#[derive(Debug, Default)]
pub(crate) struct Committed {
    steps: VecDeque<(UnixNanos, StateId)>,
    /// The highest state among dropped steps, and when it was first reported.
    dropped: Option<(UnixNanos, StateId)>,
}

impl Committed {
    pub(crate) fn report(&mut self, at: UnixNanos, state: StateId) {
        if self.dropped.is_some_and(|(_, highest)| highest >= state) {
            return;
        }
        // Steps before `at` rise, so the last of them is the highest known by then.
        let position = self.steps.partition_point(|(time, _)| *time <= at);
        if position > 0 && self.steps[position - 1].1 >= state {
            return;
        }
        // Later steps this report makes redundant (not higher).
        let mut end = position;
        while end < self.steps.len() && self.steps[end].1 <= state {
            end += 1;
        }
        if end == position {
            self.steps.insert(position, (at, state));
        } else {
            self.steps[position] = (at, state);
            self.steps.drain(position + 1..end);
        }
    }

    /// The highest state reported at or before `at`.
    pub(crate) fn highest_at(&self, at: UnixNanos) -> Option<StateId> {
        let position = self.steps.partition_point(|(time, _)| *time <= at);
        match position.checked_sub(1) {
            Some(index) => Some(self.steps[index].1),
            None => self.dropped.filter(|(time, _)| *time <= at).map(|(_, state)| state),
        }
    }

    /// When a state above `served` was first reported, and that state.
    pub(crate) fn first_above(&self, served: StateId) -> Option<(UnixNanos, StateId)> {
        if let Some(dropped) = self.dropped.filter(|(_, state)| *state > served) {
            // Replaced before the retained history starts: the oldest step we know of.
            return Some(dropped);
        }
        let position = self.steps.partition_point(|(_, state)| *state <= served);
        self.steps.get(position).copied()
    }

    pub(crate) fn prune(&mut self, before: UnixNanos) {
        while self.steps.len() > 1 && self.steps[1].0 < before {
            if let Some(step) = self.steps.pop_front() {
                self.dropped = Some(step);
            }
        }
    }
}

/// A timestamped fact kept for the retention.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fact {
    pub(crate) at: UnixNanos,
    pub(crate) node: Sym,
    /// Arrival order, for ties.
    pub(crate) order: u64,
    /// The client it came from, where that matters.
    pub(crate) client: Sym,
}

#[derive(Debug, Default)]
pub(crate) struct Recent {
    items: VecDeque<Fact>,
}

impl Recent {
    pub(crate) fn push(&mut self, fact: Fact) {
        self.items.push_back(fact);
    }

    pub(crate) fn within(&self, from: UnixNanos, to: UnixNanos) -> impl Iterator<Item = &Fact> {
        self.items.iter().filter(move |fact| (from..=to).contains(&fact.at))
    }

    /// Drops what is older than `before` (facts arrive roughly in time order; a straggler
    /// behind the front waits for it).
    pub(crate) fn prune(&mut self, before: UnixNanos) {
        while self.items.front().is_some_and(|fact| fact.at < before) {
            self.items.pop_front();
        }
    }
}

/// Requests a router forwarded with a higher state than their client carried, kept per
/// namespace to find the victims of a poisoned pool (`untrusted_state`); such requests are
/// rare, and at most this many are kept.
pub(crate) const MAX_FORWARDED: usize = 4096;

/// Per (cluster, namespace).
#[derive(Debug, Default)]
pub(crate) struct NamespaceState {
    /// (client, state the router forwarded, state the client carried), the router's higher.
    pub(crate) forwarded: Vec<(Sym, StateId, Option<StateId>)>,
    pub(crate) committed: Committed,
    /// Successful answers: at their end, the node that served.
    pub(crate) served: Recent,
    /// Successful executions as the active: at their start, by which client.
    pub(crate) active_served: Recent,
    /// Role metrics saying ACTIVE.
    pub(crate) active_reported: Recent,
}

impl NamespaceState {
    pub(crate) fn prune(&mut self, before: UnixNanos) {
        self.committed.prune(before);
        self.served.prune(before);
        self.active_served.prune(before);
        self.active_reported.prune(before);
    }
}
