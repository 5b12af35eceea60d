//! Timelines kept between passes: spans held with the join's indexes, so that adding or
//! removing a few spans joins only what they change.
//!
//! [`build_timelines`](crate::build_timelines) joins a set of spans from scratch. The live
//! analyzer's scope passes did that on every pass, for tens of thousands of spans of a busy
//! scope, to add the hundred that arrived since (BENCHMARKS.md, "Under `serve --demo`"). Here
//! the spans stay with what the join found: a span added or removed marks what it can change
//! (the hops of its trace, the hops joined by its call id, the call of each attempt whose hops
//! moved), and [`HeldTimelines::refresh`] joins those again and nothing else.
//!
//! Invariant (tested against `build_timelines` over random changes): after
//! [`HeldTimelines::refresh`] the timelines are exactly `build_timelines` of the held spans in
//! key order, but for their cluster and system once a settle let their first attempt go: those
//! stay its, as the batch analysis of the whole history names them. A span's key is its start
//! and then the order it was added in, which is the order the caches hold spans in (start, then
//! commit order).
//!
//! `join.rs` keeps the join current as spans come and go; `settle.rs` lets go of what no later
//! call can change.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use smallvec::SmallVec;

use lagscope_model::{Anomaly, ClientTimeline, Component, Span, TimelineCall, TimelineJoin, UnixNanos};

use crate::AnalyzerConfig;
use crate::detectors::JudgeCalls;

use crate::detectors::follower_read_disabled::follower_history;
use crate::floor::{floors, seen_before};
use crate::open::found_in_metrics;
use crate::timeline::{
    MAX_PARENT_HOPS, attempt_of, call_of, distance_to, is_client_attempt, same_attempt_or_unnumbered,
};

mod join;
mod settle;
#[cfg(test)]
mod tests;

/// The `hold` of [`HeldTimelines::settle`] for the anomalies a pass found over the held spans:
/// nothing within the detectors' reach of `before` (a cluster switch extends a flapping run
/// within a switch-back delay of the last; failing sends become a blind probe's anomaly after
/// its `min_seconds`), and per namespace, nothing after the earliest start of an anomaly that
/// may still grow, one whose last evidence is within that reach (of the kinds found from spans:
/// a lag, a storm or shard pressure grows with its samples, which are not held here).
pub fn growing<A: std::borrow::Borrow<Anomaly>>(
    anomalies: &[A],
    before: UnixNanos,
    config: &AnalyzerConfig,
) -> impl Fn(Option<&str>) -> UnixNanos {
    let reach = config
        .failover_flapping
        .switch_back_delay_seconds
        .max(config.blind_failover_probe.min_seconds)
        .max(config.no_namenodes_window.min_window_seconds + config.no_namenodes_window.max_gap_seconds)
        .saturating_mul(1_000_000_000);
    let before = before.saturating_sub(reach);
    let mut from: BTreeMap<Option<&str>, UnixNanos> = BTreeMap::new();
    // Windows found from metrics alone grow with the samples, not the spans.
    let anomalies = anomalies.iter().map(std::borrow::Borrow::borrow);
    for anomaly in
        anomalies.filter(|anomaly: &&Anomaly| anomaly.end_unix_nano >= before && !found_in_metrics(anomaly.kind))
    {
        let earliest = from.entry(anomaly.namespace.as_deref()).or_insert(UnixNanos::MAX);
        *earliest = (*earliest).min(anomaly.start_unix_nano);
    }
    move |namespace| from.get(&namespace).copied().unwrap_or(UnixNanos::MAX).min(before)
}

/// What the per-call detectors ([`crate::detectors::Detector::judge`]) found in one held
/// timeline, kept with it between passes ([`HeldTimelines::take_verdicts`],
/// [`crate::analyze_held_kinds`]).
///
/// Invariant: `found` holds every anomaly those detectors find in the calls that start before
/// `unchanged_before` and not before the timeline's cut ([`HeldTimelines::settled_from`]),
/// exactly as they would find it now. (Such an anomaly depends only on its call and the calls
/// that started before it, none of which changed since it was found, but for those a settle
/// let go: the witnesses it keeps give every later call the floors and states seen of the
/// whole history, so judged again over what is left it would be found the same.) Anomalies
/// of calls before the cut are reported no more ([`HeldTimelines::is_settled`]), and not kept.
#[derive(Debug)]
pub struct CallVerdicts {
    /// The timeline's calls that start before this are as they were when `found` was found
    /// (`UnixNanos::MIN`: none is known to be).
    unchanged_before: UnixNanos,
    /// The detectors whose anomalies `found` holds (bits of their places in the registry).
    detectors: u64,
    /// (detector's place, the start of the call, the anomaly), each detector's in call order.
    found: Vec<(usize, UnixNanos, Arc<Anomaly>)>,
}

impl Default for CallVerdicts {
    fn default() -> Self {
        Self { unchanged_before: UnixNanos::MIN, detectors: 0, found: Vec::new() }
    }
}

impl CallVerdicts {
    /// Keeps what is about the calls that did not change, if `found` holds the anomalies of
    /// `detectors` (and of no other); otherwise nothing.
    pub(crate) fn keep_unchanged(&mut self, detectors: u64) {
        if self.detectors != detectors {
            (self.unchanged_before, self.detectors) = (UnixNanos::MIN, detectors);
        }
        let before = self.unchanged_before;
        self.found.retain(|(_, start, _)| *start < before);
    }

    /// Judges the calls of `timeline` that changed with `judge`, the detector at `place`.
    pub(crate) fn judge(
        &mut self,
        place: usize,
        judge: JudgeCalls,
        timeline: &ClientTimeline,
        config: &AnalyzerConfig,
    ) {
        let found = &mut self.found;
        judge(timeline, self.unchanged_before, config, &mut |start, anomaly| {
            found.push((place, start, Arc::new(anomaly)));
        });
    }

    /// The anomalies of the detector at `place`, in call order.
    pub(crate) fn of(&self, place: usize) -> impl Iterator<Item = &Arc<Anomaly>> {
        self.found.iter().filter(move |(of, _, _)| *of == place).map(|(_, _, anomaly)| anomaly)
    }
}

/// A held span's place: its start, then the order it was added in.
pub type SpanKey = (UnixNanos, u64);

/// How far [`HeldTimelines::settle`] moves a timeline's cut past its last one at most.
pub const SETTLE_STEP: UnixNanos = 20 * 1_000_000_000;

/// The most hops [`HeldTimelines::settle`] keeps waiting, past the cut-off, for an ancestor
/// still to come (the newest; the older go).
pub const MAX_WAITING_HOPS: usize = 5_000;

/// Spans held with their joined timelines ([`HeldTimelines::refresh`]).
#[derive(Debug)]
pub struct HeldTimelines {
    horizon: UnixNanos,
    next: u64,
    /// Boxed: a tree node moves keys and pointers, not spans, and holds no empty span slots.
    spans: BTreeMap<SpanKey, Box<Held>>,
    // The indexes are keyed by a hash of the strings (no copy of them per span) and hold
    // each hash's keys in key order; a lookup keeps the spans whose strings are equal.
    /// Spans by (trace id, span id, start): of each span, the first is the span, the others
    /// copies of it sent again (not joined).
    copies: HashMap<u64, Keys>,
    /// Joined spans by (trace id, span id): the last is the one a child's parent id names.
    by_id: HashMap<u64, Keys>,
    /// Joined client attempts by (client id, call id).
    by_call: HashMap<u64, Keys>,
    /// Joined router and server spans by trace id.
    trace_hops: HashMap<u64, Keys>,
    /// Hops whose join looked at the attempts of a (client id, call id).
    call_dependents: HashMap<u64, Keys>,
    /// Every joined router and server span: the attempt it joined, and how.
    hops: HashMap<SpanKey, Hop>,
    /// The hops of each attempt, in key order, and how each was found.
    attempt_hops: HashMap<SpanKey, SmallVec<[(SpanKey, TimelineJoin); 2]>>,
    groups: BTreeMap<GroupKey, Group>,
    /// Changed since the last refresh: traces and (client id, call id)s (by hash), hops not
    /// yet joined.
    dirty_traces: HashSet<u64>,
    dirty_calls: HashSet<u64>,
    unjoined: BTreeSet<SpanKey>,
    /// Held spans of no call: copies sent again, hops joined to no attempt, spans of neither
    /// kind. [`HeldTimelines::settle`] lets those go once they ended, without looking at every
    /// held span (that walk, a cache miss a span, was most of a settle of 50 000 held).
    loose: BTreeSet<SpanKey>,
    /// The timelines are lent out ([`HeldTimelines::take_timelines`]).
    lent: bool,
    /// Per timeline, where [`HeldTimelines::settle`] last cut it: calls that start before
    /// this were let go, except those later calls are judged by.
    settled: BTreeMap<GroupKey, UnixNanos>,
    /// Per namespace, the latest cut of any of its timelines (kept when they go): calls of
    /// other clients before it may have been let go. Never less than `settled` of any of its
    /// timelines.
    namespace_cuts: BTreeMap<Option<String>, UnixNanos>,
    /// The `before` of the last [`HeldTimelines::settle`].
    last_settle: UnixNanos,
    /// The newest span's start at that settle (`before` then, when nothing was held).
    last_settle_newest: UnixNanos,
    /// What the hops a settle let go of without their attempt (`loose`: still waiting for it)
    /// would have joined: the hash of their (trace id, parent span id), and of their (client
    /// id, call id), each with the latest end of such a hop. A span arriving later that one
    /// of them names is late ([`HeldTimelines::is_late`]): what would have joined it is gone.
    /// Kept for a horizon past that end (an attempt later than that begins another call).
    orphans: HashMap<u64, UnixNanos>,
    /// The calls a settle let go of (all their attempts), by the hash of their (client id, call
    /// id), each with its start: an attempt of one of them arriving later (a retry begun more
    /// than the settling behind its call's start, within a horizon of it) is late
    /// ([`HeldTimelines::is_late`]): held, it would be a call of its own, where the whole
    /// history has one call of both. Kept for two horizons past the call's start.
    let_go_calls: HashMap<u64, UnixNanos>,
    /// The series the timelines were last told what the metrics said from.
    pub(crate) told: crate::enrich::Told,
}

#[derive(Debug)]
struct Held {
    span: Span,
    /// Part of the join (not a copy of an earlier span).
    joined: bool,
}

/// Keys of held spans, in key order (few share a hash).
type Keys = SmallVec<[SpanKey; 2]>;

#[derive(Debug, Default)]
struct Hop {
    attempt: Option<(SpanKey, TimelineJoin)>,
    /// The hash of the (client id, call id) whose attempts the join looked at.
    depends_on: Option<u64>,
}

/// (client id, namespace).
type GroupKey = (String, Option<String>);

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum CallKey {
    Call(String),
    Lone(SpanKey),
}

#[derive(Debug)]
struct Group {
    attempts: BTreeSet<SpanKey>,
    calls: BTreeMap<CallKey, CallEntry>,
    dirty: BTreeSet<CallKey>,
    timeline: ClientTimeline,
    /// Each call's place in the timeline: (start, end, call key), as `timeline.calls`.
    order: Vec<(UnixNanos, UnixNanos, CallKey)>,
    /// The earliest start of a call built again, added or taken out since the verdicts were
    /// given back.
    changed_from: UnixNanos,
    /// The same since the timeline was last given back ([`HeldTimelines::give_back`]), told
    /// what the metrics said ([`crate::AnalysisInput::from_held`]).
    unenriched_from: UnixNanos,
    /// What the per-call detectors found when the verdicts were given back; `None` while they
    /// are taken, or never given.
    verdicts: Option<CallVerdicts>,
    /// The earliest attempt a settle let go, with its cluster and system: the timeline's while
    /// no earlier attempt is held (the batch analysis names a timeline's cluster and system by
    /// its first attempt; a settle does not change them).
    first_let_go: Option<(SpanKey, Option<String>, Option<String>)>,
}

/// A call key's attempts, and where the calls built of them are in `Group::order`.
#[derive(Debug, Default)]
struct CallEntry {
    attempts: Keys,
    places: SmallVec<[(UnixNanos, UnixNanos); 1]>,
}

impl HeldTimelines {
    /// No spans; a call id names one call for `horizon` ([`crate::StreamConfig::horizon`]).
    pub fn new(horizon: UnixNanos) -> Self {
        Self {
            horizon,
            next: 0,
            spans: BTreeMap::new(),
            copies: HashMap::default(),
            by_id: HashMap::default(),
            by_call: HashMap::default(),
            trace_hops: HashMap::default(),
            call_dependents: HashMap::default(),
            hops: HashMap::default(),
            attempt_hops: HashMap::default(),
            groups: BTreeMap::new(),
            dirty_traces: HashSet::default(),
            dirty_calls: HashSet::default(),
            unjoined: BTreeSet::new(),
            loose: BTreeSet::new(),
            lent: false,
            settled: BTreeMap::new(),
            namespace_cuts: BTreeMap::new(),
            last_settle: UnixNanos::MIN,
            last_settle_newest: UnixNanos::MIN,
            orphans: HashMap::default(),
            let_go_calls: HashMap::default(),
            told: crate::enrich::Told::default(),
        }
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The held spans in key order (start, then the order they were added in).
    pub fn spans(&self) -> impl Iterator<Item = &Span> {
        self.spans.values().map(|held| &held.span)
    }

    /// The oldest held span's start.
    pub fn first_start(&self) -> Option<UnixNanos> {
        self.spans.keys().next().map(|(start, _)| *start)
    }

    /// The newest held span's start.
    pub fn last_start(&self) -> Option<UnixNanos> {
        self.spans.keys().next_back().map(|(start, _)| *start)
    }

    /// Holds `span`, after every span held before it of the same start.
    pub fn insert(&mut self, span: Span) -> SpanKey {
        let key = (span.start_unix_nano, self.next);
        self.insert_at(key.1, span);
        key
    }

    /// Holds `span` in its place among spans of the same start by `order` (a store's span
    /// id, say), unless a span is held there already. Use this or [`HeldTimelines::insert`],
    /// not both.
    pub fn insert_at(&mut self, order: u64, span: Span) {
        let key = (span.start_unix_nano, order);
        if self.spans.contains_key(&key) {
            return;
        }
        self.next = self.next.max(order + 1);
        let identity = identity_hash(&span);
        self.spans.insert(key, Box::new(Held { span, joined: false }));
        self.loose.insert(key);
        let Some(identity) = identity else {
            self.join(key);
            return;
        };
        // The first of a span's copies is the one joined.
        add_key(&mut self.copies, identity, key);
        let copies = self.copies_of(key, identity);
        if copies.first() == Some(&key) {
            if let Some(&displaced) = copies.get(1) {
                self.leave(displaced);
            }
            self.join(key);
        }
    }

    /// Whether a span is held at `key`.
    pub fn contains(&self, key: SpanKey) -> bool {
        self.spans.contains_key(&key)
    }

    /// The held spans with their keys, in key order.
    pub fn keyed_spans(&self) -> impl Iterator<Item = (SpanKey, &Span)> {
        self.spans.iter().map(|(key, held)| (*key, &held.span))
    }

    /// Lets the oldest spans go: beyond the newest `limit`, and those that start before
    /// `kept_from`.
    pub fn keep_newest(&mut self, limit: usize, kept_from: Option<UnixNanos>) {
        while let Some(&key) = self.spans.keys().next() {
            if self.spans.len() <= limit && kept_from.is_none_or(|from| key.0 >= from) {
                break;
            }
            self.remove(key);
        }
    }

    /// Lets the span at `key` go, if held.
    pub fn remove(&mut self, key: SpanKey) -> Option<Span> {
        let held = self.spans.get(&key)?;
        let was_joined = held.joined;
        let identity = identity_hash(&held.span);
        if was_joined {
            self.leave(key);
        }
        let mut next = None;
        if let Some(identity) = identity {
            if was_joined {
                next = self.copies_of(key, identity).get(1).copied();
            }
            remove_key(&mut self.copies, identity, key);
        }
        let removed = self.spans.remove(&key).map(|held| held.span);
        self.loose.remove(&key);
        if let Some(next) = next {
            self.join(next);
        }
        removed
    }

    /// Joins again what changed since the last refresh.
    pub fn refresh(&mut self) {
        self.join_again(&BTreeMap::new());
    }

    /// [`HeldTimelines::refresh`], where per timeline the calls that start before its entry
    /// in `settled` were let go by a settle (or kept as witnesses): that changes neither what
    /// the per-call detectors find in the calls after them nor what the metrics tell those,
    /// unless the timeline's first attempt is of another cluster or system.
    fn join_again(&mut self, settled: &BTreeMap<GroupKey, UnixNanos>) {
        if self.lent {
            // Lent and not given back (the analysis panicked): every call is built again.
            self.lent = false;
            for group in self.groups.values_mut() {
                group.order.clear();
                group.calls.values_mut().for_each(|entry| entry.places.clear());
                group.timeline.calls.clear();
                group.dirty.extend(group.calls.keys().cloned());
                // What was let go meanwhile is no longer known: all of it changed.
                (group.changed_from, group.unenriched_from) = (UnixNanos::MIN, UnixNanos::MIN);
            }
        }
        let mut hops: BTreeSet<SpanKey> = std::mem::take(&mut self.unjoined);
        for trace in std::mem::take(&mut self.dirty_traces) {
            hops.extend(self.trace_hops.get(&trace).into_iter().flatten().copied());
        }
        for call in std::mem::take(&mut self.dirty_calls) {
            hops.extend(self.call_dependents.get(&call).into_iter().flatten().copied());
        }
        for hop in hops {
            self.rejoin_hop(hop);
        }
        let horizon = self.horizon;
        let spans = &self.spans;
        let attempt_hops = &self.attempt_hops;
        self.groups.retain(|key, group| {
            if !group.dirty.is_empty() {
                let let_go_before = settled.get(key).copied().unwrap_or(UnixNanos::MIN);
                group.rebuild(key, spans, attempt_hops, horizon, let_go_before);
            }
            !group.attempts.is_empty()
        });
    }

    /// The timelines as [`crate::build_timelines`] orders them, lent out (moved, not copied)
    /// until [`HeldTimelines::give_back`]. Call [`HeldTimelines::refresh`] first.
    pub fn take_timelines(&mut self) -> Vec<ClientTimeline> {
        self.lent = true;
        self.groups.values_mut().map(|group| std::mem::replace(&mut group.timeline, empty_timeline())).collect()
    }

    /// Per timeline, in the order of [`HeldTimelines::take_timelines`], where the last settle
    /// cut it ([`HeldTimelines::settled_from`]; `UnixNanos::MIN`: never).
    pub(crate) fn cuts(&self) -> Vec<UnixNanos> {
        self.groups.keys().map(|key| self.settled.get(key).copied().unwrap_or(UnixNanos::MIN)).collect()
    }

    /// Gives back what [`HeldTimelines::take_timelines`] lent, in its order (what the analysis
    /// added to the attempts, the metrics' reports, stays until it is added again).
    pub fn give_back(&mut self, timelines: Vec<ClientTimeline>) {
        if timelines.len() != self.groups.len() {
            return;
        }
        for (group, timeline) in self.groups.values_mut().zip(timelines) {
            group.timeline = timeline;
            group.unenriched_from = UnixNanos::MAX;
        }
        self.lent = false;
    }

    /// Per timeline, in the order of [`HeldTimelines::take_timelines`], the earliest start of
    /// a call built again since the timelines were last given back (`UnixNanos::MAX`: none).
    pub(crate) fn unenriched_from(&self) -> Vec<UnixNanos> {
        self.groups.values().map(|group| group.unenriched_from).collect()
    }

    /// Each timeline's [`CallVerdicts`], in the order of [`HeldTimelines::take_timelines`] (call
    /// [`HeldTimelines::refresh`] first), taken until [`HeldTimelines::give_back_verdicts`]:
    /// what the per-call detectors found when they were last given back, and which calls did
    /// not change since. A timeline whose verdicts were not given back has none.
    pub fn take_verdicts(&mut self) -> Vec<CallVerdicts> {
        self.groups
            .values_mut()
            .map(|group| match group.verdicts.take() {
                Some(verdicts) => CallVerdicts { unchanged_before: group.changed_from, ..verdicts },
                None => CallVerdicts::default(),
            })
            .collect()
    }

    /// Gives back what [`HeldTimelines::take_verdicts`] took, as the analysis of the timelines
    /// (unchanged since they were taken) left them: from now on, a call built again, added or
    /// taken out marks the verdicts about it and every later call as changed.
    pub fn give_back_verdicts(&mut self, verdicts: Vec<CallVerdicts>) {
        if verdicts.len() != self.groups.len() {
            return;
        }
        for (group, verdicts) in self.groups.values_mut().zip(verdicts) {
            group.verdicts = Some(verdicts);
            group.changed_from = UnixNanos::MAX;
        }
    }
}

fn empty_timeline() -> ClientTimeline {
    ClientTimeline { client_id: String::new(), namespace: None, cluster: None, system: None, calls: Vec::new() }
}

fn hash_of(value: impl std::hash::Hash) -> u64 {
    use std::hash::Hasher;
    let mut hasher = rustc_hash::FxHasher::default();
    value.hash(&mut hasher);
    hasher.finish()
}

/// The hash of what makes a span the same span sent again: its trace id, span id and start.
fn identity_hash(span: &Span) -> Option<u64> {
    Some(hash_of((span.trace_id.as_deref()?, span.span_id.as_deref()?, span.start_unix_nano)))
}

/// The hash of (trace id, span id).
fn ids_hash(trace_id: Option<&str>, span_id: Option<&str>) -> Option<u64> {
    Some(hash_of((trace_id?, span_id?)))
}

/// The hash of (client id, call id), when the span has both.
fn call_hash(span: &Span) -> Option<u64> {
    Some(hash_of((span.call.client_id.as_deref()?, span.call.call_id.as_deref()?)))
}

fn insert_key(keys: &mut Keys, key: SpanKey) {
    if let Err(place) = keys.binary_search(&key) {
        keys.insert(place, key);
    }
}

fn add_key(index: &mut HashMap<u64, Keys>, hash: u64, key: SpanKey) {
    insert_key(index.entry(hash).or_default(), key);
}

fn remove_key(index: &mut HashMap<u64, Keys>, hash: u64, key: SpanKey) {
    if let Some(keys) = index.get_mut(&hash) {
        if let Ok(place) = keys.binary_search(&key) {
            keys.remove(place);
        }
        if keys.is_empty() {
            index.remove(&hash);
        }
    }
}

fn is_hop(span: &Span) -> bool {
    matches!(span.component(), Some(Component::Router | Component::Server))
}

/// The timeline and the call a client attempt belongs to.
fn attempt_keys(key: SpanKey, span: &Span) -> (GroupKey, CallKey) {
    let group = (span.call.client_id.clone().unwrap_or_default(), span.call.namespace.clone());
    let call = match &span.call.call_id {
        Some(call_id) => CallKey::Call(call_id.clone()),
        None => CallKey::Lone(key),
    };
    (group, call)
}
