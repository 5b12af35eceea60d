//! The streaming engine: spans in (in roughly the order they ended), anomalies out, with
//! memory bounded by what is in flight and by per-client state, never by history length.
//!
//! - Join: router and server spans wait in `pending` (by span id, with a child index) until
//!   the client attempt they descend from is finalized; spans without trace context wait by
//!   (client, call id). Whatever never joins is evicted two horizons after it ended.
//! - Calls: a client's attempts gather by call id until the data's watermark (the latest end
//!   time seen) passes the call's start by the horizon; then the call is final and handed to
//!   its client's state, in start order across all clients.
//! - Clients: per (client, namespace), the floors (read-your-writes, monotonic reads) and the
//!   highest state seen, folded from earlier calls as they complete, exactly as the batch
//!   path's sweep does; a few recent calls for causes.
//!
//! The anomalies are built by the same functions as the batch detectors', so a streamed and
//! a batch analysis of the same telemetry agree (tested on every simulator scenario).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::rc::Rc;

use lagscope_model::{
    Anomaly, AnomalyKind, ClientTimeline, Op, Outcome, SpanRef, StateId, TimelineAttempt, TimelineCall, TimelineJoin,
    UnixNanos,
};
use rustc_hash::FxHashMap;

use super::intern::{Interner, Sym, known};
use super::record::{SpanKey, SpanRec};
use crate::AnalyzerConfig;
use crate::detectors::{carried_state_regression, router_state_dropped, stale_read};
use crate::floor::{CallFloors, FloorContribution, FloorSource};

/// How far up a trace the join looks for the client attempt (as the batch join).
const MAX_PARENT_HOPS: usize = 32;
/// Calls per client kept for causes that look back (a lower state brought back by a later
/// response, HDFS-16837).
const RECENT_CALLS: usize = 16;

/// The kinds the streaming engine detects so far.
pub const STREAMED_KINDS: &[AnomalyKind] =
    &[AnomalyKind::StaleRead, AnomalyKind::CarriedStateRegression, AnomalyKind::RouterStateDropped];

/// What the engine did, for progress output and benchmarks.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EngineStats {
    pub spans: u64,
    pub calls: u64,
    /// Client attempts that arrived after their call had been finalized (later than the
    /// horizon); each was analyzed as a call of its own.
    pub late_attempts: u64,
    /// Router/server spans that never found their client attempt.
    pub unjoined_hops: u64,
    /// Spans waiting to be joined, and calls waiting to be final, at their most.
    pub peak_pending_spans: usize,
    pub peak_open_calls: usize,
    pub clients: usize,
}

/// A span reference in compact form.
#[derive(Debug, Clone, Copy)]
struct Ref {
    id: SpanKey,
    service: Sym,
    node: Sym,
}

impl Ref {
    fn of(span: &SpanRec) -> Self {
        Self { id: span.id, service: span.service, node: span.node }
    }

    fn materialize(&self, interner: &Interner) -> SpanRef {
        SpanRef {
            trace_id: self.id.is_some().then(|| format!("{:032x}", self.id.trace_id)),
            span_id: self.id.is_some().then(|| format!("{:016x}", self.id.span_id)),
            service_name: interner.owned(self.service),
            node_id: interner.owned(self.node),
        }
    }
}

/// One attempt joined across client, router and server (a compact `TimelineAttempt`).
#[derive(Debug, Clone)]
struct Attempt {
    attempt: Option<i64>,
    start: UnixNanos,
    end: UnixNanos,
    client_span: Ref,
    routers: Vec<Ref>,
    servers: Vec<Ref>,
    join: TimelineJoin,
    target_node: Sym,
    target_role: Sym,
    router_node: Sym,
    served_by: Sym,
    served_role: Sym,
    carried: Option<StateId>,
    router_carried: Option<StateId>,
    router_state: Option<StateId>,
    served: Option<StateId>,
    returned: Option<StateId>,
    committed: Option<StateId>,
    consistency: Sym,
    follower_read: Option<bool>,
    server_address: Sym,
    ok: bool,
    outcome: Sym,
    error_type: Sym,
    requeues: Option<i64>,
}

impl Attempt {
    fn materialize(&self, interner: &Interner) -> TimelineAttempt {
        let outcome =
            if self.ok { Outcome::Ok } else { interner.get(self.outcome).map_or(Outcome::Error, Outcome::parse) };
        TimelineAttempt {
            attempt: self.attempt,
            start_unix_nano: self.start,
            end_unix_nano: self.end,
            client_span: self.client_span.materialize(interner),
            router_spans: self.routers.iter().map(|span| span.materialize(interner)).collect(),
            server_spans: self.servers.iter().map(|span| span.materialize(interner)).collect(),
            join: self.join,
            target_node: interner.owned(self.target_node),
            target_role: interner.owned(self.target_role),
            router_node: interner.owned(self.router_node),
            served_by: interner.owned(self.served_by),
            served_role: interner.owned(self.served_role),
            carried: self.carried,
            router_carried: self.router_carried,
            router_state: self.router_state,
            served: self.served,
            returned: self.returned,
            committed: self.committed,
            consistency: interner.owned(self.consistency),
            follower_read: self.follower_read,
            server_address: interner.owned(self.server_address),
            outcome: Some(outcome),
            error_type: interner.owned(self.error_type),
            requeues: self.requeues,
            reported: Default::default(),
        }
    }
}

/// One final call (a compact `TimelineCall`).
#[derive(Debug)]
struct Call {
    call_id: Option<Box<str>>,
    op: Sym,
    rpc_method: Sym,
    start: UnixNanos,
    end: UnixNanos,
    attempts: Vec<Attempt>,
}

impl Call {
    fn materialize(&self, interner: &Interner) -> TimelineCall {
        TimelineCall {
            call_id: self.call_id.as_deref().map(str::to_string),
            op: interner.get(self.op).map(Op::parse),
            rpc_method: interner.owned(self.rpc_method),
            start_unix_nano: self.start,
            end_unix_nano: self.end,
            attempts: self.attempts.iter().map(|attempt| attempt.materialize(interner)).collect(),
            floor: None,
        }
    }
}

/// A state the client saw, and the call and attempt it came from.
#[derive(Debug, Clone)]
struct Contribution {
    state: StateId,
    completed: UnixNanos,
    source: FloorSource,
    call: Rc<Call>,
    attempt_index: usize,
}

impl Contribution {
    fn floor(&self) -> FloorContribution {
        FloorContribution {
            state: self.state,
            call_index: 0,
            attempt_index: self.attempt_index,
            source: self.source,
            completed_unix_nano: self.completed,
        }
    }
}

/// Everything the engine keeps about one (client, namespace).
#[derive(Debug)]
struct ClientState {
    client: Sym,
    namespace: Sym,
    cluster: Sym,
    system: Sym,
    /// Floor contributions of processed calls not yet completed at the latest call's start.
    pending_floor: Vec<Contribution>,
    /// The same for the highest state seen (carried-state regressions).
    pending_seen: Vec<Contribution>,
    writes: Option<Contribution>,
    reads: Option<Contribution>,
    seen: Option<Contribution>,
    recent: VecDeque<Rc<Call>>,
}

/// A call still gathering attempts.
#[derive(Debug)]
struct OpenCall {
    client: Sym,
    namespace: Sym,
    attempts: Vec<SpanRec>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum CallKey {
    Id(Box<str>),
    Lone(u64),
}

type OpenKey = (Sym, Sym, CallKey);

/// What the eviction queue remembers of a waiting span.
#[derive(Debug)]
enum Waiting {
    Traced(SpanKey),
    ByCall(Sym, Box<str>),
}

/// The streaming analyzer. Feed it spans with [`Engine::push_span`], then [`Engine::finish`].
pub struct Engine<'c> {
    config: &'c AnalyzerConfig,
    stale_read: bool,
    carried_state_regression: bool,
    router_state_dropped: bool,
    pub interner: Interner,
    horizon: i64,
    watermark: i64,
    sequence: u64,
    pending: FxHashMap<SpanKey, SpanRec>,
    children: FxHashMap<SpanKey, Vec<SpanKey>>,
    by_call: FxHashMap<(Sym, Box<str>), Vec<SpanRec>>,
    waiting: VecDeque<(UnixNanos, Waiting)>,
    open: FxHashMap<OpenKey, OpenCall>,
    queue: BinaryHeap<Reverse<(UnixNanos, u64, OpenKey)>>,
    clients: FxHashMap<(Sym, Sym), ClientState>,
    anomalies: Vec<Anomaly>,
    stats: EngineStats,
}

impl<'c> Engine<'c> {
    /// An engine running the streamed detectors whose kind `wanted` accepts.
    pub fn new(config: &'c AnalyzerConfig, wanted: impl Fn(AnomalyKind) -> bool) -> Self {
        Self {
            config,
            stale_read: wanted(AnomalyKind::StaleRead),
            carried_state_regression: wanted(AnomalyKind::CarriedStateRegression),
            router_state_dropped: wanted(AnomalyKind::RouterStateDropped),
            interner: Interner::default(),
            horizon: config.stream_horizon_seconds.max(1).saturating_mul(1_000_000_000),
            watermark: i64::MIN,
            sequence: 0,
            pending: FxHashMap::default(),
            children: FxHashMap::default(),
            by_call: FxHashMap::default(),
            waiting: VecDeque::new(),
            open: FxHashMap::default(),
            queue: BinaryHeap::new(),
            clients: FxHashMap::default(),
            anomalies: Vec::new(),
            stats: EngineStats::default(),
        }
    }

    pub fn stats(&self) -> EngineStats {
        EngineStats { clients: self.clients.len(), ..self.stats }
    }

    /// Takes one span (its symbols from [`Engine::interner`]).
    pub fn push_span(&mut self, span: SpanRec) {
        self.stats.spans += 1;
        if span.end > self.watermark {
            self.watermark = span.end;
        }
        if span.is_client_attempt() {
            self.push_attempt(span);
        } else {
            self.push_hop(span);
        }
        if self.stats.spans.is_multiple_of(1024) {
            self.advance();
        }
    }

    /// Finalizes everything still open and returns the anomalies, ordered as the batch
    /// analyzer orders them.
    pub fn finish(mut self) -> (Vec<Anomaly>, EngineStats) {
        self.watermark = i64::MAX;
        self.advance();
        let mut anomalies = std::mem::take(&mut self.anomalies);
        crate::sort_anomalies(&mut anomalies);
        (anomalies, self.stats())
    }

    fn push_attempt(&mut self, span: SpanRec) {
        let key = match &span.call_id {
            Some(call_id) => CallKey::Id(call_id.clone()),
            None => {
                self.sequence += 1;
                CallKey::Lone(self.sequence)
            }
        };
        self.clients.entry((span.client, span.namespace)).or_insert_with(|| ClientState {
            client: span.client,
            namespace: span.namespace,
            cluster: span.cluster,
            system: span.system,
            pending_floor: Vec::new(),
            pending_seen: Vec::new(),
            writes: None,
            reads: None,
            seen: None,
            recent: VecDeque::new(),
        });
        if span.start.saturating_add(self.horizon) < self.watermark {
            self.stats.late_attempts += 1;
        }
        let open_key = (span.client, span.namespace, key);
        match self.open.get_mut(&open_key) {
            Some(open) => open.attempts.push(span),
            None => {
                self.sequence += 1;
                self.queue.push(Reverse((span.start, self.sequence, open_key.clone())));
                self.open.insert(
                    open_key,
                    OpenCall { client: span.client, namespace: span.namespace, attempts: vec![span] },
                );
                self.stats.peak_open_calls = self.stats.peak_open_calls.max(self.open.len());
            }
        }
    }

    fn push_hop(&mut self, span: SpanRec) {
        let hop = matches!(span.component, known::ROUTER | known::SERVER);
        if span.id.is_some() {
            if span.parent_span_id != 0 {
                let parent = SpanKey { trace_id: span.id.trace_id, span_id: span.parent_span_id };
                self.children.entry(parent).or_default().push(span.id);
            }
            if hop && span.client.is_some() && span.call_id.is_some() {
                // Also joinable by call id, should its trace lead to no client attempt.
                let call_id = span.call_id.clone().unwrap_or_default();
                self.by_call.entry((span.client, call_id.clone())).or_default().push(span.clone());
                self.waiting.push_back((span.end, Waiting::ByCall(span.client, call_id)));
            }
            self.waiting.push_back((span.end, Waiting::Traced(span.id)));
            self.pending.insert(span.id, span);
            self.stats.peak_pending_spans = self.stats.peak_pending_spans.max(self.pending.len());
        } else if hop && let (true, Some(call_id)) = (span.client.is_some(), span.call_id.clone()) {
            self.waiting.push_back((span.end, Waiting::ByCall(span.client, call_id.clone())));
            self.by_call.entry((span.client, call_id)).or_default().push(span);
        }
    }

    /// Finalizes the calls the watermark has passed, then evicts what can no longer join.
    fn advance(&mut self) {
        let final_before = self.watermark.saturating_sub(self.horizon);
        while let Some(Reverse((start, _, _))) = self.queue.peek() {
            if *start >= final_before {
                break;
            }
            let Some(Reverse((_, _, key))) = self.queue.pop() else { break };
            if let Some(open) = self.open.remove(&key) {
                self.finalize(key.2, open);
            }
        }
        let evict_before = final_before.saturating_sub(self.horizon);
        while let Some((end, _)) = self.waiting.front() {
            if *end >= evict_before {
                break;
            }
            let Some((_, waiting)) = self.waiting.pop_front() else { break };
            match waiting {
                Waiting::Traced(key) => {
                    if let Some(span) = self.pending.remove(&key) {
                        self.children.remove(&key);
                        if matches!(span.component, known::ROUTER | known::SERVER) {
                            self.stats.unjoined_hops += 1;
                        }
                    }
                }
                Waiting::ByCall(client, call_id) => {
                    self.by_call.remove(&(client, call_id));
                }
            }
        }
    }

    fn finalize(&mut self, key: CallKey, open: OpenCall) {
        self.stats.calls += 1;
        let OpenCall { client, namespace, mut attempts } = open;
        attempts.sort_by_key(|span| (span.attempt, span.start));
        let mut hops: Vec<(Vec<SpanRec>, TimelineJoin)> = attempts
            .iter()
            .map(|attempt| {
                let traced = self.descendants(attempt.id);
                let join = if traced.is_empty() { TimelineJoin::ClientOnly } else { TimelineJoin::TraceContext };
                (traced, join)
            })
            .collect();
        if let CallKey::Id(call_id) = &key
            && let Some(untraced) = self.by_call.remove(&(client, call_id.clone()))
        {
            for hop in untraced {
                // A traced hop already joined through its trace is not joined twice.
                if hop.id.is_some() && self.pending.remove(&hop.id).is_none() {
                    continue;
                }
                let nearest = (0..attempts.len()).min_by_key(|index| {
                    let attempt = &attempts[*index];
                    (attempt.attempt != hop.attempt || hop.attempt.is_none(), distance_to(attempt, hop.start))
                });
                if let Some(index) = nearest {
                    let (list, join) = &mut hops[index];
                    if *join == TimelineJoin::ClientOnly {
                        *join = TimelineJoin::CallId;
                    }
                    list.push(hop);
                }
            }
        }
        let joined: Vec<Attempt> = attempts
            .iter()
            .zip(hops)
            .map(|(client_span, (hops, join))| build_attempt(client_span, hops, join))
            .collect();
        let first = &attempts[0];
        let call = Rc::new(Call {
            call_id: first.call_id.clone(),
            op: first.op,
            rpc_method: first.rpc_method,
            start: joined.iter().map(|attempt| attempt.start).min().unwrap_or_default(),
            end: joined.iter().map(|attempt| attempt.end).max().unwrap_or_default(),
            attempts: joined,
        });
        self.process(client, namespace, call);
    }

    /// The router and server spans under the client attempt `root`, taken out of `pending`.
    fn descendants(&mut self, root: SpanKey) -> Vec<SpanRec> {
        let mut found = Vec::new();
        if !root.is_some() {
            return found;
        }
        let mut frontier = vec![(root, 0)];
        while let Some((parent, depth)) = frontier.pop() {
            if depth >= MAX_PARENT_HOPS {
                continue;
            }
            let Some(children) = self.children.remove(&parent) else { continue };
            for child in children {
                if let Some(span) = self.pending.remove(&child) {
                    frontier.push((child, depth + 1));
                    if matches!(span.component, known::ROUTER | known::SERVER) {
                        found.push(span);
                    }
                }
            }
        }
        found
    }

    /// Runs the per-client detectors over a final call, then folds it into the client's state.
    fn process(&mut self, client: Sym, namespace: Sym, call: Rc<Call>) {
        let Some(state) = self.clients.get_mut(&(client, namespace)) else { return };
        fold(state, call.start);
        let mut raised = Vec::new();
        for (attempt_index, attempt) in call.attempts.iter().enumerate() {
            if self.carried_state_regression
                && let (Some(seen), Some(carried)) = (&state.seen, attempt.carried)
                && seen.state.saturating_sub(carried) >= self.config.carried_state_regression.min_states_behind.max(1)
            {
                raised.push(Raise::Regression { attempt_index, carried, seen: seen.clone() });
            }
            if self.router_state_dropped
                && let (Some(carried), Some(forwarded)) = (attempt.carried, attempt.router_carried)
                && carried.saturating_sub(forwarded) >= self.config.router_state_dropped.min_states_behind.max(1)
            {
                raised.push(Raise::Dropped { attempt_index, carried, forwarded });
            }
            if self.stale_read
                && call.op == known::READ
                && attempt.ok
                && let Some(served) = attempt.served
                && !stale_read::exempt(self.interner.get(attempt.consistency), self.config)
            {
                let floors = CallFloors {
                    writes: state.writes.as_ref().map(Contribution::floor),
                    reads: state.reads.as_ref().map(Contribution::floor),
                };
                if let Some(broken) = floors.broken_by(served, self.config.stale_read.min_states_behind) {
                    let floor = match broken.source {
                        FloorSource::Write => state.writes.clone(),
                        FloorSource::Read => state.reads.clone(),
                    };
                    if let Some(floor) = floor {
                        raised.push(Raise::Stale { attempt_index, served, floor });
                    }
                }
            }
        }
        if !raised.is_empty() {
            let anomalies = materialize(&self.interner, state, &call, raised);
            self.anomalies.extend(anomalies);
        }
        contribute(state, &call);
    }
}

/// An anomaly found on compact data, to be built once with the shared constructors.
enum Raise {
    Regression { attempt_index: usize, carried: StateId, seen: Contribution },
    Dropped { attempt_index: usize, carried: StateId, forwarded: StateId },
    Stale { attempt_index: usize, served: StateId, floor: Contribution },
}

fn materialize(interner: &Interner, state: &ClientState, call: &Call, raised: Vec<Raise>) -> Vec<Anomaly> {
    let timeline = ClientTimeline {
        client_id: interner.owned(state.client).unwrap_or_default(),
        namespace: interner.owned(state.namespace),
        cluster: interner.owned(state.cluster),
        system: interner.owned(state.system),
        calls: Vec::new(),
    };
    let this = call.materialize(interner);
    raised
        .into_iter()
        .map(|raise| match raise {
            Raise::Regression { attempt_index, carried, seen } => {
                let attempt = &this.attempts[attempt_index];
                let seen_call = seen.call.materialize(interner);
                let overwriting = state
                    .recent
                    .iter()
                    .rev()
                    .find(|earlier| {
                        earlier.end <= attempt.start_unix_nano
                            && earlier.end >= seen.completed
                            && earlier.attempts.iter().any(|earlier_attempt| earlier_attempt.returned == Some(carried))
                    })
                    .map(|earlier| earlier.materialize(interner));
                let floor = seen.floor();
                carried_state_regression::regression(
                    &timeline,
                    &this,
                    attempt,
                    carried,
                    &floor,
                    &seen_call,
                    overwriting.as_ref(),
                )
            }
            Raise::Dropped { attempt_index, carried, forwarded } => {
                router_state_dropped::dropped(&timeline, &this, &this.attempts[attempt_index], carried, forwarded)
            }
            Raise::Stale { attempt_index, served, floor } => {
                let floor_call = floor.call.materialize(interner);
                stale_read::stale_read(
                    &timeline,
                    &this,
                    &this.attempts[attempt_index],
                    served,
                    &floor.floor(),
                    &floor_call,
                )
            }
        })
        .collect()
}

/// Folds every contribution completed by `start` into the floors and the highest seen state,
/// in completion order (ties in processing order), as the batch sweep does.
fn fold(state: &mut ClientState, start: UnixNanos) {
    for contribution in ready(&mut state.pending_floor, start) {
        let slot = match contribution.source {
            FloorSource::Write => &mut state.writes,
            FloorSource::Read => &mut state.reads,
        };
        raise(slot, contribution);
    }
    for contribution in ready(&mut state.pending_seen, start) {
        raise(&mut state.seen, contribution);
    }
}

/// The contributions of `list` completed by `start`, in completion order, taken out.
fn ready(list: &mut Vec<Contribution>, start: UnixNanos) -> Vec<Contribution> {
    if list.iter().all(|contribution| contribution.completed > start) {
        return Vec::new();
    }
    list.sort_by_key(|contribution| contribution.completed);
    let ready = list.partition_point(|contribution| contribution.completed <= start);
    list.drain(..ready).collect()
}

fn raise(slot: &mut Option<Contribution>, contribution: Contribution) {
    if slot.as_ref().is_none_or(|current| contribution.state > current.state) {
        *slot = Some(contribution);
    }
}

/// What a processed call adds: its floor contribution (a write's returned state, a read's
/// served state), the highest state it returned, and a place among the recent calls.
fn contribute(state: &mut ClientState, call: &Rc<Call>) {
    let successful = || call.attempts.iter().enumerate().filter(|(_, attempt)| attempt.ok);
    let floor_source = match call.op {
        known::WRITE => Some(FloorSource::Write),
        known::READ => Some(FloorSource::Read),
        _ => None,
    };
    if let Some(source) = floor_source {
        let best = last_max(successful().filter_map(|(index, attempt)| {
            let value = if source == FloorSource::Write { attempt.returned } else { attempt.served };
            Some((value?, index, attempt.end))
        }));
        if let Some((value, attempt_index, completed)) = best {
            state.pending_floor.push(Contribution {
                state: value,
                completed,
                source,
                call: call.clone(),
                attempt_index,
            });
        }
    }
    let seen_source = if call.op == known::WRITE { FloorSource::Write } else { FloorSource::Read };
    let best = last_max(successful().filter_map(|(index, attempt)| Some((attempt.returned?, index, attempt.end))));
    if let Some((value, attempt_index, completed)) = best {
        state.pending_seen.push(Contribution {
            state: value,
            completed,
            source: seen_source,
            call: call.clone(),
            attempt_index,
        });
    }
    if state.recent.len() == RECENT_CALLS {
        state.recent.pop_front();
    }
    state.recent.push_back(call.clone());
}

/// The last of the highest values (as `Iterator::max_by_key` picks).
fn last_max(items: impl Iterator<Item = (StateId, usize, UnixNanos)>) -> Option<(StateId, usize, UnixNanos)> {
    items.fold(None, |best, item| match best {
        Some(current) if current.0 > item.0 => Some(current),
        _ => Some(item),
    })
}

fn distance_to(attempt: &SpanRec, at: UnixNanos) -> i64 {
    if at < attempt.start {
        attempt.start.saturating_sub(at)
    } else if at > attempt.end {
        at.saturating_sub(attempt.end)
    } else {
        0
    }
}

/// One attempt from its client span and the router and server spans joined to it, choosing
/// the executing server and the router hop as the batch join does.
fn build_attempt(client: &SpanRec, mut hops: Vec<SpanRec>, join: TimelineJoin) -> Attempt {
    hops.sort_by_key(|span| span.start);
    let routers: Vec<&SpanRec> = hops.iter().filter(|span| span.component == known::ROUTER).collect();
    let servers: Vec<&SpanRec> = hops.iter().filter(|span| span.component == known::SERVER).collect();
    let server = servers.iter().rev().find(|span| span.ok).or(servers.last()).copied();
    let router = server
        .and_then(|server| {
            routers.iter().find(|router| router.id.is_some() && router.id.span_id == server.parent_span_id)
        })
        .or(routers.last())
        .copied();
    Attempt {
        attempt: client.attempt,
        start: client.start,
        end: client.end,
        client_span: Ref::of(client),
        routers: routers.iter().map(|span| Ref::of(span)).collect(),
        servers: servers.iter().map(|span| Ref::of(span)).collect(),
        join,
        target_node: client.target_node,
        target_role: client.target_role,
        router_node: router.map_or(Sym::NONE, |span| span.node),
        served_by: server.map_or(Sym::NONE, |span| span.node),
        served_role: server.map_or(Sym::NONE, |span| span.node_role),
        carried: client.carried,
        router_carried: router.and_then(|span| span.carried),
        router_state: router.and_then(|span| span.router_state),
        served: server.and_then(|span| span.served).or(client.served),
        returned: client
            .returned
            .or_else(|| router.and_then(|span| span.returned))
            .or_else(|| server.and_then(|span| span.returned)),
        committed: server.and_then(|span| span.committed).or(client.committed),
        consistency: client.consistency,
        follower_read: client.follower_read,
        server_address: client.server_address,
        ok: client.ok,
        outcome: client.outcome,
        error_type: client.error_type,
        requeues: server.and_then(|span| span.requeues),
    }
}
