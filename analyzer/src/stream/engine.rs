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
use super::namespace::{Fact, MAX_FORWARDED, NamespaceState};
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
    op: Sym,
    rpc_method: Sym,
    /// Its first attempt's start: attempts of its call id that start more than a horizon
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
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
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

/// A logged switch line: the process that logged it and the client it names (interned), and,
/// once judged ([`Engine::judge_switch_lines`]), the client it was taken to be and whether it
/// went back sooner than the switch-back delay allows.
#[derive(Debug)]
struct SwitchLine {
    event: crate::log_events::LogEvent,
    process: (Sym, Sym),
    named: Sym,
    judged: Option<(Sym, Option<failover_flapping::EarlySwitch>)>,
}

impl std::borrow::Borrow<crate::log_events::LogEvent> for SwitchLine {
    fn borrow(&self) -> &crate::log_events::LogEvent {
        &self.event
    }
}

/// `client`'s probe verdicts on the cluster at `address` ([`failover_flapping::probe_verdicts`]).
fn verdicts_of(
    probes: &BTreeMap<ProbeKey, VecDeque<(UnixNanos, f64)>>,
    address: &str,
    client: &str,
) -> Vec<(UnixNanos, f64)> {
    failover_flapping::probe_verdicts(
        probes.iter().map(|((_, _, _, probed, _, probe_client), points)| {
            (probed.as_str(), probe_client.as_str(), points.iter().copied())
        }),
        address,
        client,
    )
}

/// [`failover_flapping::logged_early`] of `client`'s line, by the probes held.
fn logged_early(
    probes: &BTreeMap<ProbeKey, VecDeque<(UnixNanos, f64)>>,
    client: &str,
    event: &crate::log_events::LogEvent,
    min_gap: i64,
) -> Option<failover_flapping::EarlySwitch> {
    failover_flapping::logged_early(event, min_gap, |address| verdicts_of(probes, address, client))
}

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
    due_batch: Vec<(UnixNanos, CallRef)>,
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

    /// A recognised log line ([`crate::log_events`]). A router's NoNamenodesAvailable line
    /// without trace context is one of its answers to `no_namenodes_window`, ordered by time
    /// with the answers of its traced spans.
    pub fn push_log_event(&mut self, event: &crate::log_events::LogEvent) {
        self.stats.log_events += 1;
        let time = event.time_unix_nano;
        if time > self.watermark {
            self.watermark = time;
        }
        if time.saturating_add(self.horizon) < self.watermark {
            self.stats.late_log_events += 1;
        }
        while let Some(&(oldest, _)) = self.recent_lines.front()
            && oldest.saturating_add(self.horizon) < self.watermark
        {
            let expired = self.recent_lines.pop_front().expect("a front was just read");
            self.recent_line_set.remove(&expired);
        }
        let identity = event.identity();
        if !self.recent_line_set.insert(identity) {
            self.stats.duplicates += 1;
            return;
        }
        self.recent_lines.push_back(identity);
        let cluster = self.interner.intern_opt(event.cluster.as_deref());
        self.data_ends.call_or_line(cluster, time);
        if event.kind.is_evidence() {
            let at = self.evidence_lines.partition_point(|earlier| earlier.time_unix_nano <= time);
            self.evidence_lines.insert(at, event.clone());
            if self.evidence_lines.len() > crate::log_events::MAX_EVIDENCE_LINES {
                self.evidence_lines.pop_front();
            }
        }
        if self.kinds.follower_read_disabled
            && event.kind == crate::log_events::LogEventKind::FollowerReadDisabled
            && let Some(client) = event.client_id.as_deref()
        {
            let client = self.interner.intern(client);
            let peer = self.interner.intern_opt(event.fields.get("peer").map(String::as_str));
            let lines = self.logged_disables.entry(client).or_default();
            let at = lines.partition_point(|(earlier, _)| *earlier <= time);
            lines.insert(at, (time, peer));
        }
        if self.kinds.failover_flapping
            && event.kind == crate::log_events::LogEventKind::ClusterSwitch
            && (event.client_id.is_some() || event.node_id.is_some())
        {
            let line = SwitchLine {
                process: (
                    self.interner.intern_opt(event.cluster.as_deref()),
                    self.interner.intern_opt(event.node_id.as_deref()),
                ),
                named: self.interner.intern_opt(event.client_id.as_deref()),
                judged: None,
                event: event.clone(),
            };
            self.unjudged_switches.push(self.log_switches.len());
            self.log_switches.push(line);
        }
        if self.kinds.no_namenodes_window
            && let Some(router) = event.router_answer()
        {
            self.sequence += 1;
            let key = (
                self.interner.intern_opt(event.cluster.as_deref()),
                self.interner.intern_opt(event.namespace.as_deref()),
                self.interner.intern(router),
            );
            let tried = self.interner.intern_opt(event.fields.get("namenode").map(String::as_str));
            let answer = Answer {
                start: time,
                order: self.sequence,
                end: time,
                no_namenodes: true,
                client: Sym::NONE,
                tried,
                logged: true,
            };
            self.answers.push(RouterAnswer(answer, key));
        }
        if self.watermark >= self.next_advance {
            self.next_advance = self.watermark.saturating_add(1_000_000_000);
            self.advance();
        }
    }

    /// Registers a metric series; samples name it by the returned id.
    pub fn define_series(&mut self, def: &SeriesDef) -> u32 {
        if let Some(id) = self.series_ids.get(def) {
            return *id;
        }
        let label = |key: &str| {
            def.labels.iter().find(|(name, _)| self.interner.get(*name) == Some(key)).map_or(Sym::NONE, |(_, v)| *v)
        };
        let (cluster, namespace, node) = (label(CLUSTER), label(NAMESPACE), label(NODE_ID));
        let name = self.interner.get(def.name).unwrap_or_default();
        let role = if name == METRIC_PROBE_UP {
            let text = |key: &str| self.interner.get(label(key)).unwrap_or_default().to_string();
            SeriesRole::Probe((
                self.interner.owned(cluster),
                self.interner.owned(namespace),
                self.interner.owned(node),
                text(blind_failover_probe::SERVER_ADDRESS),
                text(blind_failover_probe::PROBE_KIND),
                text(blind_failover_probe::CLIENT_ID),
            ))
        } else if name == METRIC_COMMITTED_STATE {
            SeriesRole::Committed
        } else if name == METRIC_ROLE {
            SeriesRole::Role { active: label(NODE_ROLE) == known::ACTIVE }
        } else {
            SeriesRole::Ignored
        };
        let id = u32::try_from(self.series.len()).expect("fewer than 2^32 series");
        if let Some(metrics) = &mut self.metrics {
            metrics.define(id, def, &self.interner);
        }
        self.series_ids.insert(def.clone(), id);
        self.series.push(SeriesInfo { role, cluster, namespace, node });
        id
    }

    /// Takes one numeric sample of a series from [`Engine::define_series`].
    pub fn push_sample(&mut self, sample: SampleRec) {
        self.stats.samples += 1;
        let Some(series) = self.series.get(sample.series as usize) else { return };
        self.data_ends.sample(series.cluster, series.node.is_some().then_some(series.node), sample.time);
        let key = (series.cluster, series.namespace);
        if let Some(metrics) = &mut self.metrics {
            metrics.push(sample.series, sample.time, sample.value, &self.interner, self.config);
        }
        match &series.role {
            SeriesRole::Ignored => {}
            SeriesRole::Probe(key) => {
                // In time order, one verdict a timestamp (the first, as every series keeps; a
                // request sent again brings the same ones).
                let points = self.probes.entry(key.clone()).or_default();
                let at = points.partition_point(|(time, _)| *time <= sample.time);
                if at == 0 || points[at - 1].0 != sample.time {
                    points.insert(at, (sample.time, sample.value));
                }
            }
            SeriesRole::Committed => {
                self.namespaces.entry(key).or_default().committed.report(sample.time, sample.value as StateId);
            }
            SeriesRole::Role { active: true } => {
                self.sequence += 1;
                let node = series.node;
                let fact = Fact { at: sample.time, node, order: self.sequence, client: Sym::NONE };
                self.namespaces.entry(key).or_default().active_reported.push(fact);
            }
            SeriesRole::Role { active: false } => {}
        }
    }

    /// Takes a model sample (numeric points only; the metric detectors read nothing else).
    pub fn push_model_sample(&mut self, sample: &Sample) {
        let PointValue::Number(value) = &sample.value else { return };
        let mut labels: Vec<(Sym, Sym)> = sample
            .series
            .labels
            .iter()
            .map(|(key, value)| (self.interner.intern(key), self.interner.intern(value)))
            .collect();
        labels.sort_unstable();
        let def = SeriesDef { name: self.interner.intern(&sample.series.name), kind: sample.meta.kind, labels };
        let series = self.define_series(&def);
        self.push_sample(SampleRec { series, time: sample.time_unix_nano, value: *value });
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

    /// The runs of the switches clients logged, now that every line and whose node is whose
    /// is known; a client found logging keeps no run found from its calls' addresses (held to
    /// the end for this: [`Engine::drain_found`]).
    fn judge_logged_switches(&mut self) {
        let mut log_switches = std::mem::take(&mut self.log_switches);
        log_switches.sort_by_key(|line| line.event.time_unix_nano);
        let interner = &self.interner;
        let owners: BTreeMap<(Option<&str>, &str), &str> = self
            .switch_owners
            .owned()
            .filter_map(|((cluster, node), client)| {
                Some(((interner.get(*cluster), interner.get(*node)?), interner.get(*client)?))
            })
            .collect();
        let logged =
            failover_flapping::logged_switches(&log_switches, |cluster, node| owners.get(&(cluster, node)).copied());
        let logging: FxHashSet<&str> = logged.keys().map(|(_, client)| *client).collect();
        // Every flapping found so far was found from addresses.
        let from_logging = |anomaly: &Anomaly| {
            anomaly.kind == AnomalyKind::FailoverFlapping
                && anomaly.client_id.as_deref().is_some_and(|client| logging.contains(client))
        };
        self.windows_found.retain(|anomaly| !from_logging(anomaly));
        self.anomalies.retain(|anomaly| !from_logging(anomaly));
        let min_gap = self.config.failover_flapping.switch_back_delay_nanos();
        for ((cluster, client), switches) in &logged {
            for run in failover_flapping::runs(switches, min_gap, |line| line.event.time_unix_nano) {
                // Judged as the data passed it, for the client it turned out to be (the probes it
                // read are pruned since), else with what is left of them.
                let early = run.iter().find_map(|line| match &line.judged {
                    Some((judged_for, early)) if interner.get(*judged_for) == Some(*client) => early.clone(),
                    _ => logged_early(&self.probes, client, &line.event, min_gap),
                });
                let events: Vec<&crate::log_events::LogEvent> = run.iter().map(|line| &line.event).collect();
                self.anomalies.push(failover_flapping::flapping_logged(*cluster, client, &events, min_gap, early));
            }
        }
    }

    /// Judges, once the data has passed them (`before`: every call that started earlier is
    /// processed, and every probe verdict up to then is in), the logged switch lines whose
    /// client is known by then (named, or the one client calling cluster URLs from their
    /// process so far): whether each went back sooner than the switch-back delay allows
    /// ([`failover_flapping::logged_early`]), read before the probes it reads are pruned. A line
    /// whose client is still unknown a retention later is left to the end.
    fn judge_switch_lines(&mut self, before: UnixNanos) {
        if self.unjudged_switches.is_empty() {
            return;
        }
        let min_gap = self.config.failover_flapping.switch_back_delay_nanos();
        let forget_before = before.saturating_sub(self.retention);
        let (lines, owners, probes, interner) =
            (&mut self.log_switches, &self.switch_owners, &self.probes, &self.interner);
        self.unjudged_switches.retain(|&index| {
            let line = &mut lines[index];
            if line.event.time_unix_nano >= before {
                return true;
            }
            let client = if line.named.is_some() { Some(line.named) } else { owners.owner(&line.process).copied() };
            match client.and_then(|client| Some((client, interner.get(client)?))) {
                Some((client, name)) => {
                    line.judged = Some((client, logged_early(probes, name, &line.event, min_gap)));
                    false
                }
                None => line.event.time_unix_nano >= forget_before,
            }
        });
    }

    fn push_attempt(&mut self, span: &SpanRec) {
        let state = self
            .clients
            .entry((span.client, span.namespace))
            .or_insert_with(|| ClientState::new(span.client, span.namespace, span.cluster, span.system));
        state.last_seen = state.last_seen.max(span.end);
        self.stats.peak_clients = self.stats.peak_clients.max(self.clients.len());
        if span.start.saturating_add(self.horizon) < self.watermark {
            self.stats.late_attempts += 1;
        }
        let existing = span
            .call_id
            .as_deref()
            .and_then(|call_id| self.find_open(span.client, span.namespace, call_id, span.start));
        if let Some(call) = existing
            && span.id.is_some()
            && self.holds(call, (span.id, span.start))
        {
            self.stats.duplicates += 1;
            return;
        }
        let (call, index_key) = match existing {
            Some(call) => (call, None),
            None => self.open_call(span),
        };
        let at = self.held.push(Slot::Raw(ClientRec::of(span)));
        self.calls[call.slot()].as_mut().expect("an indexed call is open").held.push(at);
        // Last: the index is several times the cache, and its entry's store misses. Copies
        // through the stack (as the two above) wait for every store before them to land when
        // one of their loads spans two of their stores: after it, they do not wait for this one.
        if let Some(key) = index_key {
            self.index_call(key, call);
        }
    }

    /// Whether the open call `call` holds an attempt whose span has these ids and start (a
    /// retried export request brings it again; as `build_timelines`, ids alone are not enough).
    fn holds(&self, call: CallRef, identity: (SpanKey, UnixNanos)) -> bool {
        self.current(call).is_some_and(|open| {
            open.held.iter().any(|at| self.held.get(*at).is_some_and(|slot| slot.identity() == identity))
        })
    }

    /// The call `call` names, if it is still open.
    fn current(&self, call: CallRef) -> Option<&OpenCall> {
        if self.generations.get(call.slot()) != Some(&call.generation()) {
            return None;
        }
        self.calls[call.slot()].as_ref()
    }

    /// The open call of (client, namespace, call id) that an attempt starting at `start`
    /// belongs to, if any (one that started no more than a horizon before it).
    fn find_open(&self, client: Sym, namespace: Sym, call_id: &str, start: UnixNanos) -> Option<CallRef> {
        let is_it = |call: &CallRef| {
            self.current(*call).is_some_and(|open| {
                open.client == client
                    && open.namespace == namespace
                    && start <= open.start.saturating_add(self.horizon)
                    && self.call_ids[call.slot()].as_deref() == Some(call_id)
            })
        };
        let indexed = self.open_index.get(&call_key(client, namespace, call_id)).copied().filter(is_it);
        indexed.or_else(|| self.open_collisions.iter().copied().find(is_it))
    }

    /// Opens a call for its first attempt (which the caller then holds): a slab slot and a
    /// place in the queue; returns it and its key ([`call_key`]), for the caller to index it by
    /// ([`Engine::index_call`]).
    fn open_call(&mut self, span: &SpanRec) -> (CallRef, Option<u64>) {
        let slot = match self.free_slots.pop() {
            Some(slot) => slot,
            None => {
                self.calls.push(None);
                self.call_ids.push(None);
                self.generations.push(0);
                u32::try_from(self.calls.len() - 1).expect("fewer than 2^32 open calls")
            }
        };
        let call = CallRef::new(slot, self.generations[slot as usize]);
        let index_key = span.call_id.as_deref().map(|call_id| call_key(span.client, span.namespace, call_id));
        self.call_ids[slot as usize].clone_from(&span.call_id);
        self.sequence += 1;
        self.queue.push(Due(span.start, self.sequence, call));
        self.calls[slot as usize] = Some(OpenCall {
            client: span.client,
            namespace: span.namespace,
            index_key,
            collided: false,
            op: span.op,
            rpc_method: span.rpc_method,
            start: span.start,
            held: SmallVec::new(),
        });
        self.open_calls += 1;
        self.stats.peak_open_calls = self.stats.peak_open_calls.max(self.open_calls);
        (call, index_key)
    }

    /// Indexes a call just opened by its key: in `open_index`, or in `open_collisions` when
    /// another open call holds that key.
    fn index_call(&mut self, key: u64, call: CallRef) {
        let generations = &self.generations;
        match self.open_index.entry(key) {
            Entry::Vacant(entry) => {
                entry.insert(call);
            }
            Entry::Occupied(mut entry) => {
                let held = *entry.get();
                if generations.get(held.slot()) == Some(&held.generation()) {
                    self.open_collisions.push(call);
                    if let Some(open) = self.calls[call.slot()].as_mut() {
                        open.collided = true;
                    }
                } else {
                    *entry.get_mut() = call;
                    self.stale_entries = self.stale_entries.saturating_sub(1);
                }
            }
        }
    }

    /// Takes a call out of the slab, if `call` still names it (its index entry goes stale),
    /// with its call id.
    fn close_call(&mut self, call: CallRef) -> Option<(OpenCall, Option<CallId>)> {
        if self.generations.get(call.slot()) != Some(&call.generation()) {
            return None;
        }
        let open = self.calls[call.slot()].take()?;
        let call_id = self.call_ids[call.slot()].clone();
        self.generations[call.slot()] = call.generation().wrapping_add(1);
        self.free_slots.push(call.slot() as u32);
        self.open_calls -= 1;
        if open.collided {
            self.open_collisions.retain(|other| *other != call);
        } else if open.index_key.is_some() {
            self.stale_entries += 1;
            if self.stale_entries > (self.open_calls / 2).max(MIN_STALE_ENTRIES) {
                let generations = &self.generations;
                self.open_index.retain(|_, held| generations.get(held.slot()) == Some(&held.generation()));
                self.stale_entries = 0;
            }
        }
        Some((open, call_id))
    }

    fn push_hop(&mut self, span: &SpanRec) {
        let hop = matches!(span.component, known::ROUTER | known::SERVER);
        if span.is_trace_hop() {
            self.traces.push(span.id.trace_id(), HopRec::of(span));
            self.stats.peak_pending_spans = self.stats.peak_pending_spans.max(self.traces.spans.len());
        } else if hop && let (true, Some(call_id)) = (span.client.is_some(), span.call_id.as_ref()) {
            // No trace context reached it (a root of its own trace, or no ids at all): it joins
            // by call id. One with ids sent again is taken once.
            let waiting = self.by_call.entry(span.client).or_default().entry(call_id.clone()).or_default();
            let record = HopRec::of(span);
            if span.id.is_some()
                && waiting.iter().any(|(_, other)| other.span_id == record.span_id && other.start == record.start)
            {
                self.stats.duplicates += 1;
                return;
            }
            let trace_id = if span.id.is_some() { span.id.trace_id() } else { 0 };
            waiting.push((trace_id, record));
            self.waiting.push_back((span.end, span.client, call_id.clone()));
        }
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
        let mut due = std::mem::take(&mut self.due_batch);
        loop {
            due.clear();
            while due.len() < BATCH
                && let Some(Due(start, _, call)) = self.queue.pop_through(final_before.saturating_sub(1))
            {
                due.push((start, call));
            }
            if due.is_empty() {
                break;
            }
            self.warm_calls(&due);
            for (start, call) in due.iter().copied() {
                if let Some((open, call_id)) = self.close_call(call) {
                    self.finalize(open, call_id);
                }
                self.release_answers(start);
            }
        }
        self.due_batch = due;
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

    /// Reads, for a batch of attempts about to be joined, the memory the joins will read: the
    /// attempts' spans, then their traces' waiting hops (every field of each: a record spans
    /// several cache lines). Held for the lateness, all of it has left the
    /// cache; read one join at a time, every miss waits for the one before (a chain of
    /// pointers), while a pass over the batch lets the processor wait for many at once. What is
    /// read is only summed (and kept from being optimized away).
    fn warm_joins(&self, batch: &[u64]) {
        let mut sum = 0_u64;
        let mut traces: SmallVec<[u128; BATCH]> = SmallVec::new();
        for at in batch {
            if let Some(Slot::Raw(span)) = self.held.get(*at) {
                sum = sum.wrapping_add(span.touch());
                traces.push(span.id.trace_id());
            }
        }
        for trace in &traces {
            sum = sum.wrapping_add(self.traces.of(*trace).map(HopRec::touch).fold(0, u64::wrapping_add));
        }
        std::hint::black_box(sum);
    }

    /// As [`Engine::warm_joins`], for a batch of calls about to be finalized: their slab
    /// entries and call ids, then their attempts.
    fn warm_calls(&self, batch: &[(UnixNanos, CallRef)]) {
        // First the generations, slab entries and call ids, then what the entries point to.
        let mut sum = batch.iter().fold(0_u64, |sum, (_, call)| {
            let slot = call.slot();
            let open = self.calls[slot].as_ref().map_or(0, |open| open.held.len() as u64);
            let call_id = self.call_ids[slot].as_ref().map_or(0, |call_id| call_id.len() as u64);
            sum.wrapping_add(u64::from(self.generations[slot])).wrapping_add(open).wrapping_add(call_id)
        });
        for (_, call) in batch {
            if let Some(open) = &self.calls[call.slot()] {
                for slot in open.held.iter().filter_map(|at| self.held.get(*at)) {
                    sum = sum.wrapping_add(match slot {
                        Slot::Raw(span) => span.touch(),
                        Slot::Joined(attempt) => attempt.touch(),
                        Slot::Waiting(waiting) => waiting.0.touch(),
                    });
                }
                // The oldest of its client's recent calls, which processing this call pushes out
                // (freed then, unless a floor still holds it): last read 16 of the client's
                // calls ago.
                if let Some(state) = self.clients.get(&(open.client, open.namespace))
                    && let Some(oldest) = state.recent.front()
                {
                    sum = sum.wrapping_add(Rc::strong_count(oldest) as u64).wrapping_add(oldest.touch_for_drop());
                }
            }
        }
        std::hint::black_box(sum);
    }

    /// Joins a traced attempt to the router and server spans under it. Untraced attempts
    /// wait for their call to be final (they join by call id, to the nearest attempt).
    fn join_slot(&mut self, at: u64) {
        let Some(slot) = self.held.get_mut(at) else { return };
        let Slot::Raw(span) = slot else { return };
        if !span.id.is_some() {
            return;
        }
        // Its call's: a call's attempts share their client and namespace.
        let (client, namespace) = (span.client, span.namespace);
        let mut hops = self.traces.take_under(span.id);
        if !self.waiting.is_empty() && self.by_call.get(&client).is_some_and(|calls| !calls.is_empty()) {
            // The client's hops (some at least) received no trace context and join by call id
            // when the call is final: this attempt waits for them with what its trace gave it.
            *slot = Slot::Waiting(Box::new((*span, hops)));
            return;
        }
        let join = traced_join(&hops);
        let attempt = build_attempt(span, &mut hops, join);
        *slot = Slot::Joined(attempt);
        let Slot::Joined(attempt) = slot else { return };
        let scope = self.clients.get(&(client, namespace)).map(|state| (state.cluster, state.namespace));
        if let Some(scope) = scope {
            record_facts(self.facts, self.namespaces.entry(scope).or_default(), attempt, client, &mut self.sequence);
        }
    }

    fn finalize(&mut self, open: OpenCall, call_id: Option<CallId>) {
        self.stats.calls += 1;
        let (client, namespace) = (open.client, open.namespace);
        // Its id's hops that started within the horizon of its start; later ones wait for the
        // later call of that id.
        let last = open.start.saturating_add(self.horizon);
        let untraced = match (&call_id, self.by_call.get_mut(&client)) {
            (Some(call_id), Some(calls)) => match calls.get_mut(call_id) {
                Some(waiting) if waiting.iter().any(|(_, hop)| hop.start > last) => {
                    let (mine, later) = std::mem::take(waiting).into_iter().partition(|(_, hop)| hop.start <= last);
                    *waiting = later;
                    mine
                }
                Some(_) => calls.remove(call_id).unwrap_or_default(),
                None => Vec::new(),
            },
            _ => Vec::new(),
        };
        // Most calls: one attempt, joined through its trace, moved straight into the call's list.
        if untraced.is_empty()
            && let [at] = open.held[..]
            && let Some(Slot::Joined(_)) = self.held.get(at)
            && let Some(Slot::Joined(attempt)) = self.held.take(at)
        {
            self.process_call(&open, call_id, std::iter::once(attempt), 1);
            return;
        }
        // Out of the held attempts into the list that becomes the call's (allocated now, when
        // blocks freed by recently processed calls are at hand).
        let mut slots: Vec<Slot> = Vec::with_capacity(open.held.len());
        slots.extend(open.held.iter().filter_map(|at| self.held.take(*at)));
        slots.sort_by_key(Slot::order);
        let all_joined = slots.iter().all(|slot| matches!(slot, Slot::Joined(_)));
        if all_joined && untraced.is_empty() {
            // Retried calls: every attempt joined through its trace already.
            let count = slots.len();
            let attempts = slots.into_iter().filter_map(|slot| match slot {
                Slot::Joined(attempt) => Some(attempt),
                Slot::Raw(_) | Slot::Waiting(_) => None,
            });
            self.process_call(&open, call_id, attempts, count);
            return;
        }
        // Raw attempts: their traced hops now (waiting ones have theirs), then the untraced hops
        // by call id, with the traces of those that started their own.
        let mut gathered: Vec<Option<Gathered>> = slots
            .iter_mut()
            .map(|slot| {
                let hops = match slot {
                    Slot::Raw(span) => self.traces.take_under(span.id),
                    Slot::Waiting(waiting) => std::mem::take(&mut waiting.1),
                    Slot::Joined(_) => return None,
                };
                Some(Gathered::traced(hops))
            })
            .collect();
        for (trace_id, hop) in untraced {
            let nearest = (0..slots.len())
                .filter(|index| {
                    gathered[*index].is_some() && same_attempt_or_unnumbered(slots[*index].placed().0, hop.attempt())
                })
                .min_by_key(|index| {
                    let (attempt, start, end) = slots[*index].placed();
                    (attempt != hop.attempt() || hop.attempt().is_none(), distance_to(start, end, hop.start))
                });
            match nearest.and_then(|index| gathered[index].as_mut()) {
                Some(into) => {
                    if into.join == TimelineJoin::ClientOnly {
                        into.join = TimelineJoin::CallId;
                    }
                    if trace_id != 0 {
                        // A root of its own trace: the hops under it (its process propagated
                        // context onwards) join with it, named in that trace.
                        let root = SpanKey::new(trace_id, hop.span_id);
                        into.traces.push((hop.span_id, trace_id));
                        into.hops.push(hop);
                        for under in self.traces.take_under(root) {
                            into.traces.push((under.span_id, trace_id));
                            into.hops.push(under);
                        }
                    } else {
                        into.hops.push(hop);
                    }
                }
                None => self.stats.unjoined_hops += 1,
            }
        }
        let scope = self.clients.get(&(client, namespace)).map(|state| (state.cluster, state.namespace));
        let attempts: Vec<Attempt> = slots
            .into_iter()
            .zip(gathered)
            .map(|(slot, gathered)| {
                let span = match slot {
                    Slot::Joined(attempt) => return attempt,
                    Slot::Raw(span) => span,
                    Slot::Waiting(waiting) => waiting.0,
                };
                let Gathered { mut hops, join, traces } = gathered.unwrap_or_else(|| Gathered::traced(Hops::new()));
                let mut attempt = build_attempt(&span, &mut hops, join);
                if !traces.is_empty() {
                    attempt.hop_traces = Some(Box::new(traces));
                }
                if let Some(scope) = scope {
                    let namespace = self.namespaces.entry(scope).or_default();
                    record_facts(self.facts, namespace, &attempt, client, &mut self.sequence);
                }
                attempt
            })
            .collect();
        let count = attempts.len();
        self.process_call(&open, call_id, attempts.into_iter(), count);
    }

    /// A call's joined attempts (`count` of them at most) into a compact call, then through
    /// the detectors. The call is allocated and written before its attempts are moved in: its
    /// fields are built on the stack and read back in wider loads (which wait for every store
    /// before them), and the attempts' copies are stores to memory that may have left the cache.
    fn process_call(
        &mut self,
        open: &OpenCall,
        call_id: Option<CallId>,
        attempts: impl Iterator<Item = Attempt>,
        count: usize,
    ) {
        let (op, rpc_method) = (open.op, open.rpc_method);
        let mut call =
            Rc::new(Call { call_id, op, rpc_method, start: 0, end: 0, attempts: SmallVec::with_capacity(count) });
        let made = Rc::get_mut(&mut call).expect("a call just made has no other owner");
        made.attempts.extend(attempts);
        made.start = made.attempts.iter().map(|attempt| attempt.start).min().unwrap_or_default();
        made.end = made.attempts.iter().map(|attempt| attempt.end).max().unwrap_or_default();
        self.stats.longest_call_nanos = self.stats.longest_call_nanos.max(made.end.saturating_sub(made.start));
        self.process(open.client, open.namespace, call);
    }

    /// Runs the per-call and per-client detectors over a processed call, in client order.
    fn process(&mut self, client: Sym, namespace: Sym, call: Rc<Call>) {
        let Engine {
            config,
            kinds,
            interner,
            clients,
            namespaces,
            anomalies,
            data_ends,
            answers,
            no_namenodes_errors,
            sequence,
            probes,
            switch_owners,
            logged_disables,
            pinned,
            ..
        } = self;
        let Some(state) = clients.get_mut(&(client, namespace)) else { return };
        data_ends.call_or_line(state.cluster, call.end);
        state.fold(call.start);
        let scope = namespaces.entry((state.cluster, state.namespace)).or_default();
        let bound =
            interner.get(state.system).and_then(|system| config.stale_read.cross_client_bounds_seconds.get(system));
        let floors = CallFloors {
            writes: state.writes.as_ref().map(Contribution::floor),
            reads: state.reads.as_ref().map(Contribution::floor),
        };
        let mut raised = Vec::new();
        for (index, attempt) in call.attempts.iter().enumerate() {
            let at = || AttemptAt { call: call.clone(), index };
            if kinds.carried_state_regression
                && let (Some(seen), Some(carried)) = (&state.seen, attempt.carried())
                && seen.state.saturating_sub(carried) >= config.carried_state_regression.min_states_behind.max(1)
            {
                raised.push(Raise::Regression { index, carried, seen: seen.clone() });
            }
            if kinds.router_state_dropped
                && let (Some(carried), Some(forwarded)) = (attempt.carried(), attempt.router_carried())
                && carried.saturating_sub(forwarded) >= config.router_state_dropped.min_states_behind.max(1)
            {
                raised.push(Raise::Dropped { index, carried, forwarded });
            }
            let served_read = call.op == known::READ && attempt.ok;
            if kinds.stale_read
                && served_read
                && let Some(served) = attempt.served()
            {
                if !stale_read::exempt(interner.get(attempt.consistency), config)
                    && let Some(broken) = floors.broken_by(served, config.stale_read.min_states_behind)
                {
                    let floor = match broken.source {
                        FloorSource::Write => state.writes.clone(),
                        FloorSource::Read => state.reads.clone(),
                    };
                    if let Some(floor) = floor {
                        raised.push(Raise::Stale { index, served, floor });
                    }
                }
                if let Some(&bound) = bound
                    && floors.broken_by(served, 1).is_none()
                    && let Some((replaced_at, newer_state)) = scope.committed.first_above(served)
                {
                    let staleness = attempt.end.saturating_sub(replaced_at) as f64 / 1e9;
                    if staleness > bound as f64 {
                        raised.push(Raise::CrossClient { index, served, staleness, bound, replaced_at, newer_state });
                    }
                }
            }
            if kinds.untrusted_state {
                let margin = config.untrusted_state.margin_states;
                if let Some(carried) = attempt.carried()
                    && let Some(committed) = scope.committed.highest_at(attempt.start)
                    && carried > committed.saturating_add(margin)
                {
                    let run = state.untrusted.get_or_insert_with(|| UntrustedRun {
                        first: at(),
                        committed,
                        last_end: attempt.end,
                        carried,
                        requests: 0,
                        refused: 0,
                        pools: BTreeSet::new(),
                    });
                    run.last_end = attempt.end;
                    run.carried = run.carried.max(carried);
                    run.requests += 1;
                    run.refused += usize::from(!attempt.ok);
                    if attempt.router_node.is_some() && attempt.served_by.is_some() {
                        run.pools.insert((attempt.router_node, attempt.served_by));
                    }
                }
                if let Some(forwarded) = attempt.router_carried()
                    && attempt.carried().is_none_or(|own| own < forwarded)
                    && scope.forwarded.len() < MAX_FORWARDED
                {
                    scope.forwarded.push((client, forwarded, attempt.carried()));
                }
            }
            if kinds.follower_read_disabled && call.op == known::READ {
                let lines = logged_disables.get(&client).map_or(&[][..], Vec::as_slice);
                follow_logged(state, lines, attempt);
                follow_reads(state, &call, attempt, at);
            }
            if attempt.server_address.is_some() {
                if kinds.blind_failover_probe
                    && let Some(run) = failing_sends(state, attempt, at)
                {
                    raised.push(Raise::Failing(run));
                }
                if kinds.failover_flapping {
                    let min_gap = config.failover_flapping.switch_back_delay_nanos();
                    let early = |time, from: Sym, to: Sym| {
                        let client_id = interner.get(client).unwrap_or_default();
                        let verdicts = |address: &str| verdicts_of(probes, address, client_id);
                        let (from, to) = (interner.get(from).unwrap_or_default(), interner.get(to).unwrap_or_default());
                        failover_flapping::early_switch_back(time, from, to, min_gap, verdicts)
                    };
                    if let Some(run) = switches(state, attempt, at, min_gap, early) {
                        raised.push(Raise::Flapping(run));
                    }
                    if attempt.client_span.node.is_some() {
                        switch_owners.note((state.cluster, attempt.client_span.node), client);
                    }
                }
                state.last_address = attempt.server_address;
            }
            if kinds.no_namenodes_window && attempt.router_node.is_some() {
                let no_namenodes = *no_namenodes_errors.entry(attempt.error_type).or_insert_with(|| {
                    interner
                        .get(attempt.error_type)
                        .is_some_and(|error| error.ends_with(no_namenodes_window::NO_NAMENODES))
                });
                if no_namenodes || attempt.ok {
                    *sequence += 1;
                    let answer = Answer {
                        start: attempt.start,
                        order: *sequence,
                        end: attempt.end,
                        no_namenodes,
                        client,
                        tried: attempt.served_by,
                        logged: false,
                    };
                    answers.push(RouterAnswer(answer, (state.cluster, state.namespace, attempt.router_node)));
                }
            }
        }
        if kinds.pinned_retry {
            // Judged once every call that started by the run's end is processed: the answers
            // of attempts joined by call id are known only then.
            for run in pinned_runs(&call, config.pinned_retry.min_attempts) {
                let first = &call.attempts[run[0]];
                pinned.push(PendingPinned {
                    start: first.start,
                    end: call.attempts[run[run.len() - 1]].end,
                    node: first.answered_by(),
                    scope: (state.cluster, state.namespace),
                    client: identity(interner, state),
                    call: call.clone(),
                    run,
                });
            }
        }
        if !raised.is_empty() {
            anomalies.extend(build_anomalies(interner, state, &call, raised, probes, config));
        }
        state.contribute(&call, known::READ, known::WRITE);
    }

    /// Feeds the routers' answers that started by `until` to their windows, in start order.
    fn release_answers(&mut self, until: UnixNanos) {
        let settings = &self.config.no_namenodes_window;
        let max_gap = settings.max_gap_seconds * 1_000_000_000;
        while let Some(RouterAnswer(answer, key)) = self.answers.pop_through(until) {
            let gap_too_long =
                self.windows.get(&key).is_some_and(|window| answer.start.saturating_sub(window.last_start) > max_gap);
            if (!answer.no_namenodes || gap_too_long)
                && let Some(window) = self.windows.remove(&key)
            {
                self.flush_window(key, window);
            }
            if answer.no_namenodes {
                let window = self.windows.entry(key).or_insert_with(|| RouterWindow {
                    first_start: answer.start,
                    last_end: answer.end,
                    ..RouterWindow::default()
                });
                window.last_start = answer.start;
                window.last_end = window.last_end.max(answer.end);
                window.attempts[usize::from(answer.logged)] += 1;
                if answer.client.is_some() {
                    window.clients.insert(answer.client);
                }
                if answer.tried.is_some() {
                    *window.tried[usize::from(answer.logged)].entry(answer.tried).or_default() += 1;
                }
            }
        }
    }

    fn flush_window(&mut self, (cluster, namespace, router): RouterKey, window: RouterWindow) {
        let settings = &self.config.no_namenodes_window;
        if window.last_start.saturating_sub(window.first_start)
            < settings.min_window_seconds.saturating_mul(1_000_000_000)
        {
            return;
        }
        let interner = &self.interner;
        let (start, end) = (window.first_start, window.last_end);
        let scope = self.namespaces.get(&(cluster, namespace));
        // The first report in arrival order, else the first execution in the order the batch
        // detector meets them (by client, then in time).
        let from_metrics =
            scope.and_then(|scope| scope.active_reported.within(start, end).min_by_key(|fact| fact.order));
        let active = from_metrics.map(|fact| fact.node).filter(|node| node.is_some()).or_else(|| {
            scope.and_then(|scope| {
                scope
                    .active_served
                    .within(start, end)
                    .filter(|fact| fact.node.is_some())
                    .min_by_key(|fact| (interner.get(fact.client), fact.order))
                    .map(|fact| fact.node)
            })
        });
        let tried = window
            .tried
            .each_ref()
            .map(|tried| tried.iter().filter_map(|(node, count)| Some((interner.get(*node)?, *count))).collect());
        let (attempts, tried_first) = no_namenodes_window::counted(window.attempts, tried);
        let found = no_namenodes_window::Window {
            start,
            end,
            seconds: window.last_start.saturating_sub(window.first_start) as f64 / 1e9,
            attempts,
            clients: window
                .clients
                .iter()
                .map(|client| interner.get(*client).unwrap_or_default().to_string())
                .collect(),
            tried_first: tried_first.map(str::to_string),
            active: active.and_then(|node| interner.owned(node)),
        };
        let router = interner.get(router).unwrap_or_default();
        self.anomalies.push(no_namenodes_window::window_anomaly(
            interner.get(cluster),
            interner.get(namespace),
            router,
            &found,
        ));
    }

    /// Finishes and forgets the clients whose latest attempt ended before `before` (a horizon
    /// plus the retention ago): their calls are all processed, and what only their whole
    /// history decides is decided now. A client that comes back starts afresh.
    fn evict_idle_clients(&mut self, before: UnixNanos) {
        let idle: Vec<(Sym, Sym)> =
            self.clients.iter().filter(|(_, state)| state.last_seen < before).map(|(key, _)| *key).collect();
        for key in idle {
            self.finish_client(key);
            self.clients.remove(&key);
            self.stats.evicted_clients += 1;
        }
    }

    /// What only the whole history decides: a client's untrusted run, follower reads off
    /// for good, its last failing run and switches.
    fn finish_client(&mut self, key: (Sym, Sym)) {
        let Some(state) = self.clients.get(&key) else { return };
        let mut raised = Vec::new();
        if let Some(run) = &state.failing {
            raised.push(Raise::Failing(FailingRun {
                first: run.first.clone(),
                address: run.address,
                end: run.end,
                sends: run.sends,
            }));
        }
        if state.switches.len() >= 2 {
            raised.push(Raise::Flapping(state.switches.clone()));
        }
        let timeline = identity(&self.interner, state);
        let interner = &self.interner;
        for raise in raised {
            if let Some(anomaly) = raise.build(interner, state, &timeline, None, &self.probes, self.config) {
                self.anomalies.push(anomaly);
            }
        }
        let min_reads_after = self.config.follower_read_disabled.min_reads_after;
        let span_disabled = state.rejection.as_ref().filter(|rejection| rejection.for_good(min_reads_after));
        // The client's lines after its last read take effect now; the last one is in force.
        let lines = self.logged_disables.get(&state.client).map_or(&[][..], Vec::as_slice);
        let after_reads =
            lines.get(state.logged_next..).and_then(<[_]>::last).map(|&origin| logged_disable(state, origin));
        let logged = after_reads.as_ref().or(state.logged.as_ref()).filter(|logged| logged.for_good(min_reads_after));
        if let Some(rejection) = span_disabled {
            let call = rejection.origin.call.materialize(interner);
            self.anomalies.push(follower_read_disabled::disabled_for_good(
                &timeline,
                &call,
                &call.attempts[rejection.origin.index],
                rejection.reads_after,
                interner.owned(rejection.consistency_before),
                rejection.consistencies_after.iter().filter_map(|sym| interner.owned(*sym)).collect(),
                rejection.last_end,
            ));
        } else if let Some(logged) = logged {
            let (time, peer) = logged.origin;
            self.anomalies.push(follower_read_disabled::disabled_as_logged(
                &timeline,
                time,
                interner.owned(peer),
                logged.reads_after,
                interner.owned(logged.consistency_before),
                logged.consistencies_after.iter().filter_map(|sym| interner.owned(*sym)).collect(),
                logged.last_end,
            ));
        }
        if let Some(run) = &state.untrusted {
            let margin = self.config.untrusted_state.margin_states;
            let limit = run.committed.saturating_add(margin);
            let victims: BTreeSet<String> = self
                .namespaces
                .get(&(state.cluster, state.namespace))
                .into_iter()
                .flat_map(|scope| &scope.forwarded)
                .filter(|(other, forwarded, own)| {
                    *other != state.client && untrusted_state::poisoned(Some(*forwarded), *own, limit)
                })
                .filter_map(|(other, _, _)| interner.owned(*other))
                .collect();
            let call = run.first.call.materialize(interner);
            let summary = untrusted_state::Untrusted {
                first_call: &call,
                first: &call.attempts[run.first.index],
                committed: run.committed,
                last_end: run.last_end,
                carried: run.carried,
                requests: run.requests,
                refused: run.refused,
                pools: run
                    .pools
                    .iter()
                    .filter_map(|(router, server)| Some((interner.owned(*router)?, interner.owned(*server)?)))
                    .collect(),
                victims,
            };
            self.anomalies.push(untrusted_state::untrusted(&timeline, &summary, margin));
        }
    }
}

/// Router, server and intermediate spans with trace context, waiting to be joined: in
/// arrival order in `spans` (see [`Places`]; read at the joins in nearly that order), found by
/// trace through `places` (each trace's places, in arrival order).
#[derive(Debug, Default)]
struct TracedHops {
    spans: Places<HopRec>,
    places: FxHashMap<u128, SmallVec<[u64; 2]>>,
    /// Spans found twice under an attempt ([`EngineStats::duplicates`]).
    duplicates: u64,
}

impl TracedHops {
    /// Not through `entry`: its key, a `u128` kept on the stack in two halves, was read back
    /// whole as the new entry was written, a load no store forwards to, which waited for every
    /// store before it (a third of `push_span`'s samples).
    fn push(&mut self, trace: u128, span: HopRec) {
        let at = self.spans.push(span);
        match self.places.get_mut(&trace) {
            Some(places) => places.push(at),
            None => {
                self.places.insert(trace, SmallVec::from_buf_and_len([at, 0], 1));
            }
        }
    }

    /// The spans of `trace` waiting.
    fn of(&self, trace: u128) -> impl Iterator<Item = &HopRec> {
        self.places.get(&trace).into_iter().flatten().filter_map(|at| self.spans.get(*at))
    }

    /// The router and server spans under the client attempt `root`, taken out of its trace's
    /// waiting spans (intermediate spans are taken too).
    fn take_under(&mut self, root: SpanKey) -> Hops {
        let mut found = Hops::new();
        if !root.is_some() {
            return found;
        }
        let TracedHops { spans, places: by_trace, duplicates } = self;
        let Some(places) = by_trace.get_mut(&root.trace_id()) else { return found };
        // Spans taken so far, by id and start (their ids are parents for the next level), from
        // `level_start` on the latest level's. Traces are small: linear scans beat maps.
        let mut taken: SmallVec<[(u64, UnixNanos); 8]> = SmallVec::new();
        let mut level_start = 0;
        for depth in 0..MAX_PARENT_HOPS {
            let level_end = taken.len();
            let mut index = 0;
            while index < places.len() {
                // A place whose span is gone (dropped unjoined) is forgotten where met.
                let Some(parent) = spans.get(places[index]).map(|span| span.parent_span_id) else {
                    places.remove(index);
                    continue;
                };
                let under = if depth == 0 {
                    parent == root.span_id
                } else {
                    taken[level_start..level_end].iter().any(|(id, _)| *id == parent)
                };
                if under {
                    if let Some(span) = spans.take(places.remove(index)) {
                        // The same span again (an export request delivered twice): taken once.
                        if taken.contains(&(span.span_id, span.start)) {
                            *duplicates += 1;
                            continue;
                        }
                        taken.push((span.span_id, span.start));
                        if matches!(span.component, known::ROUTER | known::SERVER) {
                            found.push(span);
                        }
                    }
                } else {
                    index += 1;
                }
            }
            if taken.len() == level_end {
                break;
            }
            level_start = level_end;
        }
        if places.is_empty() {
            by_trace.remove(&root.trace_id());
        }
        found
    }

    /// Drops the spans that ended before `before` from the queue's front, in arrival order (the
    /// joined ones were taken out already: the front has moved past them), up to the first
    /// that ended later; returns how many were router or server spans (never joined). Their
    /// traces' places are swept out later ([`TracedHops::sweep`]).
    fn drop_ended(&mut self, before: UnixNanos) -> u64 {
        let mut unjoined = 0;
        while let Some((at, span)) = self.spans.front()
            && span.end < before
        {
            unjoined += u64::from(matches!(span.component, known::ROUTER | known::SERVER));
            self.spans.take(at);
        }
        unjoined
    }

    /// Forgets the places of spans dropped unjoined from the queue's front, and the traces
    /// left with none (a trace's places are otherwise removed as its spans join).
    fn sweep(&mut self) {
        let spans = &self.spans;
        self.places.retain(|_, places| {
            places.retain(|at| spans.get(*at).is_some());
            !places.is_empty()
        });
    }
}

/// An open call's key in the index: the hash of its client, namespace and call id (calls
/// whose keys collide are told apart by their ids).
fn call_key(client: Sym, namespace: Sym, call_id: &str) -> u64 {
    use std::hash::BuildHasher;
    rustc_hash::FxBuildHasher.hash_one((client, namespace, call_id))
}

/// What a joined attempt tells about its namespace: a committed state reported, an answer
/// served, an execution as the active.
/// Which namespace facts the running detectors read.
#[derive(Debug, Clone, Copy)]
struct Facts {
    /// Committed states (cross-client stale reads, untrusted states).
    committed: bool,
    /// Who answered when (pinned retries).
    served: bool,
    /// Executions as the active (NoNamenodesAvailable windows).
    active: bool,
}

fn record_facts(facts: Facts, scope: &mut NamespaceState, attempt: &Attempt, client: Sym, sequence: &mut u64) {
    if facts.committed
        && let Some(committed) = attempt.committed()
    {
        scope.committed.report(attempt.end, committed);
    }
    if attempt.ok && attempt.served_by.is_some() {
        *sequence += 1;
        let fact = Fact { at: attempt.end, node: attempt.served_by, order: *sequence, client };
        if facts.served {
            scope.served.push(fact);
        }
        if facts.active && attempt.served_role == known::ACTIVE {
            scope.active_served.push(Fact { at: attempt.start, ..fact });
        }
    }
}

/// follower_read_disabled, one read attempt at a time: remembers the latest follower
/// rejection after which no read went to a follower, and the reads since.
fn follow_reads(state: &mut ClientState, call: &Call, attempt: &Attempt, at: impl Fn() -> AttemptAt) {
    let on_follower = matches!(attempt.served_role, known::FOLLOWER | known::OBSERVER);
    let follower_mode = attempt.follower_read == Some(true);
    if attempt.ok && on_follower && follower_mode {
        state.used_followers = true;
        state.last_follower_consistency = attempt.consistency;
        state.rejection = None;
        return;
    }
    if !attempt.ok && on_follower && follower_mode {
        state.rejection =
            Some(Rejection::new(at(), state.used_followers, state.last_follower_consistency, attempt.end));
        return;
    }
    if let Some(rejection) = &mut state.rejection
        && attempt.ok
        && rejection.counts(attempt.served_by, attempt.consistency)
        && rejection.origin.call.call_id != call.call_id
    {
        rejection.count(attempt.consistency, attempt.end);
    }
}

/// follower_read_disabled from the client's own log lines, one read attempt at a time (before
/// [`follow_reads`] counts the attempt): each line takes effect before the first read that
/// starts after it, as the batch detector walks them.
fn follow_logged(state: &mut ClientState, lines: &[(UnixNanos, Sym)], attempt: &Attempt) {
    while let Some(&origin) = lines.get(state.logged_next).filter(|(time, _)| *time <= attempt.start) {
        state.logged = Some(logged_disable(state, origin));
        state.logged_next += 1;
    }
    let on_follower = matches!(attempt.served_role, known::FOLLOWER | known::OBSERVER);
    if attempt.ok && on_follower && attempt.follower_read == Some(true) {
        state.logged = None;
    } else if let Some(logged) =
        state.logged.as_mut().filter(|logged| attempt.ok && logged.counts(attempt.served_by, attempt.consistency))
    {
        logged.count(attempt.consistency, attempt.end);
    }
}

fn logged_disable(state: &ClientState, origin: (UnixNanos, Sym)) -> super::client::LoggedDisable {
    super::client::LoggedDisable::new(origin, state.used_followers, state.last_follower_consistency, origin.0)
}

/// blind_failover_probe, one attempt to a cluster URL at a time: extends the run of failed
/// sends, or returns the run it ends.
fn failing_sends(state: &mut ClientState, attempt: &Attempt, at: impl Fn() -> AttemptAt) -> Option<FailingRun> {
    let failed = !attempt.ok;
    let same_address = state.failing.as_ref().is_none_or(|run| run.address == attempt.server_address);
    if failed && same_address {
        let run = state.failing.get_or_insert_with(|| FailingRun {
            first: at(),
            address: attempt.server_address,
            end: attempt.end,
            sends: 0,
        });
        run.end = attempt.end;
        run.sends += 1;
        return None;
    }
    let ended = state.failing.take();
    if failed {
        state.failing = Some(FailingRun { first: at(), address: attempt.server_address, end: attempt.end, sends: 1 });
    }
    ended
}

/// failover_flapping, one attempt to a cluster URL at a time: records a switch, and returns
/// the run of quick switches a slow one ends.
fn switches(
    state: &mut ClientState,
    attempt: &Attempt,
    at: impl Fn() -> AttemptAt,
    min_gap: i64,
    early: impl Fn(UnixNanos, Sym, Sym) -> Option<failover_flapping::EarlySwitch>,
) -> Option<Vec<super::client::Switch>> {
    if !state.last_address.is_some() || state.last_address == attempt.server_address {
        return None;
    }
    let (from, to) = (state.last_address, attempt.server_address);
    let switch = (attempt.start, from, to, at(), early(attempt.start, from, to));
    let ended = match state.switches.last() {
        Some(previous) if switch.0.saturating_sub(previous.0) >= min_gap => Some(std::mem::take(&mut state.switches)),
        _ => None,
    };
    state.switches.push(switch);
    ended.filter(|run| run.len() >= 2)
}

/// Runs of at least `min_attempts` consecutive refused attempts of a call, sent straight to
/// one server, refused the same way (indexes into the call's attempts).
fn pinned_runs(call: &Call, min_attempts: usize) -> Vec<Vec<usize>> {
    pinned_retry::run_indexes(
        &call.attempts,
        min_attempts,
        |attempt| !attempt.ok && !attempt.router_node.is_some() && attempt.answered_by().is_some(),
        |last, attempt| last.answered_by() == attempt.answered_by() && last.error_type == attempt.error_type,
    )
}

/// A run of attempts pinned to one node, waiting until the answers given by other nodes
/// within it are all known.
struct PendingPinned {
    start: UnixNanos,
    end: UnixNanos,
    node: Sym,
    /// The namespace's (cluster, namespace), whose answers are read.
    scope: (Sym, Sym),
    /// The client's identity (its state may be evicted by then).
    client: ClientTimeline,
    call: Rc<Call>,
    run: Vec<usize>,
}

impl PendingPinned {
    /// The anomaly, if another node of the namespace served within the run.
    fn judge(self, interner: &Interner, scope: Option<&NamespaceState>) -> Option<Anomaly> {
        let others: BTreeSet<&str> = scope?
            .served
            .within(self.start, self.end)
            .map(|fact| fact.node)
            .filter(|other| *other != self.node)
            .filter_map(|other| interner.get(other))
            .collect();
        if others.is_empty() {
            return None;
        }
        let call = self.call.materialize(interner);
        let attempts: Vec<&lagscope_model::TimelineAttempt> =
            self.run.iter().map(|index| &call.attempts[*index]).collect();
        let node = interner.get(self.node).unwrap_or_default();
        Some(pinned_retry::pinned(&self.client, &call, &attempts, node, &others))
    }
}

/// An anomaly found on compact data, to be built once with the shared constructors.
enum Raise {
    Regression { index: usize, carried: StateId, seen: Contribution },
    Dropped { index: usize, carried: StateId, forwarded: StateId },
    Stale { index: usize, served: StateId, floor: Contribution },
    CrossClient { index: usize, served: StateId, staleness: f64, bound: i64, replaced_at: i64, newer_state: StateId },
    Failing(FailingRun),
    Flapping(Vec<super::client::Switch>),
}

/// The client's identity as the constructors want it (a timeline without calls).
fn identity(interner: &Interner, state: &ClientState) -> ClientTimeline {
    ClientTimeline {
        client_id: interner.owned(state.client).unwrap_or_default(),
        namespace: interner.owned(state.namespace),
        cluster: interner.owned(state.cluster),
        system: interner.owned(state.system),
        calls: Vec::new(),
    }
}

/// The anomalies raised on one processed call of the client `state` keeps, built.
fn build_anomalies(
    interner: &Interner,
    state: &ClientState,
    call: &Call,
    raised: Vec<Raise>,
    probes: &BTreeMap<ProbeKey, VecDeque<(UnixNanos, f64)>>,
    config: &AnalyzerConfig,
) -> Vec<Anomaly> {
    let timeline = identity(interner, state);
    raised.into_iter().filter_map(|raise| raise.build(interner, state, &timeline, Some(call), probes, config)).collect()
}

impl Raise {
    fn build(
        self,
        interner: &Interner,
        state: &ClientState,
        timeline: &ClientTimeline,
        this: Option<&Call>,
        probes: &BTreeMap<ProbeKey, VecDeque<(UnixNanos, f64)>>,
        config: &AnalyzerConfig,
    ) -> Option<Anomaly> {
        // The call read in place (the constructors of the kinds raised most), or built whole.
        let view = |call| CallIn { call, interner };
        let current = || this.map(view);
        let materialized = || this.map(|call| call.materialize(interner));
        Some(match self {
            Raise::Regression { index, carried, seen } => {
                let this = current()?;
                let attempt = this.attempt(index);
                let seen_floor = seen.floor();
                let earlier = state.recent.iter().rev().map(|earlier| view(earlier));
                let overwriting = carried_state_regression::overwritten_by(earlier, &attempt, carried, &seen_floor);
                carried_state_regression::regression(
                    timeline,
                    &this,
                    &attempt,
                    carried,
                    &seen_floor,
                    &view(&seen.at.call),
                    overwriting.as_ref(),
                )
            }
            Raise::Dropped { index, carried, forwarded } => {
                let this = current()?;
                router_state_dropped::dropped(timeline, &this, &this.attempt(index), carried, forwarded)
            }
            Raise::Stale { index, served, floor } => {
                let this = current()?;
                stale_read::stale_read(
                    timeline,
                    &this,
                    &this.attempt(index),
                    served,
                    &floor.floor(),
                    &view(&floor.at.call),
                )
            }
            Raise::CrossClient { index, served, staleness, bound, replaced_at, newer_state } => {
                let this = &materialized()?;
                stale_read_cross_client::cross_client(
                    timeline,
                    this,
                    &this.attempts[index],
                    served,
                    staleness,
                    bound,
                    replaced_at,
                    newer_state,
                )
            }
            Raise::Failing(run) => {
                let first = run.first.attempt();
                let (start, end) = (first.start, run.end);
                if end.saturating_sub(start) < config.blind_failover_probe.min_seconds.saturating_mul(1_000_000_000) {
                    return None;
                }
                let address = interner.get(run.address).unwrap_or_default();
                let mut verdicts: Vec<(f64, &str)> = Vec::new();
                for ((_, _, _, probe_address, kind, probe_client), points) in probes {
                    if probe_address != address || !(probe_client.is_empty() || *probe_client == timeline.client_id) {
                        continue;
                    }
                    verdicts.extend(
                        points.iter().filter(|(at, _)| (start..=end).contains(at)).map(|(_, up)| (*up, kind.as_str())),
                    );
                }
                if verdicts.is_empty() || verdicts.iter().any(|(up, _)| *up < 0.5) {
                    return None;
                }
                let call = run.first.call.materialize(interner);
                blind_failover_probe::blind(
                    timeline,
                    &call.attempts[run.first.index],
                    run.sends,
                    end,
                    address,
                    verdicts[0].1,
                    verdicts.len(),
                )
            }
            Raise::Flapping(run) => {
                let materialized: Vec<lagscope_model::TimelineAttempt> =
                    run.iter().map(|(_, _, _, at, _)| at.attempt().materialize(interner)).collect();
                let name = |symbol: Sym| interner.get(symbol).unwrap_or_default();
                let switches: Vec<failover_flapping::Switch<'_>> = run
                    .iter()
                    .zip(&materialized)
                    .map(|((time, from, to, _, _), attempt)| (*time, name(*from), name(*to), attempt))
                    .collect();
                let references: Vec<&failover_flapping::Switch<'_>> = switches.iter().collect();
                let min_gap = config.failover_flapping.switch_back_delay_nanos();
                let early = run.iter().find_map(|switch| switch.4.clone());
                failover_flapping::flapping(timeline, &references, min_gap, early)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two open calls whose ids share a hash (forced here: the index entry of one id is given
    /// to the other's call) each keep their own attempts.
    #[test]
    fn calls_whose_ids_share_a_hash_keep_their_own_attempts() {
        let config = AnalyzerConfig::default();
        let mut engine = Engine::new(&config, |_| true);
        let client = engine.interner.intern("c1");
        let namespace = engine.interner.intern("ns1");
        let attempt = |call_id: &str, attempt: i64, start: i64| SpanRec {
            id: SpanKey::new(u128::from(start as u64) + 1, 1),
            start,
            end: start + 1_000_000,
            component: known::CLIENT,
            ok: attempt == 2,
            client,
            namespace,
            call_id: Some(call_id.into()),
            attempt: Some(attempt),
            ..SpanRec::default()
        };
        engine.push_span(&attempt("a", 1, 0));
        let a = engine.find_open(client, namespace, "a", 0).expect("call a is open");
        engine.open_index.insert(call_key(client, namespace, "b"), a);
        engine.push_span(&attempt("b", 1, 2_000_000));
        assert_eq!(engine.open_collisions.len(), 1);
        engine.push_span(&attempt("b", 2, 4_000_000));
        engine.push_span(&attempt("a", 2, 6_000_000));
        let b = engine.find_open(client, namespace, "b", 4_000_000).expect("call b is open");
        assert_ne!(a, b);
        for (call, id) in [(a, "a"), (b, "b")] {
            let open = engine.current(call).expect("open");
            assert_eq!(engine.call_ids[call.slot()].as_deref(), Some(id));
            assert_eq!(open.held.len(), 2, "call {id}");
        }
        let (_, stats) = engine.finish();
        assert_eq!(stats.calls, 2);
    }

    /// An attempt of a call id that starts more than a horizon after the open call of that id
    /// began is another call (a client restarted under its client id counts its calls again),
    /// even when it arrives before the engine has processed the first; the open index then
    /// finds the later call for the later call's attempts.
    #[test]
    fn a_call_id_again_after_a_horizon_is_another_call() {
        let config = AnalyzerConfig::default();
        let horizon = config.stream.horizon();
        let mut engine = Engine::new(&config, |_| true);
        let client = engine.interner.intern("c1");
        let namespace = engine.interner.intern("ns1");
        let attempt = |attempt: i64, start: i64| SpanRec {
            id: SpanKey::new(u128::from(start as u64) + 1, 1),
            start,
            end: start + 1_000_000,
            component: known::CLIENT,
            client,
            namespace,
            call_id: Some("1".into()),
            attempt: Some(attempt),
            ..SpanRec::default()
        };
        engine.push_span(&attempt(0, 0));
        let first = engine.find_open(client, namespace, "1", 0).expect("the first call is open");
        let later = horizon + 1;
        assert_eq!(engine.find_open(client, namespace, "1", later), None);
        // Checked before the push processes the first call: its attempt opens a call of its own.
        engine.push_attempt(&attempt(0, later));
        let second = engine.find_open(client, namespace, "1", later).expect("the later call is open");
        assert_ne!(first, second);
        engine.push_attempt(&attempt(1, later + 1_000_000));
        assert_eq!(engine.current(second).expect("open").held.len(), 2);
        assert_eq!(engine.current(first).expect("open").held.len(), 1);
        let (_, stats) = engine.finish();
        assert_eq!(stats.calls, 2);
    }

    /// Router/server spans whose client attempt never comes are dropped a horizon after they
    /// ended and counted, and their traces are forgotten: the table of waiting traces stays
    /// bounded however long such spans keep coming.
    #[test]
    fn hops_that_never_join_are_dropped_counted_and_their_traces_forgotten() {
        let config = AnalyzerConfig::default();
        let mut engine = Engine::new(&config, |_| true);
        let mut most = 0;
        for second in 0..2_000_i64 {
            let start = second * 1_000_000_000;
            engine.push_span(&SpanRec {
                id: SpanKey::new(second as u128 + 1, 7),
                parent_span_id: 3,
                start,
                end: start + 1_000_000,
                component: known::SERVER,
                ..SpanRec::default()
            });
            most = most.max(engine.traces.places.len());
        }
        // One a second: a horizon's worth (90) waiting, and at most a minute's dropped ones
        // whose traces the next pruning sweeps out.
        assert!((90..=160).contains(&most), "{most} traces waiting at most");
        let (_, stats) = engine.finish();
        assert_eq!(stats.unjoined_hops, 2_000);
    }
}
