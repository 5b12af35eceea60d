//! The streaming engine: spans and samples in (in roughly the order they ended), anomalies
//! out, with memory bounded by what is in flight, per-client and per-namespace state, and a
//! retention window, never by the length of the history.
//!
//! - Join: router and server spans wait in `traces` (grouped by trace id). A client attempt
//!   is joined to its descendants once the watermark (the latest end time seen) is
//!   `lateness` past its end, and kept compact from then on. Spans without trace
//!   context wait by (client, call id) and join when their call is final. Whatever never
//!   joins is dropped a horizon after it ended.
//! - Calls: final once the watermark is `horizon` past their start (the horizon must cover the
//!   longest attempt plus the lateness), then processed in start order across all clients:
//!   the order of the batch analyzer's timelines.
//! - Clients and namespaces: per (client, namespace) the session floors and the running state
//!   of the per-client detectors; per namespace the committed states reported (a staircase),
//!   who answered and who was active, kept for `retention`.
//!
//! The anomalies are built by the batch detectors' own constructors; a streamed and a batch
//! analysis of the same telemetry agree (tested on every simulator scenario and golden case).
//!
//! This file holds the engine's state, the spans fed to it and `advance`; `inputs.rs` the log
//! lines and metric samples fed to it, `calls.rs` the calls and the join, `process.rs` a final
//! call through the detectors, `raise.rs` the anomalies built from compact data, `switches.rs`
//! the logged switch lines.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::rc::Rc;

use lagscope_model::conventions::{
    CLUSTER, METRIC_COMMITTED_STATE, METRIC_PROBE_UP, METRIC_ROLE, NAMESPACE, NODE_ID, NODE_ROLE,
};
use lagscope_model::{Anomaly, AnomalyKind, ClientTimeline, PointValue, Sample, StateId, TimelineJoin, UnixNanos};
use rustc_hash::{FxHashMap, FxHashSet};
use smallvec::SmallVec;
use std::collections::hash_map::Entry;

use super::client::{AttemptAt, ClientState, Contribution, FailingRun, Rejection, UntrustedRun};
use super::codec::{SampleRec, SeriesDef};
use super::compact::{Attempt, Call, CallIn, ClientRec, build_attempt};
use super::intern::{Interner, Sym, known};
use super::metrics::Metrics;
use super::namespace::{Committed, Fact, MAX_FORWARDED, NamespaceState};
use super::queue::{Places, TimeQueue, Timed};
use super::record::{CallId, HopRec, SpanKey, SpanRec};
use crate::AnalyzerConfig;
use crate::detectors::view::CallView;
use crate::detectors::{
    blind_failover_probe, carried_state_regression, failover_flapping, follower_read_disabled, no_namenodes_window,
    pinned_retry, router_state_dropped, stale_read, stale_read_cross_client, untrusted_state,
};
use crate::floor::{CallFloors, FloorSource};
use crate::timeline::{distance_to, same_attempt_or_unnumbered};

mod calls;
mod inputs;
mod process;
mod raise;
mod switches;

use calls::{TracedHops, call_key};
use process::{Deferred, Facts, PendingPinned, record_facts};
use raise::{Raise, build_anomalies, identity};
use switches::{SwitchLine, verdicts_of};
#[cfg(test)]
mod tests;

/// Attempts joined, and calls finalized, per batch in `advance` (see [`Engine::warm_joins`]).
const BATCH: usize = 64;

/// How far down a trace the join looks for router and server spans (as the batch join).
const MAX_PARENT_HOPS: usize = 32;

/// The router and server spans joined to one attempt: a router and a server in the common
/// case, kept inline (one allocation fewer per attempt).
type Hops = SmallVec<[HopRec; 2]>;

/// Detectors that read metrics only (`metrics.rs`).
const METRIC_KINDS: &[AnomalyKind] =
    &[AnomalyKind::ApplyLag, AnomalyKind::RequeueStorm, AnomalyKind::ShardPressure, AnomalyKind::UnfairRejection];

/// What the engine did, for progress output and benchmarks.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EngineStats {
    pub spans: u64,
    pub samples: u64,
    pub calls: u64,
    /// Client attempts that arrived after their call had been processed (later than the
    /// horizon); each was analyzed as a call of its own.
    pub late_attempts: u64,
    /// Router/server spans that never found their client attempt.
    pub unjoined_hops: u64,
    /// Spans waiting to be joined, and calls waiting to be final, at their most.
    pub peak_pending_spans: usize,
    pub peak_open_calls: usize,
    /// Clients (per namespace) seen, held at the most at one time, and finished early because
    /// they were idle longer than the retention.
    pub clients: usize,
    pub peak_clients: usize,
    pub evicted_clients: usize,
    /// The longest call processed (first attempt's start to last attempt's end), against
    /// which to size the horizon.
    pub longest_call_nanos: i64,
    /// Metric samples waiting (for the lateness) to be processed in time order, at most.
    pub peak_waiting_samples: usize,
    /// Recognised log lines taken, and those that arrived later than the horizon (analyzed
    /// out of time order).
    pub log_events: u64,
    pub late_log_events: u64,
    /// Spans and recognised log lines that came again (a span with the trace and span ids of
    /// one already held, a log line identical to one taken, time and all): an exporter
    /// retrying a request that had been received (OTLP delivery is at least once). Each was
    /// taken once.
    pub duplicates: u64,
}

/// A client attempt in an open call: as it arrived (packed, without its call id, which its
/// call keeps), or joined and compact, or, when its client's hops also join by call id (they
/// received no trace context), with the hops its trace gave it, waiting for its call's.
#[derive(Debug)]
enum Slot {
    Raw(ClientRec),
    Joined(Attempt),
    Waiting(Box<(ClientRec, Hops)>),
}

impl Slot {
    /// Its span's ids and start: what tells it from every other ([`Engine::holds`]).
    fn identity(&self) -> (SpanKey, UnixNanos) {
        match self {
            Slot::Raw(span) => (span.id, span.start),
            Slot::Joined(attempt) => (attempt.client_span.id, attempt.start),
            Slot::Waiting(waiting) => (waiting.0.id, waiting.0.start),
        }
    }

    fn order(&self) -> (Option<i64>, UnixNanos) {
        let (attempt, start, _) = self.placed();
        (attempt, start)
    }

    /// Its attempt number, start and end: where a hop joining by call id finds it.
    fn placed(&self) -> (Option<i64>, UnixNanos, UnixNanos) {
        match self {
            Slot::Raw(span) => (span.attempt(), span.start, span.end),
            Slot::Joined(attempt) => (attempt.attempt(), attempt.start, attempt.end),
            Slot::Waiting(waiting) => (waiting.0.attempt(), waiting.0.start, waiting.0.end),
        }
    }
}

/// What an attempt not yet joined gathers at its call's end: its hops, how they were joined,
/// and the traces of those that started their own (span id, trace id).
struct Gathered {
    hops: Hops,
    join: TimelineJoin,
    traces: Vec<(u64, u128)>,
}

impl Gathered {
    /// The hops its trace gave it, before any joins by call id.
    fn traced(hops: Hops) -> Self {
        Self { join: traced_join(&hops), hops, traces: Vec::new() }
    }
}

/// How an attempt's traced hops joined it: through the trace, or not at all (yet).
fn traced_join(hops: &Hops) -> TimelineJoin {
    if hops.is_empty() { TimelineJoin::ClientOnly } else { TimelineJoin::TraceContext }
}

/// A call still gathering attempts.
#[derive(Debug)]
struct OpenCall {
    client: Sym,
    namespace: Sym,
    /// The hash of its client, namespace and call id, its key in `open_index` (none without a
    /// call id).
    index_key: Option<u64>,
    /// Whether another open call held that key when it opened: then it is listed in
    /// `open_collisions` instead.
    collided: bool,
    /// Its op and method: those of the attempt that names it, the first in (attempt number,
    /// start) order so far (as the batch analysis names a call), whichever arrived first.
    op: Sym,
    rpc_method: Sym,
    named_by: (Option<i64>, UnixNanos),
    /// Its earliest attempt's start (the first to arrive, or an earlier one after it; the
    /// call's turn in `queue`): attempts of its call id that start more than a horizon
    /// later, and hops of its id that do, are another call's (a restarted client counts its
    /// calls again), as `build_timelines` has it.
    start: UnixNanos,
    /// Its attempts' places in [`Engine::held`], in arrival order.
    held: SmallVec<[u64; 2]>,
}

/// A slot of the open-call slab and its generation (a slot is reused once its call is
/// processed; the generation tells a stale reference from the current call), packed in one
/// word: written as two halves, a reference copied whole right after (as into the queue's
/// `Due`) is a load that no single store forwards to, and it waits for every store before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct CallRef(u64);

impl CallRef {
    fn new(slot: u32, generation: u32) -> Self {
        Self(u64::from(generation) << 32 | u64::from(slot))
    }

    fn slot(self) -> usize {
        (self.0 & u64::from(u32::MAX)) as usize
    }

    fn generation(self) -> u32 {
        (self.0 >> 32) as u32
    }
}

/// Closed calls' entries left in `open_index` before they are swept out, at least (so that a
/// few open calls do not sweep the table at every close).
const MIN_STALE_ENTRIES: usize = 4096;

/// One router answer for a namespace (`no_namenodes_window`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Answer {
    start: UnixNanos,
    order: u64,
    end: UnixNanos,
    no_namenodes: bool,
    client: Sym,
    tried: Sym,
    /// From a log line without trace context.
    logged: bool,
}

/// (cluster, namespace, router).
type RouterKey = (Sym, Sym, Sym);

/// An answer waiting to be fed to its router's window, in start order.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct RouterAnswer(Answer, RouterKey);

impl Timed for RouterAnswer {
    fn time(&self) -> i64 {
        self.0.start
    }
}

/// An open call waiting for the horizon: (first attempt's start, arrival sequence, call).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Due(UnixNanos, u64, CallRef);

impl Timed for Due {
    fn time(&self) -> i64 {
        self.0
    }
}

/// A router's current run of NoNamenodesAvailable answers.
#[derive(Debug, Default)]
struct RouterWindow {
    first_start: UnixNanos,
    last_start: UnixNanos,
    last_end: UnixNanos,
    /// Answers from traced attempts and from log lines, apart (a router may tell of one
    /// answer both ways), and the NameNodes each named.
    attempts: [usize; 2],
    clients: BTreeSet<Sym>,
    tried: [FxHashMap<Sym, usize>; 2],
}

/// (cluster, namespace, node, server.address, probe kind, client id) of a probe series, as
/// strings: verdicts are read in this order, as the batch detector reads its series.
type ProbeKey = (Option<String>, Option<String>, Option<String>, String, String, String);

/// A metric series the engine was told about.
#[derive(Debug)]
struct SeriesInfo {
    /// What the engine does with its samples.
    role: SeriesRole,
    cluster: Sym,
    namespace: Sym,
    node: Sym,
}

#[derive(Debug, Clone, PartialEq)]
enum SeriesRole {
    Ignored,
    Committed,
    Role { active: bool },
    Probe(ProbeKey),
}

/// Which detectors run.
#[derive(Debug, Clone, Copy)]
struct Kinds {
    stale_read: bool,
    carried_state_regression: bool,
    router_state_dropped: bool,
    untrusted_state: bool,
    pinned_retry: bool,
    follower_read_disabled: bool,
    no_namenodes_window: bool,
    blind_failover_probe: bool,
    failover_flapping: bool,
}

/// The streaming analyzer. Feed it spans ([`Engine::push_span`]) and samples
/// ([`Engine::define_series`], [`Engine::push_sample`], or [`Engine::push_model_sample`]),
/// then call [`Engine::finish`].
pub struct Engine<'c> {
    config: &'c AnalyzerConfig,
    kinds: Kinds,
    facts: Facts,
    metric_kinds: Vec<AnomalyKind>,
    pub interner: Interner,
    lateness: i64,
    horizon: i64,
    retention: i64,
    watermark: i64,
    /// When (in data time) the next pass over the queues, and the next pruning, are due.
    next_advance: i64,
    next_prune: i64,
    sequence: u64,
    traces: TracedHops,
    by_call: FxHashMap<Sym, FxHashMap<CallId, Vec<(u128, HopRec)>>>,
    /// Hops without trace context waiting by call id, in arrival order: (end, client, call id).
    /// (Traced hops are dropped from the front of their own queue, [`TracedHops::spans`].)
    waiting: VecDeque<(UnixNanos, Sym, CallId)>,
    /// The first place in `held` not yet looked at by the join (attempts are joined in arrival
    /// order, the lateness after they ended).
    join_next: u64,
    /// Client attempts until their call is processed, in arrival order (see [`Places`]): read
    /// again at the join (in arrival order) and when processed (in start order, close to it).
    held: Places<Slot>,
    /// `advance`'s batches of attempts to join and calls to finalize (kept for their buffers).
    join_batch: Vec<u64>,
    due_batch: Vec<Due>,
    calls: Vec<Option<OpenCall>>,
    /// The call id of each slot's call, kept apart and left in place when the call closes
    /// (it is cloned out): an id cloned over an id is copied straight into place, while one
    /// written into a new `OpenCall` went through the stack and its loads spanned two of the
    /// copy's stores (no store forwards to such a load: it waits for every store before it,
    /// the index entries' misses among them).
    call_ids: Vec<Option<CallId>>,
    generations: Vec<u32>,
    free_slots: Vec<u32>,
    open_calls: usize,
    /// The open calls by the hash of (client, namespace, call id) ([`call_key`]; one word: a
    /// smaller table, copied whole). A closed call's entry is left in
    /// place (removing it would be a cache miss per call: the table is several times the
    /// cache and the entry was last touched a horizon ago) and overwritten or swept out later,
    /// all together in one pass, once there are more of them than half the open calls; an
    /// entry is current while the generation it names is its slot's.
    open_index: FxHashMap<u64, CallRef>,
    /// Closed calls' entries still in `open_index`.
    stale_entries: usize,
    /// Open calls whose key another open call held when they opened (two call ids of one
    /// hash): searched one by one.
    open_collisions: Vec<CallRef>,
    queue: TimeQueue<Due>,
    clients: FxHashMap<(Sym, Sym), ClientState>,
    namespaces: FxHashMap<(Sym, Sym), NamespaceState>,
    answers: TimeQueue<RouterAnswer>,
    windows: BTreeMap<RouterKey, RouterWindow>,
    probes: BTreeMap<ProbeKey, VecDeque<(UnixNanos, f64)>>,
    series: Vec<SeriesInfo>,
    series_ids: FxHashMap<SeriesDef, u32>,
    metrics: Option<Metrics>,
    data_ends: crate::open::DataEnds<Sym>,
    no_namenodes_errors: FxHashMap<Sym, bool>,
    /// Logged switch lines (kept whole: they are rare). Whose they are is decided at the end,
    /// with [`Engine::switch_owners`] for lines that name no client; the clients found
    /// logging are judged by them rather than by their calls' addresses.
    log_switches: Vec<SwitchLine>,
    /// The lines of `log_switches` whose early switch back is still to be judged
    /// ([`Engine::judge_switch_lines`]).
    unjudged_switches: Vec<usize>,
    /// ((cluster, node), client) of the calls to cluster URLs, for the switch lines that name
    /// no client.
    switch_owners: failover_flapping::SwitchOwners<(Sym, Sym), Sym>,
    /// Lines kept to be attached to anomalies as evidence (the most recent
    /// `MAX_EVIDENCE_LINES`), in time order.
    evidence_lines: VecDeque<crate::log_events::LogEvent>,
    /// Clients' "Disable OM follower read" lines: (time, the OM that refused), in time order.
    logged_disables: FxHashMap<Sym, Vec<(UnixNanos, Sym)>>,
    /// The identities of the log lines taken in the last horizon, in arrival order and as a
    /// set: a line met again is a copy ([`EngineStats::duplicates`]).
    recent_lines: VecDeque<(UnixNanos, u64)>,
    recent_line_set: FxHashSet<(UnixNanos, u64)>,
    anomalies: Vec<Anomaly>,
    /// Pinned runs waiting to be judged, in the order found.
    pinned: Vec<PendingPinned>,
    /// Checks put off until the committed states reported by their time are all known, in
    /// the order put off.
    deferred: VecDeque<Deferred>,
    /// Window anomalies [`Engine::drain_found`] met, kept for [`Engine::finish`].
    windows_found: Vec<Anomaly>,
    stats: EngineStats,
}

impl<'c> Engine<'c> {
    /// An engine running the detectors whose kind `wanted` accepts.
    pub fn new(config: &'c AnalyzerConfig, wanted: impl Fn(AnomalyKind) -> bool) -> Self {
        let kinds = Kinds {
            stale_read: wanted(AnomalyKind::StaleRead),
            carried_state_regression: wanted(AnomalyKind::CarriedStateRegression),
            router_state_dropped: wanted(AnomalyKind::RouterStateDropped),
            untrusted_state: wanted(AnomalyKind::UntrustedState),
            pinned_retry: wanted(AnomalyKind::PinnedRetry),
            follower_read_disabled: wanted(AnomalyKind::FollowerReadDisabled),
            no_namenodes_window: wanted(AnomalyKind::NoNamenodesWindow),
            blind_failover_probe: wanted(AnomalyKind::BlindFailoverProbe),
            failover_flapping: wanted(AnomalyKind::FailoverFlapping),
        };
        let seconds = |value: i64| value.max(1).saturating_mul(1_000_000_000);
        let facts = Facts {
            committed: (kinds.stale_read && !config.stale_read.cross_client_bounds_seconds.is_empty())
                || kinds.untrusted_state,
            served: kinds.pinned_retry,
            active: kinds.no_namenodes_window,
        };
        Self {
            config,
            kinds,
            facts,
            metric_kinds: METRIC_KINDS.iter().copied().filter(|kind| wanted(*kind)).collect(),
            metrics: METRIC_KINDS
                .iter()
                .any(|kind| wanted(*kind))
                .then(|| Metrics::new(seconds(config.stream.lateness_seconds))),
            interner: Interner::default(),
            lateness: seconds(config.stream.lateness_seconds),
            horizon: seconds(config.stream.horizon_seconds),
            retention: seconds(config.stream.retention_seconds),
            watermark: i64::MIN,
            next_advance: i64::MIN,
            next_prune: i64::MIN,
            sequence: 0,
            traces: TracedHops::default(),
            by_call: FxHashMap::default(),
            waiting: VecDeque::new(),
            join_next: 0,
            held: Places::default(),
            join_batch: Vec::new(),
            due_batch: Vec::new(),
            calls: Vec::new(),
            call_ids: Vec::new(),
            generations: Vec::new(),
            free_slots: Vec::new(),
            open_calls: 0,
            open_index: FxHashMap::default(),
            stale_entries: 0,
            open_collisions: Vec::new(),
            queue: TimeQueue::default(),
            clients: FxHashMap::default(),
            namespaces: FxHashMap::default(),
            answers: TimeQueue::default(),
            windows: BTreeMap::new(),
            probes: BTreeMap::new(),
            series: Vec::new(),
            series_ids: FxHashMap::default(),
            data_ends: crate::open::DataEnds::default(),
            no_namenodes_errors: FxHashMap::default(),
            log_switches: Vec::new(),
            unjudged_switches: Vec::new(),
            switch_owners: failover_flapping::SwitchOwners::default(),
            logged_disables: FxHashMap::default(),
            evidence_lines: VecDeque::new(),
            recent_lines: VecDeque::new(),
            recent_line_set: FxHashSet::default(),
            anomalies: Vec::new(),
            pinned: Vec::new(),
            deferred: VecDeque::new(),
            windows_found: Vec::new(),
            stats: EngineStats::default(),
        }
    }

    pub fn stats(&self) -> EngineStats {
        EngineStats {
            clients: self.clients.len() + self.stats.evicted_clients,
            peak_waiting_samples: self.metrics.as_ref().map_or(0, |metrics| metrics.held_peak),
            duplicates: self.stats.duplicates + self.traces.duplicates,
            ..self.stats
        }
    }

    /// Takes one span (its symbols from [`Engine::interner`]). By reference: a decoder hands
    /// its spans over where it decoded them (a `SpanRec` is ~270 bytes, and each move of one
    /// is a copy); the engine copies only the client attempts it holds.
    pub fn push_span(&mut self, span: &SpanRec) {
        self.stats.spans += 1;
        if span.end > self.watermark {
            self.watermark = span.end;
        }
        if span.is_client_attempt() {
            self.push_attempt(span);
        } else {
            self.push_hop(span);
        }
        // Every few hundred spans, and whenever the data moved a second on.
        if self.stats.spans.is_multiple_of(256) || self.watermark >= self.next_advance {
            self.next_advance = self.watermark.saturating_add(1_000_000_000);
            self.advance();
        }
    }

    /// Reads, for spans about to be pushed (a decoder's batch), the index entries their
    /// pushes will look up: the open call of each client attempt, the waiting trace of each
    /// hop. Both tables are several times the cache and each key lands at random in them: one
    /// push at a time, every lookup is a miss the processor waits for, while a pass over the
    /// batch lets it wait for many at once (as [`Engine::warm_joins`]). Changes nothing.
    pub fn warm_spans<'s>(&self, spans: impl Iterator<Item = &'s SpanRec>) {
        let mut sum = 0_u64;
        for span in spans {
            if span.is_client_attempt() {
                if let Some(call_id) = span.call_id.as_deref() {
                    let key = call_key(span.client, span.namespace, call_id);
                    sum = sum.wrapping_add(self.open_index.get(&key).map_or(0, |call| call.0));
                }
            } else if span.id.is_some() {
                sum = sum
                    .wrapping_add(self.traces.places.get(&span.id.trace_id()).map_or(0, |places| places.len() as u64));
            }
        }
        std::hint::black_box(sum);
    }

    /// Whether anomalies were found since [`Engine::drain_found`] last ran.
    pub fn has_found(&self) -> bool {
        !self.anomalies.is_empty()
    }

    /// Hands `each` the anomalies found so far that no later data can change, in the order
    /// found, and forgets them: every kind but the windows (whether a window is still open is
    /// decided at the end of the data, and a client's flapping found from its calls may give
    /// way to its switch lines): they wait for [`Engine::finish`]. Callers that write
    /// anomalies as they are found keep memory bounded this way; calling it every few dozen
    /// spans writes each anomaly while its text is still in cache (once per capture block, a
    /// few thousand spans later, it had left it).
    pub fn drain_found<E>(&mut self, mut each: impl FnMut(Anomaly) -> Result<(), E>) -> Result<(), E> {
        for anomaly in self.anomalies.drain(..) {
            // (Flapping is a window too: a client's flapping found from its calls' addresses
            // gives way to the switches it logged, which may come later:
            // `Engine::judge_logged_switches`.)
            if anomaly.kind.is_window() {
                self.windows_found.push(anomaly);
            } else {
                each(anomaly)?;
            }
        }
        Ok(())
    }

    /// Processes everything still open and returns the anomalies, ordered and marked open
    /// or resolved as the batch analyzer does.
    pub fn finish(mut self) -> (Vec<Anomaly>, EngineStats) {
        self.watermark = i64::MAX;
        self.advance();
        self.judge_deferred(i64::MAX);
        self.release_answers(i64::MAX);
        let windows = std::mem::take(&mut self.windows);
        for (key, window) in windows {
            self.flush_window(key, window);
        }
        let clients: Vec<(Sym, Sym)> = self.clients.keys().copied().collect();
        for key in clients {
            self.finish_client(key);
        }
        self.judge_logged_switches();
        let stats = self.stats();
        let metric_anomalies = match self.metrics.take() {
            Some(metrics) => {
                let mut found = metrics.finish(&self.interner, self.config);
                found.retain(|anomaly| self.metric_kinds.contains(&anomaly.kind));
                found
            }
            None => Vec::new(),
        };
        let mut anomalies = std::mem::take(&mut self.windows_found);
        anomalies.append(&mut self.anomalies);
        anomalies.extend(metric_anomalies);
        let (grace, silence) =
            (self.config.open_grace_seconds * 1_000_000_000, self.config.open_silence_seconds * 1_000_000_000);
        for anomaly in &mut anomalies {
            let cluster = self.interner.intern_opt(anomaly.cluster.as_deref());
            let node = anomaly.node_id.as_deref().map(|node| self.interner.intern(node));
            anomaly.open = self.data_ends.is_open(anomaly.kind, cluster, node, anomaly.end_unix_nano, grace, silence);
        }
        let evidence: Vec<crate::log_events::LogEvent> = std::mem::take(&mut self.evidence_lines).into();
        crate::log_events::attach_evidence(&mut anomalies, &evidence);
        crate::sort_anomalies(&mut anomalies);
        (anomalies, stats)
    }

    /// Joins the attempts the lateness has passed, processes the calls the horizon has
    /// passed, and drops what can no longer join or matter.
    fn advance(&mut self) {
        let join_before = self.watermark.saturating_sub(self.lateness);
        let mut joins = std::mem::take(&mut self.join_batch);
        loop {
            joins.clear();
            // The held attempts in arrival order, up to the first that ended too recently
            // (walked in order: the prefetchers bring the next ones in).
            self.join_next = self.join_next.max(self.held.front_place());
            while joins.len() < BATCH && self.join_next < self.held.next_place() {
                if let Some(Slot::Raw(span)) = self.held.get(self.join_next) {
                    if span.end >= join_before {
                        break;
                    }
                    joins.push(self.join_next);
                }
                self.join_next += 1;
            }
            if joins.is_empty() {
                break;
            }
            self.warm_joins(&joins);
            for at in joins.iter().copied() {
                self.join_slot(at);
            }
        }
        self.join_batch = joins;
        let final_before = self.watermark.saturating_sub(self.horizon);
        // A call with an attempt that ended within the lateness (one that began near the end
        // of the call's horizon) waits until that attempt's hops can have arrived, as the
        // batch analysis joins every hop under it, and the calls after it wait behind it, in
        // start order. For at most the lateness: the attempt has arrived, so the data's time
        // is past its end (`awaits_hops` waits for none that claims to end more than two
        // horizons after its call began). Never at the end of the data: all of it is in.
        let wait_for_hops = self.watermark != i64::MAX;
        let mut waits_from = None;
        let mut due = std::mem::take(&mut self.due_batch);
        'due: loop {
            due.clear();
            while due.len() < BATCH
                && let Some(next) = self.queue.pop_through(final_before.saturating_sub(1))
            {
                due.push(next);
            }
            if due.is_empty() {
                break;
            }
            self.warm_calls(&due);
            for at in 0..due.len() {
                let Due(start, _, call) = due[at];
                if wait_for_hops && self.awaits_hops(call, join_before) {
                    waits_from = Some(start);
                    for waiting in due.drain(at..) {
                        self.queue.push(waiting);
                    }
                    break 'due;
                }
                if let Some((open, call_id)) = self.close_call(call) {
                    self.finalize(open, call_id);
                }
                self.release_answers(start);
            }
        }
        self.due_batch = due;
        // Every call that started before it is processed (the ones after wait behind it).
        let final_before = waits_from.unwrap_or(final_before);
        self.judge_deferred(final_before.saturating_sub(1));
        // Every call that started before `final_before` is processed: the runs that ended
        // before it can be judged.
        if self.pinned.iter().any(|pending| pending.end < final_before) {
            let (due, waiting): (Vec<_>, Vec<_>) =
                std::mem::take(&mut self.pinned).into_iter().partition(|pending| pending.end < final_before);
            self.pinned = waiting;
            let (interner, namespaces) = (&self.interner, &self.namespaces);
            self.anomalies.extend(due.into_iter().filter_map(|pending| {
                let scope = namespaces.get(&pending.scope);
                pending.judge(interner, scope)
            }));
        }
        // Every call that started before the horizon is processed: so are the answers (log
        // lines included, which no call releases), and the switch lines can be judged.
        self.release_answers(final_before.saturating_sub(1));
        self.judge_switch_lines(final_before);
        // A hop ended after its attempt started, so that attempt's call is processed by now:
        // what still waits from before the horizon never joined.
        self.stats.unjoined_hops += self.traces.drop_ended(final_before);
        while let Some((end, _, _)) = self.waiting.front()
            && *end < final_before
        {
            let Some((_, client, call_id)) = self.waiting.pop_front() else { break };
            // (Those of its id that ended since wait for a later call of that id.)
            if let Some(calls) = self.by_call.get_mut(&client)
                && let Some(spans) = calls.get_mut(&call_id)
            {
                let before = spans.len();
                spans.retain(|(_, hop)| hop.end >= final_before);
                self.stats.unjoined_hops += (before - spans.len()) as u64;
                if spans.is_empty() {
                    calls.remove(&call_id);
                }
            }
        }
        // Once a minute of data time: forget what the retention no longer covers (never in the
        // final pass, which processes everything left and reads what was kept).
        if self.watermark != i64::MAX && self.watermark >= self.next_prune {
            self.next_prune = self.watermark.saturating_add(60 * 1_000_000_000);
            self.evict_idle_clients(final_before.saturating_sub(self.retention));
            self.traces.sweep();
            let before = final_before.saturating_sub(self.retention);
            for namespace in self.namespaces.values_mut() {
                namespace.prune(before);
            }
            for points in self.probes.values_mut() {
                while points.front().is_some_and(|(at, _)| *at < before) {
                    points.pop_front();
                }
            }
        }
    }
}
