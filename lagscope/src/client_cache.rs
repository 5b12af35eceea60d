//! The spans the live analyzer's client passes read, kept between passes.
//!
//! A client pass needs what `Store::client_spans(client, TimeRange::ALL, limit)` returns: the
//! client's newest `limit` spans, and the spans of their traces (router and server hops, other
//! clients' spans) within [`TRACE_WINDOW_NANOS`] of the client's spans in each trace. Read
//! anew on every pass, that cost about 8 µs a span, and under sustained load the client reads
//! were the larger part of every pass. Here each client passed recently is held, and a pass
//! adds what was committed since the last one ([`SpanFeed::spans_between`], one read for all
//! clients). The traces the clients' new spans joined or moved the bounds of are taken anew:
//! what the store held of them before the catch-up (one read of those traces for all
//! clients, usually empty: a trace's spans mostly arrive together), and what that read brought.
//!
//! A held client's spans are kept with their timelines ([`HeldTimelines`], each span placed
//! by its start and id): a pass joins only what changed since the last one.
//!
//! Invariant: every held client holds exactly what that read would return as of span id
//! `through`, in its order (start time, then id); spans are kept with their ids, so that one
//! span reached two ways is held once.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Instant;

use crate::held::{self, CATCH_UP_LIMIT, Committed, LateSpans, shed, start_catch_up};
use lagscope_analyzer::{HeldTimelines, SpanKey};
use lagscope_model::{Span, UnixNanos};
use lagscope_store::{SpanFeed, StoreError, TRACE_WINDOW_NANOS};

#[derive(Debug)]
pub struct ClientCache {
    /// The most spans held over all clients; 0 holds none.
    budget: usize,
    clients: HashMap<String, Held>,
    /// Every held client is up to date as of this span id.
    through: i64,
    /// Spans held over all clients.
    held: usize,
    /// A call id names one call for this long ([`HeldTimelines::new`]).
    horizon: UnixNanos,
    /// Spans that reached a held client after its timelines were settled past them, and the
    /// clients let go for them.
    late: LateSpans<String>,
}

#[derive(Debug)]
struct Held {
    /// What the store's read returns, ordered by (start, id), with the timelines they join
    /// into.
    spans: HeldTimelines,
    /// The client's own newest `limit` spans, by (start, id): the trace each is in, and
    /// whether it has a span id (without one, a span is taken only as the client's own).
    own: BTreeMap<(i64, i64), (Option<String>, bool)>,
    /// The traces of those spans: each own span's (start, id, end), for the trace's window.
    traces: HashMap<String, Vec<(i64, i64, i64)>>,
    /// The keys of the held spans of each trace (a span without a trace is held only as one
    /// of the client's own): what leaves when a trace's window moves, without a look at every
    /// span held.
    trace_keys: HashMap<String, Vec<SpanKey>>,
    /// The clusters its own spans came from (their resources'): whose recognised log lines its
    /// passes read.
    clusters: BTreeSet<Option<String>>,
    last_passed: Instant,
}

impl ClientCache {
    /// At most `budget` spans over all clients; a call id names one call for `horizon`.
    pub fn new(budget: usize, horizon: UnixNanos) -> Self {
        Self { budget, clients: HashMap::new(), through: 0, held: 0, horizon, late: LateSpans::new(horizon) }
    }

    /// Spans held over all clients.
    pub fn held(&self) -> usize {
        self.held
    }

    /// The spans that reached a held client too late for its timelines
    /// ([`HeldTimelines::is_late`]), and the clients let go for them, to be read anew.
    pub fn late(&mut self) -> &mut LateSpans<String> {
        &mut self.late
    }

    /// Brings every held client up to the store's newest span: reads what was committed since
    /// the last catch-up (one read; none when nothing was), gives each client its new spans
    /// and those of its traces, and takes anew the traces its new spans joined or moved the
    /// bounds of: what the store held of them before (one read for every client), then what
    /// the first read brought. When more was committed than the budget (a long stall), every
    /// client is let go and read anew when next passed. Clients not passed for [`held::IDLE_AFTER`]
    /// are let go first.
    ///
    /// Returns what that first read brought, whole ([`Committed`], none when it was cut
    /// short or not made), for the scope cache's catch-up to take its part of.
    pub async fn catch_up(
        &mut self,
        feed: &dyn SpanFeed,
        latest: i64,
        limit: u32,
        now: Instant,
    ) -> Result<Option<Committed>, StoreError> {
        start_catch_up(&mut self.clients, self.through, latest, now, "client");
        let mut committed = None;
        if !self.clients.is_empty() && latest > self.through {
            let most = self.budget.min(CATCH_UP_LIMIT);
            // Ids are handed out one per span stored (a few never committed): fewer than `most`
            // between the two ids, and the read holds fewer than `most` spans. With more, it
            // is not made: reading and decoding that many only to let them go cost a stalled
            // pass seconds more on PostgreSQL, cores that ingest needed.
            let ids = usize::try_from(latest - self.through).unwrap_or(usize::MAX);
            if ids >= most {
                tracing::info!(
                    ids,
                    clients = self.clients.len(),
                    "more spans arrived since the last pass than the client cache holds; its clients are read anew"
                );
                held::let_go_all(&mut self.clients);
            } else {
                let gained = feed.spans_between(self.through, latest, most as u32).await?;
                let index = Gained::index(&gained);
                // A client that got spans its timeline had already been settled past (their
                // calls let go, or judged without them) is let go, and read anew when passed
                // (the spans name it, so it is): judged again from the store, the late spans
                // with the calls they belong to.
                let mut late: HashSet<String> = HashSet::new();
                for (client_id, held) in &self.clients {
                    let (spans, earliest, to_hold) = held.late(client_id, &index);
                    if spans > 0 {
                        self.late.note(client_id.clone(), spans, earliest, to_hold);
                        late.insert(client_id.clone());
                    }
                }
                // Hops that name no client are the client's whose spans share their trace:
                // looked up in the store only for hops that start before some held client's
                // cut (a hop on time starts after every cut).
                let cut = self.clients.values().map(|held| held.spans.settled_through()).max().unwrap_or(i64::MIN);
                let suspects: Vec<&Span> = gained
                    .iter()
                    .map(|(_, span)| span)
                    .filter(|span| {
                        span.call.client_id.is_none() && span.trace_id.is_some() && span.start_unix_nano < cut
                    })
                    .collect();
                if !suspects.is_empty() {
                    let traces: HashSet<&str> = suspects.iter().filter_map(|span| span.trace_id.as_deref()).collect();
                    let traces: Vec<&str> = traces.into_iter().collect();
                    let mut clients_of: HashMap<String, HashSet<String>> = HashMap::new();
                    for (_, span) in feed.trace_spans_through(&traces, latest).await? {
                        if let (Some(trace), Some(client_id)) = (span.trace_id, span.call.client_id) {
                            clients_of.entry(trace).or_default().insert(client_id);
                        }
                    }
                    for hop in suspects {
                        let clients = hop.trace_id.as_deref().and_then(|trace| clients_of.get(trace));
                        for client_id in clients.into_iter().flatten() {
                            if let Some(held) = self.clients.get(client_id)
                                && !late.contains(client_id)
                                && let Some(to_hold) = held.spans.settling_to_hold(hop)
                            {
                                self.late.note(client_id.clone(), 1, hop.start_unix_nano, to_hold);
                                late.insert(client_id.clone());
                            }
                        }
                    }
                }
                held::release(late.iter().filter_map(|client_id| self.clients.remove(client_id)).collect());
                let mut rereads: Vec<(&mut Held, Vec<String>)> = Vec::new();
                for (client_id, held) in &mut self.clients {
                    let traces = held.add(client_id, &index, limit as usize);
                    if !traces.is_empty() {
                        rereads.push((held, traces));
                    }
                }
                // What the store held of those traces before this catch-up, in one read for
                // every client (what was committed since is in `gained`, whole).
                let traces: HashSet<&str> = rereads.iter().flat_map(|(_, traces)| traces).map(String::as_str).collect();
                let older = feed.trace_spans_through(&traces.into_iter().collect::<Vec<_>>(), self.through).await?;
                let older = Gained::index(&older);
                for (held, traces) in rereads {
                    held.add_traces(&traces, [&older, &index]);
                }
                committed = Some(Committed { after: self.through, through: latest, spans: gained });
            }
        }
        self.through = latest;
        self.held = shed(&mut self.clients, self.budget);
        Ok(committed)
    }

    /// A copy of the client's spans as `Store::client_spans(client_id, TimeRange::ALL, limit)`
    /// returns them as of the last catch-up ([`ClientCache::load`], then the held spans or those
    /// read), and whether they were held since an earlier pass, for the tests to compare with
    /// the store's read.
    #[cfg(test)]
    pub async fn spans(
        &mut self,
        feed: &dyn SpanFeed,
        client_id: &str,
        limit: u32,
        kept_from: Option<i64>,
        now: Instant,
    ) -> Result<(Vec<Span>, bool), StoreError> {
        let loaded = self.load(feed, client_id, limit, kept_from, now).await?;
        let was_held = matches!(loaded, Loaded::Held);
        let spans = match loaded {
            Loaded::Read(spans) => spans.into_iter().map(|(_, span)| span).collect(),
            Loaded::Held | Loaded::ReadAndHeld => {
                self.clients.get(client_id).expect("loaded").spans.spans().cloned().collect()
            }
        };
        Ok((spans, was_held))
    }

    /// A client's spans in two steps, for a pass that analyses several clients at once:
    /// brings the client's spans in, returning them when they are not held;
    /// [`ClientCache::held_mut`] then gives those that are. Loading a client never lets go
    /// of another (only a catch-up does), so every client loaded since the last catch-up stays.
    pub async fn load(
        &mut self,
        feed: &dyn SpanFeed,
        client_id: &str,
        limit: u32,
        kept_from: Option<i64>,
        now: Instant,
    ) -> Result<Loaded, StoreError> {
        let too_old =
            |spans: &HeldTimelines| kept_from.is_some_and(|from| spans.first_start().is_some_and(|first| first < from));
        if let Some(held) = self.clients.get(client_id)
            && too_old(&held.spans)
        {
            self.held -= held.spans.len();
            self.clients.remove(client_id);
        }
        if let Some(held) = self.clients.get_mut(client_id) {
            held.last_passed = now;
            return Ok(Loaded::Held);
        }
        let spans = feed.client_spans_through(client_id, self.through, limit).await?;
        let old = kept_from.is_some_and(|from| spans.iter().any(|(_, span)| span.start_unix_nano < from));
        if self.budget == 0 || old || self.held + spans.len() > self.budget {
            return Ok(Loaded::Read(spans));
        }
        let mut held = Held {
            spans: HeldTimelines::new(self.horizon),
            own: BTreeMap::new(),
            traces: HashMap::new(),
            trace_keys: HashMap::new(),
            clusters: BTreeSet::new(),
            last_passed: now,
        };
        for (id, span) in spans.iter().filter(|(_, span)| span.call.client_id.as_deref() == Some(client_id)) {
            held.own_span(*id, span);
        }
        // The client's older spans may be there too, as spans of its newest spans' traces.
        while held.own.len() > limit as usize {
            held.drop_oldest_own();
        }
        self.held += spans.len();
        for (id, span) in spans {
            held.hold(id, span);
        }
        self.clients.insert(client_id.to_string(), held);
        Ok(Loaded::ReadAndHeld)
    }

    /// Takes note of what a client's settling ([`HeldTimelines::settle`]) let go of: its own
    /// spans among them are no longer counted (nor their traces' windows taken), and the spans
    /// are freed off the pass ([`held::release`]). A trace read again later takes only what its
    /// remaining own spans' windows take; anything of a settled call that comes back is
    /// judged no more (its anomalies start before the timeline's settled cut).
    pub fn settled(&mut self, client_id: &str, let_go: Vec<(SpanKey, Span)>) {
        if let_go.is_empty() {
            return;
        }
        if let Some(held) = self.clients.get_mut(client_id) {
            for (key, span) in &let_go {
                held.forget(*key, span);
            }
            self.held = self.held.saturating_sub(let_go.len());
        }
        held::release(let_go);
    }

    /// The clusters a held client's own spans came from (none when it is not held).
    pub fn clusters_of(&self, client_id: &str) -> Option<&BTreeSet<Option<String>>> {
        self.clients.get(client_id).map(|held| &held.clusters)
    }

    /// The held ones of `clients`, to be analysed at once (each joins what changed).
    pub fn held_mut<'a>(&'a mut self, clients: &HashSet<&str>) -> HashMap<&'a str, &'a mut HeldTimelines> {
        self.clients
            .iter_mut()
            .filter(|(client_id, _)| clients.contains(client_id.as_str()))
            .map(|(client_id, held)| (client_id.as_str(), &mut held.spans))
            .collect()
    }
}

/// What [`ClientCache::load`] did.
pub enum Loaded {
    /// Held since an earlier pass.
    Held,
    /// Read now, and held from now on.
    ReadAndHeld,
    /// Read, and not held (over the budget, or older than the retention's cut-off).
    Read(Vec<(i64, Span)>),
}

/// What one catch-up read, indexed by client and by trace.
struct Gained<'a> {
    spans: &'a [(i64, Span)],
    by_client: HashMap<&'a str, Vec<usize>>,
    by_trace: HashMap<&'a str, Vec<usize>>,
    /// The earliest start of a span naming no client (`i64::MAX`: none).
    earliest_unnamed: i64,
}

impl<'a> Gained<'a> {
    fn index(spans: &'a [(i64, Span)]) -> Self {
        let (mut by_client, mut by_trace) = (HashMap::<&str, Vec<usize>>::new(), HashMap::<&str, Vec<usize>>::new());
        let mut earliest_unnamed = i64::MAX;
        for (index, (_, span)) in spans.iter().enumerate() {
            match span.call.client_id.as_deref() {
                Some(client) => by_client.entry(client).or_default().push(index),
                None => earliest_unnamed = earliest_unnamed.min(span.start_unix_nano),
            }
            if let Some(trace) = span.trace_id.as_deref() {
                by_trace.entry(trace).or_default().push(index);
            }
        }
        Self { spans, by_client, by_trace, earliest_unnamed }
    }
}

/// A store's span id as a held span's order among spans of one start (ids are positive).
fn order(id: i64) -> u64 {
    u64::try_from(id).unwrap_or_default()
}

fn id_of(order: u64) -> i64 {
    i64::try_from(order).unwrap_or(i64::MAX)
}

/// The window a trace's other spans are taken from, around the client's own spans in it.
fn window(own: &[(i64, i64, i64)]) -> (i64, i64) {
    let earliest = own.iter().map(|&(start, _, _)| start).min().unwrap_or(i64::MAX);
    let latest = own.iter().map(|&(_, _, end)| end).max().unwrap_or(i64::MIN);
    (earliest.saturating_sub(TRACE_WINDOW_NANOS), latest.saturating_add(TRACE_WINDOW_NANOS))
}

impl held::Held for Held {
    fn size(&self) -> usize {
        self.spans.len()
    }

    fn last_passed(&self) -> Instant {
        self.last_passed
    }
}

impl Held {
    fn window_of(&self, trace: &str) -> Option<(i64, i64)> {
        self.traces.get(trace).map(|own| window(own))
    }

    /// Whether the store's read takes this span: one of the client's own newest, or a span
    /// (with a span id) of one of their traces within its window.
    fn takes(&self, id: i64, span: &Span) -> bool {
        self.own.contains_key(&(span.start_unix_nano, id))
            || (span.span_id.is_some()
                && span.trace_id.as_deref().and_then(|trace| self.window_of(trace)).is_some_and(
                    |(earliest, latest)| span.start_unix_nano >= earliest && span.start_unix_nano <= latest,
                ))
    }

    /// Counts a span as one of the client's own; returns its trace.
    fn own_span(&mut self, id: i64, span: &Span) -> Option<String> {
        let key = (span.start_unix_nano, id);
        self.own.insert(key, (span.trace_id.clone(), span.span_id.is_some()));
        if !self.clusters.contains(&span.resource.cluster) {
            self.clusters.insert(span.resource.cluster.clone());
        }
        let trace = span.trace_id.clone()?;
        self.traces.entry(trace.clone()).or_default().push((key.0, id, span.end_unix_nano));
        Some(trace)
    }

    /// Drops the oldest of the client's own spans (beyond the read's limit); returns its
    /// start, id, trace, and whether it has a span id.
    fn drop_oldest_own(&mut self) -> Option<(i64, i64, Option<String>, bool)> {
        let ((start, id), (trace, has_span_id)) = self.own.pop_first()?;
        if let Some(trace) = &trace {
            self.leave_trace_window(trace, (start, id));
        }
        Some((start, id, trace, has_span_id))
    }

    /// Takes an own span (start, id) out of its trace's window.
    fn leave_trace_window(&mut self, trace: &str, own: (i64, i64)) {
        if let Some(spans) = self.traces.get_mut(trace) {
            spans.retain(|&(start, id, _)| (start, id) != own);
            if spans.is_empty() {
                self.traces.remove(trace);
            }
        }
    }

    /// Takes a held span's key out of its trace's keys.
    fn forget_trace_key(&mut self, span: &Span, key: SpanKey) {
        if let Some(trace) = &span.trace_id
            && let Some(keys) = self.trace_keys.get_mut(trace)
        {
            keys.retain(|held| *held != key);
            if keys.is_empty() {
                self.trace_keys.remove(trace);
            }
        }
    }

    /// How many of a catch-up's spans naming this client, or naming none in one of its
    /// traces, arrived too late for its held timelines ([`HeldTimelines::is_late`]). (Those
    /// naming none are looked at only when one may be: one starts before the latest cut, or
    /// the timelines let go of hops that waited for a span.)
    /// Returns how many, the earliest start among them, and the most any of them needed the
    /// settling to be to hold it ([`HeldTimelines::settling_to_hold`]).
    fn late(&self, client_id: &str, gained: &Gained<'_>) -> (u64, UnixNanos, UnixNanos) {
        let spans = gained.by_client.get(client_id).into_iter().flatten().map(|index| &gained.spans[*index].1);
        let mut late: Vec<(&Span, UnixNanos)> =
            spans.filter_map(|span| Some((span, self.spans.settling_to_hold(span)?))).collect();
        if gained.earliest_unnamed < self.spans.settled_through() || self.spans.has_orphans() {
            late.extend(
                (gained.by_trace.iter())
                    .filter(|(trace, _)| self.traces.contains_key(**trace))
                    .flat_map(|(_, indexes)| indexes.iter().map(|index| &gained.spans[*index].1))
                    .filter(|span| span.call.client_id.is_none())
                    .filter_map(|span| Some((span, self.spans.settling_to_hold(span)?))),
            );
        }
        (
            late.len() as u64,
            late.iter().map(|(span, _)| span.start_unix_nano).min().unwrap_or(UnixNanos::MAX),
            late.iter().map(|(_, by)| *by).max().unwrap_or(0),
        )
    }

    /// Holds a span at its place (start, store id), unless one is held there.
    fn hold(&mut self, id: i64, span: Span) {
        let key = (span.start_unix_nano, order(id));
        if self.spans.contains(key) {
            return;
        }
        if let Some(trace) = &span.trace_id {
            match self.trace_keys.get_mut(trace) {
                Some(keys) => keys.push(key),
                None => {
                    self.trace_keys.insert(trace.clone(), vec![key]);
                }
            }
        }
        self.spans.insert_at(key.1, span);
    }

    /// Forgets a span the timelines let go of: as one of the client's own, and as one of its
    /// trace's.
    fn forget(&mut self, key: SpanKey, span: &Span) {
        let own = (key.0, id_of(key.1));
        if self.own.remove(&own).is_some()
            && let Some(trace) = &span.trace_id
        {
            self.leave_trace_window(trace, own);
        }
        self.forget_trace_key(span, key);
    }

    /// Lets the span at `key` go, if held.
    fn release(&mut self, key: SpanKey) {
        let Some(span) = self.spans.remove(key) else { return };
        self.forget_trace_key(&span, key);
    }

    /// Takes a catch-up's new spans: the client's own and those of its traces, as the store's
    /// read would. Returns the traces whose window moved (joined, widened, narrowed or left),
    /// whose spans the store's read takes anew ([`Held::add_traces`]).
    fn add(&mut self, client_id: &str, gained: &Gained<'_>, limit: usize) -> Vec<String> {
        // The windows of the traces the client's own spans join or leave, before.
        let mut touched: HashMap<String, Option<(i64, i64)>> = HashMap::new();
        for &index in gained.by_client.get(client_id).into_iter().flatten() {
            let (id, span) = &gained.spans[index];
            if let Some(trace) = &span.trace_id {
                let before = self.window_of(trace);
                touched.entry(trace.clone()).or_insert(before);
            }
            self.own_span(*id, span);
        }
        // Own spans beyond the limit leave: kept only as spans of a trace whose window still
        // takes them.
        let mut left: Vec<SpanKey> = Vec::new();
        while self.own.len() > limit {
            let before: Option<Option<(i64, i64)>> = self
                .own
                .first_key_value()
                .and_then(|(_, (trace, _))| trace.as_deref())
                .map(|trace| self.window_of(trace));
            let Some((start, id, trace, has_span_id)) = self.drop_oldest_own() else { break };
            // Without a trace or a span id it is no other span's trace-mate: it goes. With both,
            // it stays while its trace's window, which it moved or not, still takes it.
            if trace.is_none() || !has_span_id {
                left.push((start, order(id)));
            }
            if let Some(trace) = trace {
                touched.entry(trace).or_insert(before.flatten());
            }
        }
        // Traces whose window moved: what the store holds of them (other than the client's
        // own, kept or added as such) is taken again. Those the client had no window in before
        // hold nothing here yet.
        let changed: HashSet<&str> = touched
            .iter()
            .filter(|(trace, before)| self.window_of(trace) != **before)
            .map(|(trace, _)| trace.as_str())
            .collect();
        let mut leaving = left;
        for (trace, before) in &touched {
            if before.is_some() && changed.contains(trace.as_str()) {
                let own = &self.own;
                leaving.extend(
                    self.trace_keys
                        .get(trace)
                        .into_iter()
                        .flatten()
                        .filter(|&&(start, order)| !own.contains_key(&(start, id_of(order)))),
                );
            }
        }
        for key in leaving {
            self.release(key);
        }
        // What arrived of the client and of its other traces.
        let mut candidates: Vec<usize> = gained.by_client.get(client_id).cloned().unwrap_or_default();
        for (trace, indexes) in &gained.by_trace {
            if !changed.contains(trace) && self.traces.contains_key(*trace) {
                candidates.extend(indexes);
            }
        }
        for index in candidates {
            let (id, span) = &gained.spans[index];
            // Of a trace taken again, only the client's own here (the store's read of a trace
            // takes only spans with a span id).
            let again = span.trace_id.as_deref().is_some_and(|trace| changed.contains(trace));
            // (One span reached two ways is held once.)
            if self.own.contains_key(&(span.start_unix_nano, *id)) || (!again && self.takes(*id, span)) {
                self.hold(*id, span.clone());
            }
        }
        changed.iter().filter(|trace| self.traces.contains_key(**trace)).map(|trace| trace.to_string()).collect()
    }

    /// Takes again the spans of `traces` the store's read takes: of what the store held of them
    /// before the catch-up, and of what the catch-up brought.
    fn add_traces(&mut self, traces: &[String], parts: [&Gained<'_>; 2]) {
        for trace in traces {
            for part in parts {
                for &index in part.by_trace.get(trace.as_str()).into_iter().flatten() {
                    let (id, span) = &part.spans[index];
                    if self.takes(*id, span) {
                        self.hold(*id, span.clone());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use lagscope_model::{CallFields, Component, ResourceFields, SpanKind};
    use lagscope_store::{IngestBatch, SqliteStore, Store, TimeRange};

    use super::*;
    use crate::held::Numbers;

    const SECOND: i64 = 1_000_000_000;

    fn span(trace: Option<u64>, id: u64, client: Option<&str>, start: i64) -> Span {
        Span {
            trace_id: trace.map(|trace| format!("{trace:032x}")),
            span_id: Some(format!("{id:016x}")),
            parent_span_id: None,
            name: "getFileInfo".to_string(),
            kind: if client.is_some() { SpanKind::Client } else { SpanKind::Server },
            start_unix_nano: start,
            end_unix_nano: start + SECOND / 100,
            status_code: 0,
            status_message: None,
            resource: ResourceFields {
                component: Some(if client.is_some() { Component::Client } else { Component::Server }),
                ..ResourceFields::default()
            },
            scope_name: None,
            scope_version: None,
            scope_attributes: Default::default(),
            call: CallFields { client_id: client.map(str::to_string), ..CallFields::default() },
            attributes: Default::default(),
            events: Vec::new(),
            links: Vec::new(),
        }
    }

    /// Rounds of calls of three clients between passes: hops sent before or after their
    /// client's span, retries joining a trace of an earlier round, a span of the past, two
    /// clients in one trace, spans without trace context or span id, hops outside the trace
    /// window, spans sent again; a small read limit, so that the oldest own spans leave. Every
    /// pass reads what the store reads, with budgets that hold every client, some, or none,
    /// and what is held joins into the timelines a new join of that read builds.
    #[tokio::test]
    async fn a_held_client_reads_exactly_what_the_store_reads() {
        let clients = ["c1", "c2", "c3"];
        for budget in [100_000, 40, 0] {
            let directory = tempfile::tempdir().expect("temp dir");
            let store = SqliteStore::open_dir(directory.path()).await.expect("store");
            let feed = store.span_feed().expect("feed");
            let mut cache = ClientCache::new(budget, 90_000_000_000);
            let mut numbers = Numbers(budget as u64 + 11);
            let (limit, mut next, mut traces, mut sent) = (9, 1_u64, Vec::new(), Vec::<Span>::new());
            let (mut held_passes, mut passes, mut joined_hops) = (0, 0, 0);
            // Distinct starts (the store's own limit picks among equal starts as it finds them).
            let start = |numbers: &mut Numbers, round: i64, n: u64| {
                (round * 100 + numbers.below(100) as i64) * SECOND + n as i64
            };
            let mut later_hops: Vec<Span> = Vec::new();
            for round in 0..14_i64 {
                let mut batch = std::mem::take(&mut later_hops);
                for _ in 0..numbers.below(6) {
                    next += 1;
                    let client = clients[numbers.below(3) as usize];
                    let (trace, at) = match numbers.below(6) {
                        // A retry in a trace of before, or a call of the past.
                        0 if !traces.is_empty() => {
                            (traces[numbers.below(traces.len() as u64) as usize], start(&mut numbers, round, next))
                        }
                        1 => (next + 1_000, start(&mut numbers, round - 2, next)),
                        _ => (next + 1_000, start(&mut numbers, round, next)),
                    };
                    traces.push(trace);
                    let id = next * 10;
                    let mut own = span(Some(trace), id, Some(client), at);
                    match numbers.below(8) {
                        0 => own.trace_id = None,
                        1 => own.span_id = None,
                        _ => {}
                    }
                    batch.push(own);
                    // Its hops: now, or in the next round (a server's span may arrive first).
                    for hop in 1..=numbers.below(3) {
                        let offset = match numbers.below(10) {
                            0 => 2 * TRACE_WINDOW_NANOS,
                            _ => hop as i64,
                        };
                        let mut hop_span = span(Some(trace), id + hop, None, at + offset);
                        // Under the client's span: the held timelines join it by trace.
                        hop_span.parent_span_id = Some(format!("{id:016x}"));
                        if numbers.below(10) == 0 {
                            hop_span.call.client_id = Some(clients[numbers.below(3) as usize].to_string());
                        }
                        if numbers.below(2) == 0 { batch.push(hop_span) } else { later_hops.push(hop_span) }
                    }
                }
                if !sent.is_empty() && numbers.below(3) == 0 {
                    batch.push(sent[numbers.below(sent.len() as u64) as usize].clone());
                }
                sent.extend(batch.iter().cloned());
                store.ingest(&IngestBatch { spans: batch, ..IngestBatch::default() }).await.expect("ingest");
                let latest = feed.latest_span_id().await.expect("latest");
                cache.catch_up(feed, latest, limit, Instant::now()).await.expect("catch up");
                for client in clients.iter().filter(|_| numbers.below(5) != 0) {
                    let (cached, was_held) =
                        cache.spans(feed, client, limit, None, Instant::now()).await.expect("spans");
                    passes += 1;
                    held_passes += usize::from(was_held);
                    let stored = store.client_spans(client, TimeRange::ALL, limit).await.expect("store");
                    let keys = |spans: &[Span]| {
                        spans
                            .iter()
                            .map(|span| (span.trace_id.clone(), span.span_id.clone(), span.start_unix_nano))
                            .collect::<Vec<_>>()
                    };
                    assert_eq!(keys(&cached), keys(&stored), "budget {budget}, round {round}, client {client}");
                    assert_eq!(cached, stored, "budget {budget}, round {round}, client {client}");
                    // What is held joins into the timelines a new join of the read builds.
                    if let Some(held) = cache.clients.get_mut(*client) {
                        held.spans.refresh();
                        let timelines = held.spans.take_timelines();
                        let expected = lagscope_analyzer::build_timelines(&stored, 90_000_000_000);
                        assert_eq!(timelines, expected, "budget {budget}, round {round}, client {client}");
                        joined_hops += timelines
                            .iter()
                            .flat_map(|timeline| &timeline.calls)
                            .flat_map(|call| &call.attempts)
                            .map(|attempt| attempt.server_spans.len())
                            .sum::<usize>();
                        held.spans.give_back(timelines);
                    }
                    assert!(cache.held() <= budget);
                }
            }
            if budget > 0 {
                assert!(joined_hops > 0, "budget {budget}: no hop joined");
            }
            match budget {
                0 => assert_eq!(held_passes, 0),
                40 => assert!(held_passes > 0 && held_passes < passes, "{held_passes} of {passes}"),
                _ => assert!(held_passes + 3 >= passes && held_passes > 0, "{held_passes} of {passes}"),
            }
        }
    }
}
