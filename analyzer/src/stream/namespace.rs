//! What the engine knows about a namespace, across its clients: the committed states its
//! servers reported over time, which nodes answered when, and which reported ACTIVE.

use std::cell::Cell;
use std::collections::VecDeque;

use lagscope_model::{StateId, UnixNanos};

use super::intern::Sym;

/// When each new highest committed state was first reported: a staircase strictly rising in
/// time and state. Reports may arrive out of order; entries older than the retention are
/// dropped (their maximum is kept as the floor of what is known).
///
/// A busy namespace has tens of thousands of steps in its retention, and every call asks
/// about them: reports mostly extend the staircase at its end, and lookups come in the order
/// calls are processed, so each search starts where the previous one of its kind ended
/// ([`partition_near`]) instead of halving the whole staircase (a cache miss a level).
#[derive(Debug, Default)]
pub(crate) struct Committed {
    steps: VecDeque<(UnixNanos, StateId)>,
    /// The highest state among dropped steps, and when it was first reported.
    dropped: Option<(UnixNanos, StateId)>,
    /// Where the last search by time, and by state, ended.
    time_hint: Cell<usize>,
    state_hint: Cell<usize>,
}

/// `items.partition_point(predicate)` (the predicate true on a prefix, false after), found by
/// galloping out from `hint` and halving the bracket found: O(log d) reads for a point at a
/// distance d from the hint, all near it.
fn partition_near<T>(items: &VecDeque<T>, hint: usize, predicate: impl Fn(&T) -> bool) -> usize {
    let length = items.len();
    let hint = hint.min(length);
    // The point lies in low..=high: the predicate holds before `low`, fails from `high` on.
    let (mut low, mut high);
    if hint < length && predicate(&items[hint]) {
        low = hint + 1;
        high = length;
        let mut step = 1;
        while let Some(probe) = hint.checked_add(step).filter(|probe| *probe < length) {
            if !predicate(&items[probe]) {
                high = probe;
                break;
            }
            low = probe + 1;
            step = step.saturating_mul(2);
        }
    } else {
        low = 0;
        high = hint;
        let mut step = 1;
        while let Some(probe) = hint.checked_sub(step) {
            if predicate(&items[probe]) {
                low = probe + 1;
                break;
            }
            high = probe;
            step = step.saturating_mul(2);
        }
    }
    while low < high {
        let middle = low + (high - low) / 2;
        if predicate(&items[middle]) {
            low = middle + 1;
        } else {
            high = middle;
        }
    }
    low
}

impl Committed {
    pub(crate) fn report(&mut self, at: UnixNanos, state: StateId) {
        if self.dropped.is_some_and(|(_, highest)| highest >= state) {
            return;
        }
        // In time order (the common case): past every step, higher than the last or nothing new.
        if let Some(&(last_time, last_state)) = self.steps.back()
            && last_time <= at
        {
            if last_state < state {
                self.steps.push_back((at, state));
            }
            return;
        }
        // Steps before `at` rise, so the last of them is the highest known by then.
        let position = partition_near(&self.steps, self.time_hint.get(), |(time, _)| *time <= at);
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
        let position = partition_near(&self.steps, self.time_hint.get(), |(time, _)| *time <= at);
        self.time_hint.set(position);
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
        let position = partition_near(&self.steps, self.state_hint.get(), |(_, state)| *state <= served);
        self.state_hint.set(position);
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
    /// (client, state the router forwarded, state the client carried, the attempt's start),
    /// the router's higher.
    pub(crate) forwarded: Vec<(Sym, StateId, Option<StateId>, UnixNanos)>,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// From every hint, on rising sequences with runs of equal values, as `partition_point`.
    #[test]
    fn partition_near_finds_what_partition_point_finds() {
        let mut random = crate::stream::xorshift(0x9e37_79b9_7f4a_7c15_u64);
        for length in [0_usize, 1, 2, 3, 7, 64, 1_000] {
            let mut sorted = Vec::new();
            let mut value = 0_u64;
            for _ in 0..length {
                value += random(3);
                sorted.push(value);
            }
            // The first third pushed at the front, so that the deque wraps (two slices).
            let mut items = VecDeque::with_capacity(length);
            items.extend(&sorted[length / 3..]);
            for item in sorted[..length / 3].iter().rev() {
                items.push_front(*item);
            }
            assert!(items.iter().eq(sorted.iter()));
            for target in 0..=value + 1 {
                let expected = items.partition_point(|item| *item <= target);
                for hint in
                    [0, 1, length / 2, length.saturating_sub(1), length, length + 5, random(length as u64 + 1) as usize]
                {
                    assert_eq!(
                        partition_near(&items, hint, |item| *item <= target),
                        expected,
                        "{length} {target} {hint}"
                    );
                }
            }
        }
    }

    /// Reports in and out of order, lookups from any hint: the staircase a sorted rebuild gives.
    #[test]
    fn the_staircase_holds_whatever_order_reports_come_in() {
        let mut random = crate::stream::xorshift(0x2545_f491_4f6c_dd1d_u64);
        let mut committed = Committed::default();
        let mut reports = Vec::new();
        for index in 0..3_000_i64 {
            let at = index * 10 - random(200) as i64;
            let state = index - random(50) as i64;
            committed.report(at, state);
            reports.push((at, state));
            if index % 97 == 0 {
                let probe = random(30_000) as i64;
                let expected = reports.iter().filter(|(time, _)| *time <= probe).map(|(_, state)| *state).max();
                assert_eq!(committed.highest_at(probe), expected, "at {probe}");
                let served = random(3_000) as i64;
                let first = reports
                    .iter()
                    .filter(|(_, state)| *state > served)
                    .min_by_key(|(time, state)| (*time, *state))
                    .map(|(time, _)| *time);
                assert_eq!(committed.first_above(served).map(|(time, _)| time), first, "above {served}");
            }
        }
    }
}
