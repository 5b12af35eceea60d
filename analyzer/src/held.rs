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
//! key order. A span's key is its start and then the order it was added in, which is the
//! order the caches hold spans in (start, then commit order).

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

    /// Lets go of what no later call can change, so that what is held, and what every pass
    /// judges again, follows the telemetry of the last minutes and not the client's whole
    /// history.
    ///
    /// Per timeline, the cut is the latest call start at or before `before` (and before
    /// `hold(namespace)`: an anomaly still growing from an earlier start) that
    /// no earlier call is still running at; every call that starts before it ended by then.
    /// Those calls are let go (their attempts, the hops joined to them, and copies sent again),
    /// except the ones later calls are judged by, which stay as witnesses: the calls that set
    /// the write floor, the read floor and the highest state seen in force at the cut (so the
    /// floors of every later call are exactly those of the whole history: every call let go
    /// completed before any later call started), the last call before the cut (the attempt a
    /// later one switches cluster from), and the last follower read with the rejection that
    /// turned follower reads off after it, and the call a server reported the highest committed
    /// state in (an untrusted state is judged against it). A rejection still in force holds
    /// the cut at its call.
    /// Spans of no call (hops that joined none, other spans) that ended before `before` go too.
    ///
    /// A timeline's cut moves at most [`SETTLE_STEP`] past its last cut (its first call's start
    /// when it was never cut) per settle: a backlog (the calls an anomaly held while it grew,
    /// minutes of a bulk client's spans) is let go over a few settles rather than in one,
    /// which took 0.1-0.2 s for 18 000 spans under load.
    ///
    /// Taking the calls before a cut out does not mark the calls after it changed: what the
    /// per-call detectors found in those stays found ([`CallVerdicts`]), and what the metrics
    /// told them stays told, unless the timeline's first attempt is now of another cluster.
    ///
    /// Anomalies about attempts before a timeline's cut ([`HeldTimelines::settled_from`]), and
    /// those that ended before a cut of their namespace, were judged with the whole history by
    /// the passes before it; judged again over what is left they may differ, and are not to be
    /// reported ([`HeldTimelines::is_settled`]). Returns the spans let go, with their keys.
    pub fn settle(&mut self, before: UnixNanos, hold: impl Fn(Option<&str>) -> UnixNanos) -> Vec<(SpanKey, Span)> {
        self.refresh();
        self.last_settle = before;
        self.last_settle_newest = self.last_start().unwrap_or(before).max(before);
        let mut going: BTreeSet<SpanKey> = BTreeSet::new();
        let mut kept_attempts: HashSet<SpanKey> = HashSet::default();
        let mut cuts: Vec<(GroupKey, UnixNanos)> = Vec::new();
        for (key, group) in &mut self.groups {
            let calls = &group.timeline.calls;
            let Some(first) = calls.first() else { continue };
            // From the last cut, or from the first call when there was none: a timeline whose
            // cut a growing anomaly held from its first call has minutes to let go too.
            let from = self.settled.get(key).copied().unwrap_or(first.start_unix_nano);
            let target = before.min(hold(key.1.as_deref())).min(from.saturating_add(SETTLE_STEP));
            let (_, rejection) = follower_history(calls);
            let target = rejection.map_or(target, |index| target.min(calls[index].start_unix_nano));
            // The latest start no earlier call is still running at.
            let (mut cut, mut running_until) = (None, UnixNanos::MIN);
            for (index, call) in calls.iter().enumerate() {
                if call.start_unix_nano > target {
                    break;
                }
                if running_until <= call.start_unix_nano {
                    cut = Some(index);
                }
                running_until = running_until.max(call.end_unix_nano);
            }
            let Some(cut) = cut.filter(|cut| *cut > 0) else { continue };
            let at = calls[cut].start_unix_nano;
            cuts.push((key.clone(), at));
            // What was found about the calls before the cut is reported no more; what was
            // found about the later ones stays found (`CallVerdicts`).
            if let Some(verdicts) = &mut group.verdicts {
                verdicts.found.retain(|(_, start, _)| *start >= at);
            }
            // A call after the cut's ended after it started: the floors there are the prefix's.
            let prefix = &calls[..calls.partition_point(|call| call.start_unix_nano <= at)];
            let floors_at = floors(prefix)[cut];
            let seen_at = seen_before(prefix)[cut];
            let (follower_read, rejection) = follower_history(&calls[..cut]);
            // The highest committed state a server reported before the cut (the first report
            // of it): what every later attempt's `highest committed known` includes.
            let committed = calls[..cut]
                .iter()
                .enumerate()
                .filter_map(|(index, call)| {
                    Some((call.attempts.iter().filter_map(|attempt| attempt.committed).max()?, index))
                })
                .min_by_key(|(committed, index)| (std::cmp::Reverse(*committed), *index))
                .map(|(_, index)| index);
            let witnesses: BTreeSet<usize> = [floors_at.writes, floors_at.reads, seen_at]
                .into_iter()
                .flatten()
                .map(|contribution| contribution.call_index)
                .chain([Some(cut - 1), follower_read, rejection, committed].into_iter().flatten())
                .filter(|index| *index < cut)
                .collect();
            for index in witnesses {
                let (start, end, call_key) = &group.order[index];
                let entry = &group.calls[call_key];
                kept_attempts.extend(entry.attempts.iter().filter(|attempt| (*start..=*end).contains(&attempt.0)));
            }
            for attempt in group.attempts.range(..(at, 0)) {
                if !kept_attempts.contains(attempt) {
                    going.insert(*attempt);
                    going.extend(self.attempt_hops.get(attempt).into_iter().flatten().map(|(hop, _)| *hop));
                }
            }
        }
        // Spans of no call that ended before the cut-off: a hop that joined no attempt, a
        // copy sent again, a span of neither kind. (The hops of the attempts going are going.)
        // A hop whose trace names an ancestor not held yet waits for it up to a horizon, where
        // the clients of its namespace send their attempts: there the ancestor is a span still
        // to come (a router's or a client's of a long call, exported when the call ends, while
        // the hops under its first attempts ended and came long before). Let go, it would make
        // that span late. Where no client of the namespace sends its attempts, the ancestors
        // are spans no one exports, and its hops go at the cut-off. So do the oldest of those
        // waiting past [`MAX_WAITING_HOPS`] (clients that propagate trace context and export
        // nothing, beside clients that export, would otherwise fill what is held).
        let sending: HashSet<&Option<String>> = self.groups.keys().map(|(_, namespace)| namespace).collect();
        let horizon = self.horizon;
        let (mut waiting, mut loose_going) = (Vec::new(), Vec::new());
        for key in self.loose.range(..(before, 0)) {
            let span = &self.spans[key].span;
            if span.end_unix_nano >= before {
                continue;
            }
            if span.end_unix_nano.saturating_add(horizon) >= before
                && sending.contains(&span.call.namespace)
                && self.awaits_ancestor(span)
            {
                waiting.push(*key);
            } else {
                loose_going.push(*key);
            }
        }
        loose_going.extend_from_slice(&waiting[..waiting.len().saturating_sub(MAX_WAITING_HOPS)]);
        for key in loose_going {
            going.insert(key);
            let span = &self.spans[&key].span;
            if is_hop(span) {
                let parent = ids_hash(span.trace_id.as_deref(), span.parent_span_id.as_deref());
                for orphan in parent.into_iter().chain(call_hash(span)) {
                    let end = self.orphans.entry(orphan).or_insert(span.end_unix_nano);
                    *end = (*end).max(span.end_unix_nano);
                }
            }
        }
        self.orphans.retain(|_, end| end.saturating_add(horizon) >= before);
        let mut let_go = Vec::with_capacity(going.len());
        for key in going {
            if let Some(span) = self.remove(key) {
                let_go.push((key, span));
            }
        }
        // Joined again now, knowing which calls the settle let go.
        self.join_again(&cuts.iter().cloned().collect());
        for (key, at) in cuts {
            let in_namespace = self.namespace_cuts.entry(key.1.clone()).or_insert(UnixNanos::MIN);
            *in_namespace = (*in_namespace).max(at);
            let settled = self.settled.entry(key).or_insert(UnixNanos::MIN);
            *settled = (*settled).max(at);
        }
        let groups = &self.groups;
        self.settled.retain(|key, _| groups.contains_key(key));
        let_go
    }

    /// The latest cut of any timeline: before it, some calls were let go (what is computed per
    /// minute over every timeline is partial there).
    pub fn settled_through(&self) -> UnixNanos {
        self.namespace_cuts.values().copied().max().unwrap_or(UnixNanos::MIN)
    }

    /// The `before` of the last [`HeldTimelines::settle`] (`UnixNanos::MIN`: none yet).
    pub fn last_settle(&self) -> UnixNanos {
        self.last_settle
    }

    /// Where `settle` last cut the timeline of (client id, namespace): anomalies about
    /// attempts that start before this are not the held window's to report.
    pub fn settled_from(&self, client_id: &str, namespace: Option<&str>) -> UnixNanos {
        self.settled.get(&(client_id.to_string(), namespace.map(str::to_string))).copied().unwrap_or(UnixNanos::MIN)
    }

    /// Whether `span`, not held yet, arrived too late for these timelines: what it belongs to
    /// was settled before it came (let go, or judged without it). A span naming a client
    /// starts before that client's timeline's cut in its namespace; one naming none (a hop
    /// joined by trace) starts before the latest cut of its namespace, and the attempt (or
    /// root hop) it would join is not held; and any span that hops a settle let go while they
    /// waited for it would have joined (their parent, or an attempt of their call). Holding it
    /// would not judge it whole: only reading what it belongs to anew from the store does.
    pub fn is_late(&self, span: &Span) -> bool {
        self.settling_to_hold(span).is_some()
    }

    /// For a late span ([`HeldTimelines::is_late`]; none when it is not), how far behind the
    /// newest span the last settle would have had to cut to hold it: as far as it started
    /// before that settle's newest span when hops let go waited for it (they ended before the
    /// cut-off, and it starts before them); when it starts before its timeline's cut, or its
    /// namespace's, that much further than the settle cut. (The live analyzer widens its
    /// settling by it, `held::Settling`.)
    pub fn settling_to_hold(&self, span: &Span) -> Option<UnixNanos> {
        let start = span.start_unix_nano;
        // A span that hops let go without it would have joined (a parent, an attempt of their
        // call): they are gone. (Rare: a hop whose attempt never came, or came that late.)
        if !self.orphans.is_empty()
            && (ids_hash(span.trace_id.as_deref(), span.span_id.as_deref()).into_iter())
                .chain(call_hash(span))
                .any(|hash| self.orphans.contains_key(&hash))
        {
            return Some(self.last_settle_newest.saturating_sub(start).max(0));
        }
        // Most spans start after every cut of their namespace: nothing else is looked up.
        let &in_namespace = self.namespace_cuts.get(&span.call.namespace)?;
        if start >= in_namespace {
            return None;
        }
        let cut = match span.call.client_id.as_deref() {
            Some(client_id) => {
                Some(self.settled_from(client_id, span.call.namespace.as_deref())).filter(|cut| start < *cut)
            }
            None => self.ancestor(span).is_none().then_some(in_namespace),
        }?;
        let settled_behind = self.last_settle_newest.saturating_sub(self.last_settle).max(0);
        Some(settled_behind.saturating_add(cut - start))
    }

    /// Whether a settle let go of hops that waited for a span ([`HeldTimelines::is_late`]).
    pub fn has_orphans(&self) -> bool {
        !self.orphans.is_empty()
    }

    /// Whether `anomaly` was judged with the whole history by the passes before, and is not
    /// to be reported from what is left: it is about attempts before its client's timeline's
    /// cut ([`HeldTimelines::settled_from`]), or it ended before the latest cut of any timeline
    /// of its namespace. The latter covers what other clients' calls tell of it (the nodes
    /// that served while a call was pinned, the clients a window affected): a client that
    /// called no more since keeps its own calls, while the others' of that time were let go.
    /// An anomaly that ended that long ago (the cut-off is the detectors' reach behind the
    /// newest span) is found anew only from telemetry that arrived later than that.
    /// So is one of no client, found from spans or lines, that started before that cut (a
    /// router's window): [`growing`] held every cut at or before the start of any such anomaly
    /// that could still grow, so this one had stopped and was judged whole before the cut let
    /// its first calls go. Found again from what is left (later calls, and log lines, which are
    /// not let go with the spans) it would start later: another anomaly, of the same window.
    pub fn is_settled(&self, anomaly: &Anomaly) -> bool {
        let Some(&in_namespace) = self.namespace_cuts.get(&anomaly.namespace) else { return false };
        // Most anomalies a pass finds start after every cut of their namespace, and so after
        // their own timeline's: that one is looked up (its key built) only when it may tell.
        if anomaly.start_unix_nano >= in_namespace {
            return false;
        }
        match anomaly.client_id.as_deref() {
            _ if anomaly.end_unix_nano < in_namespace => true,
            None => !found_in_metrics(anomaly.kind),
            Some(client_id) => anomaly.start_unix_nano < self.settled_from(client_id, anomaly.namespace.as_deref()),
        }
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

    fn span(&self, key: SpanKey) -> &Span {
        &self.spans[&key].span
    }

    /// Whether `loose` holds exactly the held spans of no call.
    #[cfg(test)]
    fn loose_is_exact(&self) -> bool {
        let loose: BTreeSet<SpanKey> = self
            .spans
            .iter()
            .filter(|(key, held)| {
                let of_a_call = held.joined
                    && (is_client_attempt(&held.span) || self.hops.get(key).is_some_and(|hop| hop.attempt.is_some()));
                !of_a_call
            })
            .map(|(key, _)| *key)
            .collect();
        loose == self.loose
    }

    /// The held copies of the span at `key` (itself among them), in key order.
    fn copies_of(&self, key: SpanKey, identity: u64) -> Keys {
        let Some(keys) = self.copies.get(&identity) else { return Keys::new() };
        // Most spans are sent once: no other span is looked at.
        if keys.as_slice() == [key] {
            return keys.clone();
        }
        let span = self.span(key);
        let same = |other: &Span| {
            other.start_unix_nano == span.start_unix_nano
                && other.trace_id == span.trace_id
                && other.span_id == span.span_id
        };
        keys.iter().copied().filter(|copy| same(self.span(*copy))).collect()
    }

    /// Makes the span at `key` part of the join.
    fn join(&mut self, key: SpanKey) {
        let Some(held) = self.spans.get_mut(&key) else { return };
        held.joined = true;
        let span = &held.span;
        if let Some(ids) = ids_hash(span.trace_id.as_deref(), span.span_id.as_deref()) {
            add_key(&mut self.by_id, ids, key);
        }
        if let Some(trace) = &span.trace_id {
            self.dirty_traces.insert(hash_of(trace));
        }
        if is_client_attempt(span) {
            let (group_key, call_key) = attempt_keys(key, span);
            if let Some(call) = call_hash(span) {
                add_key(&mut self.by_call, call, key);
                self.dirty_calls.insert(call);
            }
            let group = self.groups.entry(group_key).or_insert_with(Group::new);
            group.attempts.insert(key);
            insert_key(&mut group.calls.entry(call_key.clone()).or_default().attempts, key);
            group.dirty.insert(call_key);
            self.loose.remove(&key);
        } else if is_hop(span) {
            if let Some(trace) = &span.trace_id {
                add_key(&mut self.trace_hops, hash_of(trace), key);
            }
            self.hops.insert(key, Hop::default());
            self.unjoined.insert(key);
        }
    }

    /// Takes the span at `key` out of the join (it stays held).
    fn leave(&mut self, key: SpanKey) {
        let Some(held) = self.spans.get_mut(&key) else { return };
        held.joined = false;
        self.loose.insert(key);
        let span = &held.span;
        if let Some(ids) = ids_hash(span.trace_id.as_deref(), span.span_id.as_deref()) {
            remove_key(&mut self.by_id, ids, key);
        }
        if let Some(trace) = &span.trace_id {
            self.dirty_traces.insert(hash_of(trace));
        }
        if is_client_attempt(span) {
            let (group_key, call_key) = attempt_keys(key, span);
            if let Some(call) = call_hash(span) {
                remove_key(&mut self.by_call, call, key);
                self.dirty_calls.insert(call);
            }
            if let Some(group) = self.groups.get_mut(&group_key) {
                group.attempts.remove(&key);
                if let Some(entry) = group.calls.get_mut(&call_key)
                    && let Ok(place) = entry.attempts.binary_search(&key)
                {
                    entry.attempts.remove(place);
                }
                group.dirty.insert(call_key);
            }
            // Its hops join again (they are in its trace, or depend on its call), as hops of no
            // attempt: should it join again before they do (a copy that displaced it let go),
            // they find it anew, and are its hops again.
            for (hop, _) in self.attempt_hops.remove(&key).into_iter().flatten() {
                if let Some(hop) = self.hops.get_mut(&hop) {
                    hop.attempt = None;
                }
                self.loose.insert(hop);
                self.unjoined.insert(hop);
            }
        } else if is_hop(span) {
            if let Some(trace) = &span.trace_id {
                remove_key(&mut self.trace_hops, hash_of(trace), key);
            }
            self.unjoined.remove(&key);
            if let Some(hop) = self.hops.remove(&key) {
                if let Some(call) = hop.depends_on {
                    remove_key(&mut self.call_dependents, call, key);
                }
                if let Some((attempt, _)) = hop.attempt {
                    self.take_hop(attempt, key);
                    self.attempt_changed(attempt);
                }
            }
        }
    }

    /// Marks the call of the attempt at `key` (if still joined) to be built again.
    fn attempt_changed(&mut self, key: SpanKey) {
        let Some(held) = self.spans.get(&key).filter(|held| held.joined && is_client_attempt(&held.span)) else {
            return;
        };
        let (group_key, call_key) = attempt_keys(key, &held.span);
        if let Some(group) = self.groups.get_mut(&group_key) {
            group.dirty.insert(call_key);
        }
    }

    /// Joins the hop at `key` again; when the attempt it joins changed, both attempts' calls
    /// are built again.
    fn rejoin_hop(&mut self, key: SpanKey) {
        let Some(old) = self.hops.get(&key) else { return };
        let (old_attempt, old_depends_on) = (old.attempt, old.depends_on);
        let (attempt, depends_on) = self.find_attempt(key);
        if old_depends_on != depends_on {
            if let Some(call) = old_depends_on {
                remove_key(&mut self.call_dependents, call, key);
            }
            if let Some(call) = depends_on {
                add_key(&mut self.call_dependents, call, key);
            }
        }
        if let Some(hop) = self.hops.get_mut(&key) {
            *hop = Hop { attempt, depends_on };
        }
        if attempt.is_some() {
            self.loose.remove(&key);
        } else {
            self.loose.insert(key);
        }
        if old_attempt == attempt {
            return;
        }
        if let Some((old_attempt, _)) = old_attempt {
            self.take_hop(old_attempt, key);
            self.attempt_changed(old_attempt);
        }
        if let Some((new_attempt, join)) = attempt {
            let hops = self.attempt_hops.entry(new_attempt).or_default();
            match hops.binary_search_by_key(&key, |(hop, _)| *hop) {
                Ok(place) => hops[place].1 = join,
                Err(place) => hops.insert(place, (key, join)),
            }
            self.attempt_changed(new_attempt);
        }
    }

    /// Takes the hop at `hop` from the attempt at `attempt`'s hops.
    fn take_hop(&mut self, attempt: SpanKey, hop: SpanKey) {
        if let Some(hops) = self.attempt_hops.get_mut(&attempt) {
            hops.retain(|(held, _)| *held != hop);
            if hops.is_empty() {
                self.attempt_hops.remove(&attempt);
            }
        }
    }

    /// The attempt the hop at `key` joins (as `timeline::attach_hops` finds it), and the
    /// (client id, call id) whose attempts that depended on.
    fn find_attempt(&self, key: SpanKey) -> (Option<(SpanKey, TimelineJoin)>, Option<u64>) {
        let span = self.span(key);
        if span.trace_id.is_some() && span.span_id.is_some() && span.parent_span_id.is_some() {
            match self.ancestor(span) {
                Some(Ancestor::Attempt(attempt)) => (Some((attempt, TimelineJoin::TraceContext)), None),
                Some(Ancestor::RootHop(root)) => {
                    let root = self.span(root);
                    (self.nearest_attempt_of_call(root).map(|attempt| (attempt, TimelineJoin::CallId)), call_hash(root))
                }
                None => (None, None),
            }
        } else {
            (self.nearest_attempt_of_call(span).map(|attempt| (attempt, TimelineJoin::CallId)), call_hash(span))
        }
    }

    fn ancestor(&self, span: &Span) -> Option<Ancestor> {
        let mut current = span;
        for _ in 0..MAX_PARENT_HOPS {
            let parent_key = self.parent_of(current)?;
            let parent = self.span(parent_key);
            if is_client_attempt(parent) {
                return Some(Ancestor::Attempt(parent_key));
            }
            if parent.parent_span_id.is_none() {
                return is_hop(parent).then_some(Ancestor::RootHop(parent_key));
            }
            current = parent;
        }
        None
    }

    /// Whether `span` is a hop whose trace names an ancestor that is not held: its parent, or
    /// a parent up its chain of held parents (under the parent limit of [`Self::ancestor`]).
    fn awaits_ancestor(&self, span: &Span) -> bool {
        if !is_hop(span) {
            return false;
        }
        let mut current = span;
        for _ in 0..MAX_PARENT_HOPS {
            if current.trace_id.is_none() || current.parent_span_id.is_none() {
                return false;
            }
            let Some(parent) = self.parent_of(current).map(|key| self.span(key)) else { return true };
            if is_client_attempt(parent) {
                return false;
            }
            current = parent;
        }
        false
    }

    /// The held span that `span`'s trace and parent ids name (the last of its copies).
    fn parent_of(&self, span: &Span) -> Option<SpanKey> {
        let (trace_id, parent_id) = (span.trace_id.as_deref()?, span.parent_span_id.as_deref()?);
        let candidates = self.by_id.get(&ids_hash(Some(trace_id), Some(parent_id))?)?;
        candidates.iter().rev().copied().find(|candidate| {
            let candidate = self.span(*candidate);
            candidate.trace_id.as_deref() == Some(trace_id) && candidate.span_id.as_deref() == Some(parent_id)
        })
    }

    fn nearest_attempt_of_call(&self, span: &Span) -> Option<SpanKey> {
        let (client_id, call_id) = (span.call.client_id.as_deref()?, span.call.call_id.as_deref()?);
        self.by_call
            .get(&call_hash(span)?)?
            .iter()
            .copied()
            .filter(|candidate| {
                let call = &self.span(*candidate).call;
                call.client_id.as_deref() == Some(client_id)
                    && call.call_id.as_deref() == Some(call_id)
                    && same_attempt_or_unnumbered(call.attempt, span.call.attempt)
            })
            .min_by_key(|candidate| {
                let attempt = self.span(*candidate);
                let distance = distance_to(attempt.start_unix_nano, attempt.end_unix_nano, span.start_unix_nano);
                (attempt.call.attempt != span.call.attempt || span.call.attempt.is_none(), distance)
            })
    }
}

enum Ancestor {
    Attempt(SpanKey),
    RootHop(SpanKey),
}

impl Group {
    fn new() -> Self {
        Self {
            attempts: BTreeSet::new(),
            calls: BTreeMap::new(),
            dirty: BTreeSet::new(),
            timeline: empty_timeline(),
            order: Vec::new(),
            changed_from: UnixNanos::MIN,
            unenriched_from: UnixNanos::MIN,
            verdicts: None,
        }
    }

    /// Builds the dirty calls again, puts them in their places, and the floors. Only the
    /// calls from the first one that changed on are moved (most changes are at the end). Calls
    /// taken out that start before `let_go_before` were let go by a settle: no change to the
    /// later ones ([`HeldTimelines::join_again`]).
    fn rebuild(
        &mut self,
        (client_id, namespace): &GroupKey,
        spans: &BTreeMap<SpanKey, Box<Held>>,
        attempt_hops: &HashMap<SpanKey, SmallVec<[(SpanKey, TimelineJoin); 2]>>,
        horizon: UnixNanos,
        let_go_before: UnixNanos,
    ) {
        let span = |key: &SpanKey| &spans[key].span;
        let mut removed: Vec<usize> = Vec::new();
        let mut built: Vec<((UnixNanos, UnixNanos, CallKey), TimelineCall)> = Vec::new();
        for call_key in std::mem::take(&mut self.dirty) {
            let Some(entry) = self.calls.get_mut(&call_key) else { continue };
            for (start, end) in entry.places.drain(..) {
                if let Ok(index) = self.order.binary_search_by(|(s, e, k)| (*s, *e, k).cmp(&(start, end, &call_key))) {
                    removed.push(index);
                }
            }
            if entry.attempts.is_empty() {
                self.calls.remove(&call_key);
                continue;
            }
            let attempts = &entry.attempts;
            // As `timeline::calls_within`: runs of attempts starting within the horizon of
            // the run's first (keys are in start order).
            let mut runs: Vec<Vec<SpanKey>> = Vec::new();
            for &key in attempts {
                match runs.last_mut() {
                    Some(run) if key.0 <= run[0].0.saturating_add(horizon) => run.push(key),
                    _ => runs.push(vec![key]),
                }
            }
            let mut places = SmallVec::new();
            for mut run in runs {
                run.sort_by_key(|key| (span(key).call.attempt, key.0));
                let attempts: Vec<_> = run
                    .iter()
                    .map(|key| {
                        let hops = attempt_hops.get(key);
                        let joined: Vec<&Span> = hops.into_iter().flatten().map(|(hop, _)| span(hop)).collect();
                        let join =
                            hops.and_then(|hops| hops.first()).map_or(TimelineJoin::ClientOnly, |(_, join)| *join);
                        attempt_of(span(key), &joined, join)
                    })
                    .collect();
                let call = call_of(span(&run[0]), attempts);
                places.push((call.start_unix_nano, call.end_unix_nano));
                built.push(((call.start_unix_nano, call.end_unix_nano, call_key.clone()), call));
            }
            if let Some(entry) = self.calls.get_mut(&call_key) {
                entry.places = places;
            }
        }
        built.sort_by(|(left, _), (right, _)| left.cmp(right));
        removed.sort_unstable();
        // A first attempt of another cluster or system: every call is marked changed, and told
        // what its new cluster's metrics say.
        let first = self.attempts.first().map(span);
        let (cluster, system) =
            (first.and_then(|span| span.resource.cluster.clone()), first.and_then(|span| span.resource.system.clone()));
        let changed = removed
            .iter()
            .map(|index| self.order[*index].0)
            .filter(|start| *start >= let_go_before)
            .chain(built.iter().map(|((start, _, _), _)| *start));
        let changed = if cluster != self.timeline.cluster || system != self.timeline.system {
            UnixNanos::MIN
        } else {
            changed.min().unwrap_or(UnixNanos::MAX)
        };
        self.changed_from = self.changed_from.min(changed);
        self.unenriched_from = self.unenriched_from.min(changed);
        // The calls from the first place that changed are merged with the built ones.
        let first_built =
            built.first().map_or(self.order.len(), |(place, _)| self.order.partition_point(|p| p < place));
        let from = removed.first().copied().unwrap_or(usize::MAX).min(first_built);
        if from < self.order.len() || !built.is_empty() {
            let tail_order = self.order.split_off(from);
            let tail_calls = self.timeline.calls.split_off(from);
            let mut removed = removed.into_iter().peekable();
            let mut kept = tail_order.into_iter().zip(tail_calls).enumerate().filter_map(|(offset, item)| {
                if removed.peek() == Some(&(from + offset)) {
                    removed.next();
                    return None;
                }
                Some(item)
            });
            let mut built = built.into_iter().peekable();
            let mut next_kept = kept.next();
            loop {
                let take_built = match (&next_kept, built.peek()) {
                    (Some((place, _)), Some((built_place, _))) => built_place < place,
                    (None, Some(_)) => true,
                    (_, None) => false,
                };
                let (place, call) = if take_built {
                    built.next().expect("peeked")
                } else {
                    let Some(item) = next_kept.take() else { break };
                    next_kept = kept.next();
                    item
                };
                self.order.push(place);
                self.timeline.calls.push(call);
            }
        }
        self.timeline.client_id.clone_from(client_id);
        self.timeline.namespace.clone_from(namespace);
        (self.timeline.cluster, self.timeline.system) = (cluster, system);
        let call_floors = floors(&self.timeline.calls);
        for (call, floor) in self.timeline.calls.iter_mut().zip(call_floors) {
            call.floor = floor.highest().map(|contribution| contribution.state);
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

#[cfg(test)]
mod tests {
    use lagscope_model::{CallFields, Op, Outcome, ResourceFields, SpanKind, StateFields};

    use super::*;
    use crate::build_timelines;

    /// A deterministic stream of numbers.
    struct Numbers(u64);

    impl Numbers {
        fn below(&mut self, bound: u64) -> u64 {
            self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 33) % bound.max(1)
        }

        fn chance(&mut self, percent: u64) -> bool {
            self.below(100) < percent
        }
    }

    fn span(kind: SpanKind, component: Component, start: UnixNanos) -> Span {
        Span {
            trace_id: None,
            span_id: None,
            parent_span_id: None,
            name: "op".to_string(),
            kind,
            start_unix_nano: start,
            end_unix_nano: start + 5,
            status_code: 0,
            status_message: None,
            resource: ResourceFields { component: Some(component), ..ResourceFields::default() },
            scope_name: None,
            scope_version: None,
            scope_attributes: Default::default(),
            call: CallFields::default(),
            attributes: Default::default(),
            events: Vec::new(),
            links: Vec::new(),
        }
    }

    /// The spans of one call's attempt: the client's, and maybe a router's and a server's
    /// under it, with or without trace context, some of them under a router that started a
    /// trace of its own; states that raise and break floors.
    fn call_spans(numbers: &mut Numbers, next_id: &mut u64, now: UnixNanos) -> Vec<Span> {
        let mut id = || {
            *next_id += 1;
            format!("{:016x}", *next_id)
        };
        let client = format!("client-{}", numbers.below(3));
        let call_id = (!numbers.chance(10)).then(|| format!("call-{}", numbers.below(12)));
        let attempt = (!numbers.chance(15)).then(|| numbers.below(3) as i64);
        let start = now + numbers.below(40) as i64 - 10;
        let op = if numbers.chance(40) { Op::Write } else { Op::Read };
        let state = |numbers: &mut Numbers| numbers.chance(80).then(|| numbers.below(50) as i64);
        let call = CallFields {
            client_id: Some(client),
            call_id,
            attempt,
            namespace: Some(format!("ns{}", numbers.below(2))),
            op: Some(op),
            state: StateFields { carried: state(numbers), returned: state(numbers), ..StateFields::default() },
            ..CallFields::default()
        };
        let traced = numbers.chance(80);
        let trace = format!("{:032x}", numbers.below(1 << 40));
        let mut attempt_span = span(SpanKind::Client, Component::Client, start);
        attempt_span.end_unix_nano = start + 3 + numbers.below(30) as i64;
        attempt_span.resource.cluster = Some(format!("cluster-{}", numbers.below(2)));
        attempt_span.resource.system = Some("hdfs".to_string());
        attempt_span.call = call.clone();
        if numbers.chance(10) {
            attempt_span.call.outcome = Some(Outcome::Rejected);
        }
        if traced {
            attempt_span.trace_id = Some(trace.clone());
            attempt_span.span_id = Some(id());
        }
        let mut spans = vec![attempt_span.clone()];
        let hop_call = CallFields {
            state: StateFields {
                carried: state(numbers),
                served: state(numbers),
                returned: state(numbers),
                ..StateFields::default()
            },
            ..call
        };
        let mut parent = attempt_span.span_id.clone();
        // A router that received no context starts a trace of its own.
        let root_router = numbers.chance(10);
        for component in [Component::Router, Component::Server] {
            if numbers.chance(25) {
                continue;
            }
            let mut hop = span(SpanKind::Server, component.clone(), start + numbers.below(6) as i64);
            hop.resource.node_id = Some(format!("node-{}", numbers.below(3)));
            hop.call = hop_call.clone();
            if numbers.chance(10) {
                hop.call.outcome = Some(Outcome::Error);
            }
            if traced || root_router {
                hop.trace_id = Some(if root_router { format!("{trace}-root") } else { trace.clone() });
                hop.span_id = Some(id());
                hop.parent_span_id = if root_router && component == Component::Router {
                    None
                } else if numbers.chance(5) {
                    Some(id()) // a parent lost on the way
                } else {
                    parent.clone()
                };
                parent = hop.span_id.clone();
            }
            spans.push(hop);
        }
        spans
    }

    /// A sample of a node's applied or committed state, or of its role, at about `now`.
    fn node_sample(numbers: &mut Numbers, now: UnixNanos) -> lagscope_model::Sample {
        use lagscope_model::conventions::{
            CLUSTER, METRIC_APPLIED_STATE, METRIC_COMMITTED_STATE, METRIC_ROLE, NAMESPACE, NODE_ID, NODE_ROLE,
        };
        let (node, cluster, namespace) = (
            format!("node-{}", numbers.below(3)),
            format!("cluster-{}", numbers.below(2)),
            format!("ns{}", numbers.below(2)),
        );
        let mut labels = vec![(NODE_ID.to_string(), node), (CLUSTER.to_string(), cluster)];
        if numbers.chance(70) {
            labels.push((NAMESPACE.to_string(), namespace));
        }
        let name = match numbers.below(3) {
            0 => METRIC_APPLIED_STATE,
            1 => {
                labels.push((NODE_ROLE.to_string(), ["active", "observer"][numbers.below(2) as usize].to_string()));
                METRIC_ROLE
            }
            _ => METRIC_COMMITTED_STATE,
        };
        lagscope_model::Sample {
            series: std::sync::Arc::new(lagscope_model::SeriesKey {
                name: name.to_string(),
                labels: labels.into_iter().collect(),
            }),
            meta: std::sync::Arc::new(lagscope_model::SeriesMeta {
                kind: lagscope_model::MetricKind::Gauge,
                unit: None,
                description: None,
            }),
            time_unix_nano: now + numbers.below(40) as i64 - 10,
            start_time_unix_nano: None,
            value: lagscope_model::PointValue::Number(numbers.below(50) as f64),
        }
    }

    /// Random rounds of spans added (new ones, copies sent again, a span's ids at another
    /// start), the oldest let go and spans removed anywhere: after every refresh the held
    /// timelines are exactly those built from scratch.
    #[test]
    fn settling_keeps_the_call_that_set_the_floor() {
        // A write returns state 100; for five minutes the client's reads are served at 50 (an
        // observer that stopped applying): each a stale read against that one write. Settled to
        // the last minute, the write stays, and the last read is judged as before.
        const SECOND: i64 = 1_000_000_000;
        let attempt = |at: i64, op: Op, state: StateFields| {
            let mut span = span(SpanKind::Client, Component::Client, at * SECOND);
            span.end_unix_nano = at * SECOND + SECOND / 2;
            span.trace_id = Some(format!("{at:032x}"));
            span.span_id = Some(format!("{at:016x}"));
            span.call = CallFields {
                client_id: Some("client-1".to_string()),
                call_id: Some(format!("call-{at}")),
                attempt: Some(0),
                namespace: Some("ns1".to_string()),
                op: Some(op),
                state,
                outcome: Some(Outcome::Ok),
                ..CallFields::default()
            };
            span
        };
        let mut held = HeldTimelines::new(90 * SECOND);
        held.insert(attempt(0, Op::Write, StateFields { returned: Some(100), ..StateFields::default() }));
        for at in 1..300 {
            held.insert(attempt(
                at,
                Op::Read,
                StateFields { served: Some(50), returned: Some(50), ..StateFields::default() },
            ));
        }
        let read_at = |held: &mut HeldTimelines, at: i64| {
            held.refresh();
            let input = crate::AnalysisInput::from_held_timelines(held.take_timelines(), Vec::new());
            let found = crate::analyze(&input, &crate::AnalyzerConfig::default());
            held.give_back(input.timelines);
            found.into_iter().filter(|anomaly| anomaly.start_unix_nano == at * SECOND).collect::<Vec<_>>()
        };
        let before = read_at(&mut held, 299);
        assert_eq!(before.len(), 1, "{before:?}");
        // Never cut before, the timeline is cut a step past its first call, then a step at a
        // time: four minutes of reads go over twelve settles.
        let mut let_go = 0;
        let mut cuts = Vec::new();
        for _ in 0..14 {
            let step = held.settle(240 * SECOND, |_| i64::MAX);
            assert!(step.len() <= 20, "a step's reads at most: {}", step.len());
            let_go += step.len();
            cuts.push(held.settled_from("client-1", Some("ns1")));
        }
        assert_eq!(cuts[0], SETTLE_STEP);
        assert!(cuts.windows(2).all(|pair| pair[1] - pair[0] <= SETTLE_STEP), "{cuts:?}");
        assert_eq!(cuts.last(), Some(&(240 * SECOND)));
        assert!(let_go > 200, "the settled reads go: {let_go}");
        assert!(held.spans().any(|span| span.start_unix_nano == 0), "the write that set the floor stays");
        assert_eq!(read_at(&mut held, 299), before);

        // Five more minutes of reads, settled as late as they allow at once (as when an
        // anomaly that held the cut ends): the cut moves on a step at a time, and the last
        // read is judged as before.
        for at in 300..600 {
            held.insert(attempt(
                at,
                Op::Read,
                StateFields { served: Some(50), returned: Some(50), ..StateFields::default() },
            ));
        }
        let last = read_at(&mut held, 599);
        assert_eq!(last.len(), 1, "{last:?}");
        let mut cuts = Vec::new();
        for _ in 0..20 {
            let let_go = held.settle(590 * SECOND, |_| i64::MAX);
            assert!(let_go.len() <= 20, "a step's reads at most: {}", let_go.len());
            cuts.push(held.settled_from("client-1", Some("ns1")));
        }
        assert_eq!(cuts[0], 240 * SECOND + SETTLE_STEP);
        assert!(cuts.windows(2).all(|pair| pair[1] - pair[0] <= SETTLE_STEP), "{cuts:?}");
        assert_eq!(cuts.last(), Some(&(590 * SECOND)));
        assert!(held.spans().any(|span| span.start_unix_nano == 0), "the write that set the floor stays");
        assert_eq!(read_at(&mut held, 599), last);
    }

    /// What arrives after a settle is late when what it belongs to was let go or judged:
    /// a span naming a client before that client's cut, a hop naming none whose attempt is
    /// no longer held and that starts before its namespace's latest cut. Nothing is late
    /// before any settle, after the cut, or in a namespace never cut.
    #[test]
    fn spans_for_what_a_settle_let_go_are_late() {
        const SECOND: i64 = 1_000_000_000;
        let attempt = |client: &str, namespace: &str, at: i64| {
            let mut span = span(SpanKind::Client, Component::Client, at * SECOND);
            span.end_unix_nano = at * SECOND + SECOND / 2;
            span.trace_id = Some(format!("{client}-{namespace}-{at}"));
            span.span_id = Some(format!("{at:016x}"));
            span.call = CallFields {
                client_id: Some(client.to_string()),
                call_id: Some(format!("call-{at}")),
                attempt: Some(0),
                namespace: Some(namespace.to_string()),
                op: Some(Op::Read),
                state: StateFields { carried: Some(10), ..StateFields::default() },
                outcome: Some(Outcome::Ok),
                ..CallFields::default()
            };
            span
        };
        // A server's hop under an attempt: it names no client, only the namespace.
        let hop = |attempt: &Span| {
            let mut hop = span(SpanKind::Server, Component::Server, attempt.start_unix_nano + SECOND / 10);
            hop.trace_id = attempt.trace_id.clone();
            hop.span_id = Some("ffffffffffffffff".to_string());
            hop.parent_span_id = attempt.span_id.clone();
            hop.call.namespace = attempt.call.namespace.clone();
            hop.call.state.served = Some(5);
            hop
        };
        let mut held = HeldTimelines::new(90 * SECOND);
        for at in 0..60 {
            held.insert(attempt("client-1", "ns1", at));
            held.insert(attempt("client-2", "ns1", at));
        }
        held.insert(attempt("client-1", "ns2", 1));
        // A server's hop under a router's that has not come: it waits, joined to nothing.
        let waiting_for = |attempt: &Span| {
            let mut router = span(SpanKind::Server, Component::Router, attempt.start_unix_nano + SECOND / 20);
            router.trace_id = attempt.trace_id.clone();
            router.span_id = Some("eeeeeeeeeeeeeeee".to_string());
            router.parent_span_id = attempt.span_id.clone();
            router.call = attempt.call.clone();
            let mut server = hop(attempt);
            server.parent_span_id = router.span_id.clone();
            (router, server)
        };
        let (router, server) = waiting_for(&attempt("client-1", "ns1", 45));
        let server_end = server.end_unix_nano;
        held.insert(server);
        assert!(!held.is_late(&attempt("client-1", "ns1", 5)), "nothing is late before a settle");
        assert!(!held.is_late(&hop(&attempt("client-1", "ns1", 5))));
        assert!(!held.is_late(&router));
        held.settle(50 * SECOND, |_| i64::MAX);
        let cut = held.settled_from("client-1", Some("ns1"));
        assert_eq!(cut, SETTLE_STEP, "cut a step past the first call");
        let cut_at = cut / SECOND;
        // The client's own spans, and a hop naming it, by its cut.
        assert!(held.is_late(&attempt("client-1", "ns1", cut_at - 2)));
        // (The settle cut 9 s behind the newest span, 59 s; this starts 2 s before the cut.)
        let to_hold = held.settling_to_hold(&attempt("client-1", "ns1", cut_at - 2));
        assert_eq!(to_hold, Some(9 * SECOND + 2 * SECOND), "before the cut");
        assert!(!held.is_late(&attempt("client-1", "ns1", cut_at + 2)));
        assert_eq!(held.settling_to_hold(&attempt("client-1", "ns1", cut_at + 2)), None);
        let mut named = hop(&attempt("client-1", "ns1", cut_at - 2));
        named.call.client_id = Some("client-1".to_string());
        assert!(held.is_late(&named));
        // A hop naming no client: its attempt let go, or held.
        assert!(held.is_late(&hop(&attempt("client-1", "ns1", cut_at - 2))));
        let to_hold = held.settling_to_hold(&hop(&attempt("client-1", "ns1", cut_at - 2)));
        assert_eq!(to_hold, Some(9 * SECOND + 2 * SECOND - SECOND / 10), "before the namespace's cut");
        assert!(!held.is_late(&hop(&attempt("client-1", "ns1", cut_at + 2))));
        assert!(
            !held.spans().any(|span| span.start_unix_nano == (cut_at - 2) * SECOND),
            "the attempt of the late hop was let go"
        );
        // The router's hop the server's waits for, after its attempt's cut: the server's,
        // ended before the settle's cut-off, is held, waiting for it (the clients of its
        // namespace send their attempts): the router's is not late.
        assert!(held.spans().any(|span| span.parent_span_id == router.span_id), "the waiting hop is held");
        assert!(!held.is_late(&router));
        // Still not there a horizon after the hop ended: the hop goes, and the router's is late,
        // another router's of the attempt is not.
        held.settle(server_end + 90 * SECOND, |_| i64::MAX);
        assert!(held.spans().any(|span| span.parent_span_id == router.span_id), "held through the horizon");
        held.settle(server_end + 90 * SECOND + 1, |_| i64::MAX);
        assert!(!held.spans().any(|span| span.parent_span_id == router.span_id), "the waiting hop was let go");
        // (Late by its timeline's cut, now past it: what the hop would have joined is not
        // remembered past the horizon, after which an attempt begins another call.)
        let cut = held.settled_from("client-1", Some("ns1"));
        assert!(router.start_unix_nano < cut);
        assert_eq!(held.settling_to_hold(&router), Some(cut - router.start_unix_nano));
        // Where no client of the namespace sends its attempts, such a hop goes at the cut-off:
        // the router's it waited for is late (nothing was cut there: by the hop let go),
        // another router's of the attempt is not.
        let (unsent_router, unsent) = waiting_for(&attempt("client-9", "ns9", 200));
        held.insert(unsent.clone());
        held.settle(unsent.end_unix_nano + 1, |_| i64::MAX);
        assert!(!held.spans().any(|span| span == &unsent), "no client sends there: let go");
        assert!(held.is_late(&unsent_router));
        let mut other = unsent_router.clone();
        other.span_id = Some("dddddddddddddddd".to_string());
        other.call.call_id = Some("call-other".to_string());
        assert!(!held.is_late(&other));
        // A client with no timeline there yet, and a namespace never cut (one call: nothing
        // before it to let go).
        assert!(!held.is_late(&attempt("client-3", "ns1", cut_at - 2)));
        assert!(!held.is_late(&attempt("client-1", "ns2", 0)));
        assert!(!held.is_late(&hop(&attempt("client-1", "ns2", 0))));
    }

    /// Past [`MAX_WAITING_HOPS`] hops waiting for an ancestor, the oldest go, and what they
    /// waited for is late; the newest wait, and what they wait for is not.
    #[test]
    fn hops_waiting_for_their_ancestors_are_bounded() {
        const SECOND: i64 = 1_000_000_000;
        let mut held = HeldTimelines::new(90 * SECOND);
        // A client that sends its attempts in the namespace.
        let mut attempt = span(SpanKind::Client, Component::Client, 0);
        (attempt.trace_id, attempt.span_id) = (Some("client-trace".to_string()), Some("a".to_string()));
        attempt.call = CallFields {
            client_id: Some("client-1".to_string()),
            call_id: Some("call-1".to_string()),
            namespace: Some("ns1".to_string()),
            op: Some(Op::Read),
            ..CallFields::default()
        };
        held.insert(attempt);
        // A server's span under a router's hop (`r`) of its own trace, not come.
        let hop = |component: Component, index: usize, id: &str, parent: &str| {
            let mut hop = span(SpanKind::Server, component, SECOND + index as i64);
            (hop.trace_id, hop.span_id) = (Some(format!("trace-{index}")), Some(id.to_string()));
            hop.parent_span_id = Some(parent.to_string());
            hop.call.namespace = Some("ns1".to_string());
            hop
        };
        let extra = 10;
        for index in 0..MAX_WAITING_HOPS + extra {
            held.insert(hop(Component::Server, index, "s", "r"));
        }
        held.settle(20 * SECOND, |_| i64::MAX);
        let waiting: Vec<usize> =
            held.spans().filter_map(|span| span.trace_id.as_deref()?.strip_prefix("trace-")?.parse().ok()).collect();
        assert_eq!(waiting, (extra..MAX_WAITING_HOPS + extra).collect::<Vec<_>>(), "the newest wait");
        assert!(held.is_late(&hop(Component::Router, extra - 1, "r", "x")), "its hop let go");
        assert!(!held.is_late(&hop(Component::Router, extra, "r", "x")), "its hop waits");
    }

    #[test]
    fn a_timeline_whose_cluster_changes_is_told_again_whole() {
        // Call c1's attempts are numbered out of time order: the call starts at its attempt 0
        // (50), after c2 (10). The timeline's cluster is its first attempt's (5, in a); that
        // one let go, it is c2's (b), and every call's committed state is b's.
        let attempt = |at: i64, call: &str, number: i64, cluster: &str| {
            let mut span = span(SpanKind::Client, Component::Client, at);
            span.resource.cluster = Some(cluster.to_string());
            span.call = CallFields {
                client_id: Some("client-1".to_string()),
                call_id: Some(call.to_string()),
                attempt: Some(number),
                namespace: Some("ns1".to_string()),
                op: Some(Op::Read),
                outcome: Some(Outcome::Ok),
                ..CallFields::default()
            };
            span
        };
        let committed = |cluster: &str, value: f64| {
            use lagscope_model::conventions::{CLUSTER, METRIC_COMMITTED_STATE, NAMESPACE, NODE_ID};
            let labels = [(CLUSTER, cluster), (NAMESPACE, "ns1"), (NODE_ID, "nn-1")];
            lagscope_model::Sample {
                series: std::sync::Arc::new(lagscope_model::SeriesKey {
                    name: METRIC_COMMITTED_STATE.to_string(),
                    labels: labels.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect(),
                }),
                meta: std::sync::Arc::new(lagscope_model::SeriesMeta {
                    kind: lagscope_model::MetricKind::Gauge,
                    unit: None,
                    description: None,
                }),
                time_unix_nano: 0,
                start_time_unix_nano: None,
                value: lagscope_model::PointValue::Number(value),
            }
        };
        let samples = vec![committed("a", 100.0), committed("b", 200.0)];
        let mut held = HeldTimelines::new(1_000);
        let first = held.insert(attempt(5, "c1", 1, "a"));
        held.insert(attempt(50, "c1", 0, "a"));
        held.insert(attempt(10, "c2", 0, "b"));
        held.refresh();
        let input = crate::AnalysisInput::from_held(&mut held, samples.clone());
        assert_eq!(input.timelines[0].cluster.as_deref(), Some("a"));
        held.give_back(input.timelines);
        held.remove(first);
        held.refresh();
        let input = crate::AnalysisInput::from_held(&mut held, samples.clone());
        let spans: Vec<Span> = held.spans().cloned().collect();
        let mut expected = build_timelines(&spans, 1_000);
        crate::enrich(&mut expected, &samples);
        assert_eq!(expected[0].cluster.as_deref(), Some("b"));
        assert_eq!(input.timelines, expected);
    }

    #[test]
    fn an_attempt_that_leaves_and_joins_again_before_a_refresh_keeps_its_hops() {
        // A copy of an attempt read with an earlier order than the attempt (a store's ids read
        // late) displaces it from the join; the copy let go before the next refresh, the
        // attempt joins again, and its router hop with it.
        let mut attempt = span(SpanKind::Client, Component::Client, 10);
        attempt.end_unix_nano = 40;
        attempt.trace_id = Some("t1".to_string());
        attempt.span_id = Some("a1".to_string());
        attempt.call = CallFields {
            client_id: Some("client-1".to_string()),
            call_id: Some("call-1".to_string()),
            attempt: Some(0),
            namespace: Some("ns1".to_string()),
            op: Some(Op::Read),
            outcome: Some(Outcome::Ok),
            ..CallFields::default()
        };
        let mut router = span(SpanKind::Server, Component::Router, 12);
        router.trace_id = Some("t1".to_string());
        router.span_id = Some("r1".to_string());
        router.parent_span_id = Some("a1".to_string());
        router.resource.node_id = Some("router-1".to_string());
        router.call = attempt.call.clone();
        let mut held = HeldTimelines::new(1_000);
        held.insert_at(20, attempt.clone());
        held.insert_at(30, router);
        held.refresh();
        let before = held.take_timelines();
        assert_eq!(before[0].calls[0].attempts[0].router_node.as_deref(), Some("router-1"));
        held.give_back(before.clone());
        held.insert_at(5, attempt);
        held.remove((10, 5));
        held.refresh();
        let spans: Vec<Span> = held.spans().cloned().collect();
        assert_eq!(held.take_timelines(), build_timelines(&spans, 1_000));
        assert_eq!(build_timelines(&spans, 1_000), before);
    }

    #[test]
    fn held_timelines_are_what_the_join_builds_from_scratch() {
        let config = crate::AnalyzerConfig::default();
        let (mut kept, mut settled_out) = (0, 0);
        let mut found_of_kinds = [
            (lagscope_model::AnomalyKind::StaleRead, 0),
            (lagscope_model::AnomalyKind::CarriedStateRegression, 0),
            (lagscope_model::AnomalyKind::RouterStateDropped, 0),
        ];
        for seed in 0..60 {
            let mut numbers = Numbers(seed * 7_919 + 1);
            // (Apart: the spans made are those of the test before verdicts were kept.)
            let mut verdict_numbers = Numbers(seed + 17);
            let mut samples: Vec<lagscope_model::Sample> = Vec::new();
            let horizon = [1_000, 30][numbers.below(2) as usize];
            let mut held = HeldTimelines::new(horizon);
            let by_order = seed % 2 == 1;
            let (mut next_id, mut sent): (u64, Vec<Span>) = (0, Vec::new());
            let mut keys: Vec<SpanKey> = Vec::new();
            for round in 0..30 {
                let now = round * 20;
                for _ in 0..numbers.below(6) {
                    let mut spans = call_spans(&mut numbers, &mut next_id, now);
                    if !sent.is_empty() && numbers.chance(20) {
                        let mut again = sent[numbers.below(sent.len() as u64) as usize].clone();
                        if numbers.chance(30) {
                            // The same ids at another start: another span.
                            again.start_unix_nano += 1 + numbers.below(5) as i64;
                        }
                        spans.push(again);
                    }
                    // Hops often arrive before their attempt.
                    if numbers.chance(50) {
                        spans.reverse();
                    }
                    sent.extend(spans.iter().cloned());
                    for span in spans {
                        if by_order {
                            // Orders out of arrival order (a store's ids, read late).
                            let order = numbers.below(1 << 20);
                            keys.push((span.start_unix_nano, order));
                            held.insert_at(order, span);
                        } else {
                            keys.push(held.insert(span));
                        }
                    }
                }
                if numbers.chance(30) && !keys.is_empty() {
                    let key = keys.swap_remove(numbers.below(keys.len() as u64) as usize);
                    held.remove(key);
                }
                let limit = 40 + numbers.below(40) as usize;
                held.keep_newest(limit, numbers.chance(10).then_some(now - 100));
                if numbers.chance(15) {
                    // Settling lets spans go as removing them does.
                    let before = now - numbers.below(80) as i64;
                    let let_go = held.settle(before, |_| i64::MAX);
                    assert!(let_go.iter().all(|(key, _)| !held.contains(*key)), "seed {seed}, round {round}");
                }
                keys.retain(|key| held.contains(*key));
                assert!(held.loose_is_exact(), "seed {seed}, round {round}");
                // The metrics of the nodes move too (apart: the spans made are those of the
                // test before they were told).
                samples.retain(|sample| sample.time_unix_nano >= now - 60);
                for _ in 0..verdict_numbers.below(8) {
                    samples.push(node_sample(&mut verdict_numbers, now));
                }
                samples.sort_by_key(|sample| sample.time_unix_nano);
                held.refresh();
                assert!(held.loose_is_exact(), "seed {seed}, round {round}");
                let spans: Vec<Span> = held.spans().cloned().collect();
                let mut expected = build_timelines(&spans, horizon);
                crate::enrich(&mut expected, &samples);
                // Told what the metrics said where that may have changed: as told all of it.
                let mut input = crate::AnalysisInput::from_held(&mut held, samples.clone());
                assert_eq!(input.timelines, expected, "seed {seed}, round {round}");
                // The verdicts kept about the calls that did not change, and the calls that
                // did judged again: what judging every call finds.
                input.verdicts = held.take_verdicts();
                kept += input
                    .verdicts
                    .iter()
                    .map(|verdicts| {
                        verdicts.found.iter().filter(|(_, start, _)| *start < verdicts.unchanged_before).count()
                    })
                    .sum::<usize>();
                let found = crate::analyze_held_kinds(&mut input, &config, |_| true);
                let all = crate::analyze(&input, &config);
                // Of the calls before a timeline's cut, the verdicts keep nothing (they are
                // reported no more); of the later ones, what was found with the whole history
                // is what judging what is left finds.
                let reported = |anomaly: &&Anomaly| {
                    anomaly.client_id.as_deref().is_none_or(|client_id| {
                        anomaly.start_unix_nano >= held.settled_from(client_id, anomaly.namespace.as_deref())
                    })
                };
                settled_out += all.iter().filter(|anomaly| !reported(anomaly)).count();
                assert_eq!(
                    found.iter().map(|anomaly| &**anomaly).filter(reported).collect::<Vec<_>>(),
                    all.iter().filter(reported).collect::<Vec<_>>(),
                    "seed {seed}, round {round}"
                );
                for (kind, count) in &mut found_of_kinds {
                    *count += all.iter().filter(|anomaly| anomaly.kind == *kind).count();
                }
                let (timelines, verdicts) = (input.timelines, input.verdicts);
                if numbers.chance(90) {
                    held.give_back(timelines);
                }
                if verdict_numbers.chance(90) {
                    held.give_back_verdicts(verdicts);
                }
            }
        }
        // Each kind judged from verdicts was found, and often; many were kept from a pass before.
        for (kind, count) in found_of_kinds {
            assert!(count > 100, "{kind:?}: {count}");
        }
        assert!(kept > 1_000, "{kept} kept");
        assert!(settled_out > 100, "{settled_out} about calls before a cut");
    }
}
