//! The spans the live analyzer's scope passes read, kept between passes.
//!
//! A scope pass needs a (cluster, namespace)'s newest `live.max_spans_per_scope` spans. Read
//! from the store on every pass, a busy scope's 50 000 spans cost about half a second (SQLite
//! writing them as JSON, then decoding it), and under sustained load those reads left the
//! analyzer seconds behind (BENCHMARKS.md, "Under serve --demo"). Here each scope passed
//! recently is held in memory, and a pass adds what was committed since the last one: one
//! read of the new spans of every held scope, found by id ([`SpanFeed`]).
//!
//!
//! A held scope's spans are kept with their timelines ([`HeldTimelines`]): a pass joins only
//! what the spans added and let go since the last one change, not the whole window again.
//!
//! Invariant: every held scope holds exactly what `Store::scope_spans(.., TimeRange::ALL,
//! limit)` would return as of span id `through` (less what retention has cut since), in the
//! same order. A span committed after `through` has a higher id ([`SpanFeed`]'s promise), so
//! the spans with ids in `through..=latest` are exactly what each scope gained.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use crate::held::{self, CATCH_UP_LIMIT, Committed, LateSpans, shed, start_catch_up};
use lagscope_analyzer::{HeldTimelines, SpanKey};
use lagscope_model::{Span, UnixNanos};
use lagscope_store::{SpanFeed, StoreError};

/// (cluster, namespace).
pub type ScopeKey = (Option<String>, Option<String>);

/// What a scope read came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Held, brought up to date by the last catch-up.
    Cached,
    /// Read from the store in full (not held before; held from now on when the budget allows).
    Store,
}

#[derive(Debug)]
pub struct ScopeCache {
    /// The most spans held over all scopes; 0 holds none.
    budget: usize,
    scopes: HashMap<ScopeKey, Held>,
    /// Every held scope is up to date as of this span id.
    through: i64,
    /// Spans held over all scopes.
    held: usize,
    /// A call id names one call for this long ([`HeldTimelines::new`]).
    horizon: UnixNanos,
    /// Spans that reached a held scope after its timelines were settled past them, and the
    /// scopes let go for them.
    late: LateSpans<ScopeKey>,
}

#[derive(Debug)]
struct Held {
    /// Ordered by start time (spans of one start in id order: the order they were added in),
    /// at most the pass's limit, with the timelines they join into.
    spans: HeldTimelines,
    last_passed: Instant,
}

impl ScopeCache {
    /// At most `budget` spans over all scopes; a call id names one call for `horizon`.
    pub fn new(budget: usize, horizon: UnixNanos) -> Self {
        Self { budget, scopes: HashMap::new(), through: 0, held: 0, horizon, late: LateSpans::new(horizon) }
    }

    /// The spans that reached a held scope too late for its timelines
    /// ([`HeldTimelines::is_late`]), and the scopes let go for them, to be read anew.
    pub fn late(&mut self) -> &mut LateSpans<ScopeKey> {
        &mut self.late
    }

    /// Spans held over all scopes.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Brings every held scope up to span id `latest`: reads what they gained since the
    /// last catch-up (one read for all of them; none when nothing was committed), and keeps
    /// the newest `limit` of each scope that gained (what is older than `kept_from`, the span
    /// retention's cut-off, goes too; the store drops it as well). What `committed` (the
    /// client cache's catch-up of this pass) holds of that is taken from it, not read again.
    /// When more was committed than the budget (a long stall), every scope is let go and read
    /// anew when next passed. Scopes not passed for [`held::IDLE_AFTER`] are let go first.
    pub async fn catch_up(
        &mut self,
        feed: &dyn SpanFeed,
        latest: i64,
        limit: u32,
        kept_from: Option<i64>,
        now: Instant,
        committed: Option<&Committed>,
    ) -> Result<(), StoreError> {
        start_catch_up(&mut self.scopes, self.through, latest, now, "scope");
        if !self.scopes.is_empty() && latest > self.through {
            let most = self.budget.min(CATCH_UP_LIMIT);
            // Spans with lower ids first: of one start, the scope holds them in id order.
            let (mut gained, mut after) = (Vec::new(), self.through);
            if let Some(committed) = committed.filter(|committed| {
                committed.after <= self.through && self.through < committed.through && committed.through <= latest
            }) {
                let held: HashSet<(Option<&str>, Option<&str>)> =
                    self.scopes.keys().map(|(cluster, namespace)| (cluster.as_deref(), namespace.as_deref())).collect();
                gained.extend(
                    committed
                        .spans
                        .iter()
                        .filter(|(id, span)| {
                            *id > self.through
                                && held.contains(&(span.resource.cluster.as_deref(), span.call.namespace.as_deref()))
                        })
                        .map(|(_, span)| span.clone()),
                );
                after = committed.through;
            }
            if gained.len() < most && latest > after {
                let keys: Vec<ScopeKey> = self.scopes.keys().cloned().collect();
                let left = (most - gained.len()) as u32;
                gained.extend(feed.scope_spans_between(&keys, after, latest, left).await?);
            }
            if gained.len() >= most {
                tracing::info!(
                    spans = gained.len(),
                    scopes = self.scopes.len(),
                    "more spans arrived since the last pass than the scope cache holds; its scopes are read anew"
                );
                held::let_go_all(&mut self.scopes);
            } else {
                let (mut grown, mut late) = (HashSet::new(), HashSet::new());
                for span in gained {
                    let key = (span.resource.cluster.clone(), span.call.namespace.clone());
                    if let Some(held) = self.scopes.get_mut(&key) {
                        if let Some(to_hold) = held.spans.settling_to_hold(&span) {
                            self.late.note(key.clone(), 1, span.start_unix_nano, to_hold);
                            late.insert(key);
                        } else if !late.contains(&key) {
                            // (A scope about to be let go takes nothing more.)
                            held.spans.insert(span);
                            grown.insert(key);
                        }
                    }
                }
                // A scope that got spans its timelines had already been settled past is let
                // go, and read anew when passed (the spans mark it): judged again from the
                // store, the late spans with the calls they belong to.
                held::release(late.iter().filter_map(|key| self.scopes.remove(key)).collect());
                for key in grown {
                    if let Some(held) = self.scopes.get_mut(&key) {
                        held.normalise(limit as usize, kept_from);
                    }
                }
            }
        }
        self.through = latest;
        self.held = shed(&mut self.scopes, self.budget);
        Ok(())
    }

    /// A copy of the scope's spans as `Store::scope_spans(cluster, namespace, TimeRange::ALL,
    /// limit)` returns them as of the last catch-up ([`ScopeCache::load`], then the held spans
    /// or those read), for the tests to compare with the store's read.
    #[cfg(test)]
    pub async fn spans(
        &mut self,
        feed: &dyn SpanFeed,
        scope: &ScopeKey,
        limit: u32,
        kept_from: Option<i64>,
        now: Instant,
    ) -> Result<(Vec<Span>, Source), StoreError> {
        let (read, source) = self.load(feed, scope, limit, kept_from, now).await?;
        let spans = read.unwrap_or_else(|| self.scopes.get(scope).expect("loaded").spans.spans().cloned().collect());
        Ok((spans, source))
    }

    /// A scope's spans in two steps, for a pass that analyses several scopes at once:
    /// brings the scope's spans in, returning them when they are not held (over the budget);
    /// [`ScopeCache::held_mut`] then gives those that are. Loading a scope never lets go of
    /// another (only a catch-up does), so every scope loaded since the last catch-up stays.
    pub async fn load(
        &mut self,
        feed: &dyn SpanFeed,
        scope: &ScopeKey,
        limit: u32,
        kept_from: Option<i64>,
        now: Instant,
    ) -> Result<(Option<Vec<Span>>, Source), StoreError> {
        if let Some(held) = self.scopes.get_mut(scope) {
            held.last_passed = now;
            let before = held.spans.len();
            held.normalise(limit as usize, kept_from);
            self.held -= before - held.spans.len();
            return Ok((None, Source::Cached));
        }
        let mut spans = feed.scope_spans_through(scope.0.as_deref(), scope.1.as_deref(), self.through, limit).await?;
        if let Some(kept_from) = kept_from {
            spans.retain(|span| span.start_unix_nano >= kept_from);
        }
        if self.budget == 0 || self.held + spans.len() > self.budget {
            return Ok((Some(spans), Source::Store));
        }
        self.held += spans.len();
        let mut held = HeldTimelines::new(self.horizon);
        for span in spans {
            held.insert(span);
        }
        self.scopes.insert(scope.clone(), Held { spans: held, last_passed: now });
        Ok((None, Source::Store))
    }

    /// Takes note of what a scope's settling ([`HeldTimelines::settle`]) let go of, and frees
    /// it off the pass ([`held::release`]).
    pub fn settled(&mut self, scope: &ScopeKey, let_go: Vec<(SpanKey, Span)>) {
        if self.scopes.contains_key(scope) {
            self.held = self.held.saturating_sub(let_go.len());
        }
        held::release(let_go);
    }

    /// The held ones of `scopes`, to be analysed at once (each joins what changed).
    pub fn held_mut<'a>(&'a mut self, scopes: &[ScopeKey]) -> HashMap<&'a ScopeKey, &'a mut HeldTimelines> {
        self.scopes
            .iter_mut()
            .filter(|(scope, _)| scopes.contains(scope))
            .map(|(scope, held)| (scope, &mut held.spans))
            .collect()
    }
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
    /// Keeps the newest `limit` spans that retention has not cut (held in start order, spans
    /// of one start in id order as the store orders them: what was held has lower ids than
    /// what was added).
    fn normalise(&mut self, limit: usize, kept_from: Option<i64>) {
        self.spans.keep_newest(limit, kept_from);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use lagscope_model::{CallFields, ResourceFields, SpanKind};
    use lagscope_store::{IngestBatch, SqliteStore, Store, TimeRange};

    use super::*;
    use crate::held::{IDLE_AFTER, Numbers};

    /// A server span of `scope` (trace and span id `id`).
    pub(crate) fn span(scope: &ScopeKey, id: u64, start: i64) -> Span {
        Span {
            trace_id: Some(format!("{id:032x}")),
            span_id: Some(format!("{id:016x}")),
            parent_span_id: None,
            name: "getFileInfo".to_string(),
            kind: SpanKind::Server,
            start_unix_nano: start,
            end_unix_nano: start + 10,
            status_code: 0,
            status_message: None,
            resource: ResourceFields { cluster: scope.0.clone(), ..ResourceFields::default() },
            scope_name: None,
            scope_version: None,
            scope_attributes: Default::default(),
            call: CallFields { namespace: scope.1.clone(), ..CallFields::default() },
            attributes: Default::default(),
            events: Vec::new(),
            links: Vec::new(),
        }
    }

    fn scopes() -> [ScopeKey; 3] {
        [
            (Some("prod".to_string()), Some("ns1".to_string())),
            (Some("prod".to_string()), None),
            (None, Some("ns1".to_string())),
        ]
    }

    async fn open() -> (SqliteStore, tempfile::TempDir) {
        let directory = tempfile::tempdir().expect("temp dir");
        (SqliteStore::open_dir(directory.path()).await.expect("store"), directory)
    }

    /// Rounds of spans of three scopes, arriving in any order of their starts (late ones of
    /// the past, ties, spans sent again), between passes: every pass reads what the store
    /// reads, with budgets that hold every scope, some of them, or none, whether its catch-up
    /// takes part of what it gained from another read of what was committed or none.
    #[tokio::test]
    async fn a_held_scope_reads_exactly_what_the_store_reads() {
        for budget in [1_000, 12, 0] {
            let (store, _directory) = open().await;
            let feed = store.span_feed().expect("feed");
            let mut cache = ScopeCache::new(budget, 90_000_000_000);
            let mut numbers = Numbers(budget as u64 + 7);
            let (limit, mut next_id, mut sent) = (10, 1, Vec::new());
            let (mut sources, mut client_through) = (Vec::new(), 0);
            let now = Instant::now();
            for round in 0..12 {
                let mut batch = Vec::new();
                for _ in 0..numbers.below(9) {
                    let scope = &scopes()[numbers.below(3) as usize];
                    // Starts from the past to ahead of the rounds so far; ties are common.
                    let start = (round * 10 + numbers.below(14) as i64 - 4) * 100;
                    batch.push(span(scope, next_id, start));
                    next_id += 1;
                }
                if !sent.is_empty() && numbers.below(2) == 0 {
                    let again: &Span = &sent[numbers.below(sent.len() as u64) as usize];
                    batch.push(again.clone());
                }
                sent.extend(batch.iter().cloned());
                // Ingested in two commits: the client cache's read of everything committed
                // since its last (most rounds) comes between them, so a catch-up takes some
                // of what it gained from that read and the rest from the store.
                let later = batch.split_off(numbers.below(batch.len() as u64 + 1) as usize);
                store.ingest(&IngestBatch { spans: batch, ..IngestBatch::default() }).await.expect("ingest");
                let mut committed = None;
                if numbers.below(4) != 0 {
                    let latest = feed.latest_span_id().await.expect("latest");
                    let spans = feed.spans_between(client_through, latest, 1_000).await.expect("between");
                    committed = Some(Committed { after: client_through, through: latest, spans });
                    client_through = latest;
                }
                store.ingest(&IngestBatch { spans: later, ..IngestBatch::default() }).await.expect("ingest");
                for scope in scopes().iter().filter(|_| numbers.below(4) != 0) {
                    let latest = feed.latest_span_id().await.expect("latest");
                    cache.catch_up(feed, latest, limit, None, now, committed.take().as_ref()).await.expect("catch up");
                    let (spans, source) = cache.spans(feed, scope, limit, None, now).await.expect("spans");
                    sources.push(source);
                    let stored = store
                        .scope_spans(scope.0.as_deref(), scope.1.as_deref(), TimeRange::ALL, limit)
                        .await
                        .expect("store");
                    // The store picks among spans of one start at the cut as it finds them:
                    // compared by start there, span by span above it.
                    let cut = stored.first().map_or(i64::MIN, |first| first.start_unix_nano);
                    let starts = |spans: &[Span]| spans.iter().map(|span| span.start_unix_nano).collect::<Vec<_>>();
                    assert_eq!(starts(&spans), starts(&stored), "budget {budget}, round {round}, {scope:?}");
                    let above = |spans: &[Span]| {
                        spans.iter().filter(|span| span.start_unix_nano > cut).cloned().collect::<Vec<_>>()
                    };
                    assert_eq!(above(&spans), above(&stored), "budget {budget}, round {round}, {scope:?}");
                    assert!(cache.held() <= budget, "held {} of {budget}", cache.held());
                }
            }
            let cached = sources.iter().filter(|source| **source == Source::Cached).count();
            match budget {
                0 => assert_eq!(cached, 0),
                12 => assert!(cached > 0 && cached < sources.len(), "{cached} of {}", sources.len()),
                _ => assert_eq!(cached, sources.len() - 3, "each scope read from the store once"),
            }
        }
    }

    /// A stall longer than the budget lets every scope go; a scope not passed for a while is
    /// let go; the retention's cut-off drops what it cuts.
    #[tokio::test]
    async fn scopes_are_let_go_after_a_stall_or_when_idle_and_retention_cuts_them() {
        let (store, _directory) = open().await;
        let feed = store.span_feed().expect("feed");
        let [one, two, _] = scopes();
        let ingest = |spans: Vec<Span>| {
            let store = &store;
            async move { store.ingest(&IngestBatch { spans, ..IngestBatch::default() }).await.expect("ingest") }
        };
        ingest((1..=4).map(|id| span(&one, id, id as i64 * 100)).chain([span(&two, 5, 50)]).collect()).await;
        let mut cache = ScopeCache::new(6, 90_000_000_000);
        let start = Instant::now();
        cache
            .catch_up(feed, feed.latest_span_id().await.expect("latest"), 100, None, start, None)
            .await
            .expect("catch up");
        assert_eq!(cache.spans(feed, &one, 100, None, start).await.expect("one").1, Source::Store);
        assert_eq!(cache.spans(feed, &two, 100, None, start).await.expect("two").1, Source::Store);
        assert_eq!(cache.held(), 5);

        // Seven spans since: more than the budget holds.
        ingest((6..=12).map(|id| span(&one, id, id as i64 * 100)).collect()).await;
        cache
            .catch_up(feed, feed.latest_span_id().await.expect("latest"), 100, None, start, None)
            .await
            .expect("stall");
        assert_eq!(cache.held(), 0);
        let (spans, source) = cache.spans(feed, &one, 100, None, start).await.expect("anew");
        assert_eq!((spans.len(), source), (11, Source::Store), "over the budget: read, not held");
        let (spans, source) = cache.spans(feed, &two, 100, None, start).await.expect("two anew");
        assert_eq!((spans.len(), source), (1, Source::Store));
        assert_eq!(cache.spans(feed, &two, 100, None, start).await.expect("held").1, Source::Cached);

        // Passed again within the idle time: held; not passed for it: let go.
        let later = start + IDLE_AFTER;
        cache.catch_up(feed, feed.latest_span_id().await.expect("latest"), 100, None, later, None).await.expect("idle");
        assert_eq!(cache.spans(feed, &two, 100, None, later).await.expect("let go").1, Source::Store);

        // Retention's cut-off: what starts before it goes, held or read.
        let (spans, _) = cache.spans(feed, &two, 100, Some(60), later).await.expect("cut");
        assert!(spans.is_empty());
        assert_eq!(cache.held(), 0);
        let (spans, _) = cache.spans(feed, &one, 100, Some(1_050), later).await.expect("cut on read");
        assert_eq!(spans.iter().map(|span| span.start_unix_nano).collect::<Vec<_>>(), [1_100, 1_200]);
    }
}
