//! The metric samples the live analyzer's scope passes read, kept between passes.
//!
//! A scope pass needs the scope's samples of the last `live.scope_window_seconds` (every series
//! of the scope, and the cluster's series that name no namespace). Read in full on every pass,
//! a busy scope's ~5 000 samples cost SQLite ~5 ms to gather as JSON and as much again to
//! decode, and a pass of 40 such scopes spent a quarter of its time there (BENCHMARKS.md,
//! "Under `serve --demo`"). Here each scope passed recently is held, and a pass reads again
//! only the samples from the oldest time committed to the scope since its last read.
//!
//! What was committed is known from the ingest marks ([`Pending::sample_times`]): the oldest
//! sample time committed per (cluster, namespace) of the series' labels, marked after each
//! commit. A pass takes the marks before it reads, so every commit they name is visible to its
//! reads; a commit marked later is read again by the next pass.
//!
//! Invariant: a held scope not lent out holds exactly what `Store::scope_samples(.., window)`
//! returned when it was last read, with everything from its `stale_from` on read again: the
//! samples older than `stale_from` have not changed since (a commit that wrote one would have
//! marked an older time), and those from it on are replaced by the store's. Samples are
//! ordered by time, then series id, as the store orders them, and held with their series
//! index ([`IndexedSamples`]), which follows them as they change: the pass takes both.
//!
//! On PostgreSQL the marks come from the database (`analysis_marks`): a scope's mark carries
//! the oldest sample time committed to it since it was last finished, and the invariant holds
//! for the scopes `live::shards::hold_samples` lets the cache hold: not across a round that took
//! shards (another instance may have finished their marks), nor through a pass that left marks
//! of its shards waiting, nor for a scope whose cluster's samples of no namespace are marked in
//! a shard held elsewhere (tested in `on_postgresql_a_held_scope_takes_exactly_what_the_store_reads`).
//!
//! [`Pending::sample_times`]: lagscope_collector::Pending::sample_times

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use lagscope_analyzer::IndexedSamples;
use lagscope_model::{Sample, SeriesKey, SeriesMeta};

use crate::held;
use crate::scope_cache::ScopeKey;

pub struct SampleCache {
    /// The most samples held over all scopes; 0 holds none.
    budget: usize,
    scopes: HashMap<ScopeKey, Held>,
    /// Which scopes may be held (all when `None`): see [`SampleCache::hold_only`].
    holdable: Option<Holdable>,
}

/// Which scopes a [`SampleCache`] may hold.
pub type Holdable = Box<dyn Fn(&ScopeKey) -> bool + Send + Sync>;

#[derive(Debug)]
struct Held {
    /// By time, then series id, grouped by series (the index follows the samples as they
    /// change: it is not built again each pass); empty while lent out ([`SampleCache::take`]).
    samples: IndexedSamples,
    /// Each sample's series id (kept while the samples are lent).
    ids: Vec<i64>,
    /// Each series' identity and description, shared by its samples.
    series: HashMap<i64, (Arc<SeriesKey>, Arc<SeriesMeta>)>,
    /// The oldest sample time committed to the scope since it was last read; `None`: none.
    stale_from: Option<i64>,
    /// The samples are lent out; not given back (a panic), the scope is read anew.
    lent: bool,
    last_passed: Instant,
}

impl held::Held for Held {
    fn size(&self) -> usize {
        self.ids.len()
    }

    fn last_passed(&self) -> Instant {
        self.last_passed
    }
}

impl SampleCache {
    /// At most `budget` samples over all scopes; 0 holds none.
    pub fn new(budget: usize) -> Self {
        Self { budget, scopes: HashMap::new(), holdable: None }
    }

    /// Holds from now on only the scopes `holdable` accepts (lets go of the others held): the
    /// others are read in full on every pass. For a reader whose marks may not name every
    /// commit to some scopes (on a database several instances share, a cluster's samples of
    /// no namespace are marked in a shard another instance may hold).
    pub fn hold_only(&mut self, holdable: Holdable) {
        self.scopes.retain(|scope, _| holdable(scope));
        self.holdable = Some(holdable);
    }

    /// Lets go of every scope held: for a reader whose marks may have been taken by another
    /// (a shard that changed hands), or that leaves some unread this pass while what they
    /// stand for is already visible.
    pub fn clear(&mut self) {
        self.scopes.clear();
    }

    /// Samples held over all scopes.
    pub fn held(&self) -> usize {
        self.scopes.values().map(|held| held.ids.len()).sum()
    }

    /// Notes what a pass's marks say was committed: per (cluster, namespace) of the series'
    /// labels, the oldest sample time. A cluster's samples naming no namespace belong to every
    /// namespace of the cluster. Scopes not passed for [`held::IDLE_AFTER`] are let go.
    pub fn committed(&mut self, sample_times: &BTreeMap<ScopeKey, i64>, now: Instant) {
        held::let_go_idle(&mut self.scopes, now);
        for ((cluster, namespace), held) in &mut self.scopes {
            let own = sample_times.get(&(cluster.clone(), namespace.clone()));
            let shared = namespace.as_ref().and_then(|_| sample_times.get(&(cluster.clone(), None)));
            if let Some(time) = own.into_iter().chain(shared).min() {
                held.stale_from = Some(held.stale_from.map_or(*time, |from| from.min(*time)));
            }
        }
    }

    /// From which time a pass reads the scope's samples: `Some(i64::MIN)` when it is not
    /// held (all of them), the oldest time committed since when it is, `None` when nothing
    /// was.
    pub fn read_from(&mut self, scope: &ScopeKey, now: Instant) -> Option<i64> {
        match self.scopes.get_mut(scope) {
            Some(held) if !held.lent => {
                held.last_passed = now;
                held.stale_from
            }
            _ => Some(i64::MIN),
        }
    }

    /// The scope's samples for a pass, lent until [`SampleCache::give_back`]: `read` is what
    /// the store returned from [`SampleCache::read_from`]'s time on (`None`: nothing read).
    /// `window` and `kept_from` (the samples' retention cut-off) bound what is kept, as the
    /// store's read bounds it. A scope is held from its first read on while the budget allows.
    pub fn take(
        &mut self,
        scope: &ScopeKey,
        read: Option<Vec<(i64, Sample)>>,
        window: i64,
        kept_from: Option<i64>,
        now: Instant,
    ) -> IndexedSamples {
        let cached = self.scopes.get(scope).is_some_and(|held| !held.lent);
        let held = match (self.scopes.get_mut(scope), read) {
            (Some(held), read) if cached => {
                if let Some(read) = read {
                    held.merge(read);
                }
                held
            }
            (_, read) => {
                let read = read.unwrap_or_default();
                self.scopes.remove(scope);
                let holdable = self.holdable.as_ref().is_none_or(|holdable| holdable(scope));
                if self.budget == 0 || !holdable || self.held() + read.len() > self.budget {
                    return read.into_iter().map(|(_, sample)| sample).collect::<Vec<_>>().into();
                }
                let held = Held {
                    samples: IndexedSamples::default(),
                    ids: Vec::new(),
                    series: HashMap::new(),
                    stale_from: None,
                    lent: false,
                    last_passed: now,
                };
                let held = self.scopes.entry(scope.clone()).or_insert(held);
                held.merge(read);
                held
            }
        };
        held.stale_from = None;
        held.keep(window, kept_from);
        held.lent = true;
        let samples = std::mem::take(&mut held.samples);
        held::shed(&mut self.scopes, self.budget);
        samples
    }

    /// Gives back what [`SampleCache::take`] lent (the analysis's input).
    pub fn give_back(&mut self, scope: &ScopeKey, samples: IndexedSamples) {
        if let Some(held) = self.scopes.get_mut(scope)
            && held.lent
            && samples.len() == held.ids.len()
        {
            held.samples = samples;
            held.lent = false;
        }
    }
}

impl Held {
    /// Replaces what is held from `stale_from` on by the read, which starts there (or later,
    /// where the store's window starts later). A series the read names with another identity
    /// or description (the store keeps the newest) takes it in the samples held too.
    fn merge(&mut self, read: Vec<(i64, Sample)>) {
        let from = self.stale_from.unwrap_or(i64::MIN);
        let keep = self.samples.samples().partition_point(|sample| sample.time_unix_nano < from);
        self.samples.truncate(keep);
        self.ids.truncate(keep);
        let mut changed: Vec<i64> = Vec::new();
        let mut added: Vec<Sample> = Vec::with_capacity(read.len());
        for (id, mut sample) in read {
            let (key, meta) = self.series.entry(id).or_insert_with(|| (sample.series.clone(), sample.meta.clone()));
            if *key != sample.series || *meta != sample.meta {
                (*key, *meta) = (sample.series.clone(), sample.meta.clone());
                changed.push(id);
            }
            (sample.series, sample.meta) = (key.clone(), meta.clone());
            added.push(sample);
            self.ids.push(id);
        }
        self.samples.extend(added);
        if !changed.is_empty() {
            let (ids, series) = (&self.ids, &self.series);
            self.samples.rewrite(|samples| {
                for (sample, id) in samples[..keep].iter_mut().zip(ids) {
                    if changed.contains(id)
                        && let Some((key, meta)) = series.get(id)
                    {
                        (sample.series, sample.meta) = (key.clone(), meta.clone());
                    }
                }
            });
        }
    }

    /// Keeps the window before the latest sample, and what retention keeps; forgets the
    /// series with no sample left.
    fn keep(&mut self, window: i64, kept_from: Option<i64>) {
        let Some(latest) = self.samples.samples().last().map(|sample| sample.time_unix_nano) else {
            self.series.clear();
            return;
        };
        let from = latest.saturating_sub(window).max(kept_from.unwrap_or(i64::MIN));
        let cut = self.samples.samples().partition_point(|sample| sample.time_unix_nano < from);
        if cut > 0 {
            self.samples.let_go_first(cut);
            self.ids.drain(..cut);
            let ids: std::collections::HashSet<i64> = self.ids.iter().copied().collect();
            self.series.retain(|id, _| ids.contains(id));
        }
    }
}

#[cfg(test)]
mod tests {
    use lagscope_collector::DirtyClients;
    use lagscope_model::conventions::{CLUSTER, NAMESPACE, NODE_ID};
    use lagscope_model::{MetricKind, PointValue};
    use lagscope_store::{IngestBatch, SqliteStore, Store};

    use super::*;
    use crate::held::Numbers;

    const WINDOW: i64 = 1_500;

    /// A sample of the series `name` on `node` of (cluster, namespace).
    fn sample(scope: &ScopeKey, name: &str, node: &str, time: i64, value: f64, unit: Option<&str>) -> Sample {
        let mut labels: BTreeMap<String, String> = BTreeMap::new();
        labels.insert(NODE_ID.to_string(), node.to_string());
        if let Some(cluster) = &scope.0 {
            labels.insert(CLUSTER.to_string(), cluster.clone());
        }
        if let Some(namespace) = &scope.1 {
            labels.insert(NAMESPACE.to_string(), namespace.clone());
        }
        Sample {
            series: SeriesKey { name: name.to_string(), labels }.into(),
            meta: SeriesMeta { kind: MetricKind::Gauge, unit: unit.map(str::to_string), description: None }.into(),
            time_unix_nano: time,
            start_time_unix_nano: None,
            value: PointValue::Number(value),
        }
    }

    /// Scopes passed, and the scopes whose series a batch writes to (the cluster's series of
    /// no namespace are read with each of its namespaces).
    fn scopes() -> [ScopeKey; 4] {
        [
            (Some("prod".to_string()), Some("ns1".to_string())),
            (Some("prod".to_string()), Some("ns2".to_string())),
            (Some("prod".to_string()), None),
            (None, Some("ns1".to_string())),
        ]
    }

    fn texts(samples: &[Sample]) -> Vec<String> {
        samples.iter().map(|sample| format!("{sample:?}")).collect()
    }

    /// Rounds of samples of four scopes, committed in batches and marked as the ingest queue
    /// marks them, then a pass over some of the scopes: samples of the past (some older than
    /// what is held, some older than the window), ahead, sent again with another value, and
    /// series whose unit changes. Every pass's samples are what the store reads in full, with
    /// budgets that hold every scope, some, or none; some passes do not give their samples
    /// back.
    #[tokio::test]
    async fn a_held_scope_takes_exactly_what_the_store_reads() {
        for budget in [100_000, 60, 0] {
            let directory = tempfile::tempdir().expect("temp dir");
            let store = SqliteStore::open_dir(directory.path()).await.expect("store");
            let dirty = DirtyClients::default();
            let mut cache = SampleCache::new(budget);
            let mut numbers = Numbers(budget as u64 + 3);
            let now = Instant::now();
            let (mut reads, mut partial, mut held, mut unread) = (0, 0, 0, 0);
            let (mut samples_read, mut samples_passed) = (0, 0);
            for round in 0..40_i64 {
                for _ in 0..=numbers.below(3) {
                    let mut batch = Vec::new();
                    for _ in 0..numbers.below(7) {
                        let scope = &scopes()[numbers.below(4) as usize];
                        let name = ["lagscope.server.applied_state", "lagscope.server.committed_state"]
                            [numbers.below(2) as usize];
                        let node = ["nn-1", "nn-2", "nn-3"][numbers.below(3) as usize];
                        // Mostly ahead, some late: from 2 500 before the round to 500 ahead.
                        let late = if numbers.below(5) == 0 { numbers.below(25) as i64 * 100 } else { 0 };
                        let time = round * 300 + numbers.below(6) as i64 * 100 - late;
                        let unit = ["1", "{state}"][numbers.below(2) as usize];
                        let unit = Some(unit).filter(|_| numbers.below(6) == 0);
                        batch.push(sample(scope, name, node, time, numbers.below(1_000) as f64, unit));
                    }
                    store
                        .ingest(&IngestBatch { samples: batch.clone(), ..IngestBatch::default() })
                        .await
                        .expect("ingest");
                    dirty.mark_all(&[], &batch, &[]);
                }
                let pending = dirty.take().await;
                cache.committed(&pending.sample_times, now);
                let passed: Vec<ScopeKey> = scopes().into_iter().filter(|_| numbers.below(3) != 0).collect();
                for scope in &passed {
                    let (cluster, namespace) = (scope.0.as_deref(), scope.1.as_deref());
                    let from = cache.read_from(scope, now);
                    let read = match from {
                        Some(from) => {
                            Some(store.scope_samples_from(cluster, namespace, WINDOW, from).await.expect("read"))
                        }
                        None => None,
                    };
                    reads += usize::from(from.is_some());
                    samples_read += read.as_ref().map_or(0, Vec::len);
                    partial += usize::from(from.is_some_and(|from| from > i64::MIN));
                    held += usize::from(from.is_none_or(|from| from > i64::MIN));
                    unread += usize::from(from.is_none());
                    let samples = cache.take(scope, read, WINDOW, None, now);
                    let stored = store.scope_samples(cluster, namespace, WINDOW).await.expect("store");
                    samples_passed += stored.len();
                    assert_eq!(texts(samples.samples()), texts(&stored), "budget {budget}, round {round}, {scope:?}");
                    // The index kept with them is what indexing them anew builds.
                    assert!(
                        samples == IndexedSamples::from(samples.samples().to_vec()),
                        "budget {budget}, round {round}, {scope:?}: the index differs from the samples'"
                    );
                    if numbers.below(8) != 0 {
                        cache.give_back(scope, samples);
                    }
                    assert!(cache.held() <= budget, "held {} of {budget}", cache.held());
                }
            }
            match budget {
                0 => assert_eq!(held, 0),
                // Held scopes read from where they changed, or nothing when nothing did.
                _ => assert!(
                    unread > 0 && partial > 0 && partial < reads,
                    "{held} held, {partial} of {reads} reads partial, {unread} passes without a read"
                ),
            }
            // What is held is not read again.
            if budget == 100_000 {
                assert!(
                    samples_read * 4 < samples_passed * 3,
                    "{samples_read} samples read for {samples_passed} passed"
                );
            }
        }
    }

    /// On a database several instances share, the marks come from the database and the
    /// instance holds some shards: rounds of samples committed as above, the marks of the
    /// shards held taken a few at a time (some left waiting), marks of other shards finished
    /// now and then as another instance would, and the shards held changing hands; spans mark
    /// scopes too (the scope of no cluster among them, whose samples mark nothing). Every
    /// passed scope's samples are what the store reads in full, and scopes are still held.
    #[tokio::test]
    async fn on_postgresql_a_held_scope_takes_exactly_what_the_store_reads() {
        use lagscope_store::{PgStore, SHARDS};
        let url = crate::postgres_support::fresh_database().await;
        let store = PgStore::connect(&url).await.expect("postgres");
        let coordinator = store.coordinator().expect("coordinator");
        let mut cache = SampleCache::new(100_000);
        let mut numbers = Numbers(11);
        let now = Instant::now();
        let all: Vec<i32> = (0..SHARDS).collect();
        let mut shards = all.clone();
        let (mut passes, mut partial, mut cleared) = (0, 0, 0);
        for round in 0..60_i64 {
            for _ in 0..=numbers.below(3) {
                let mut batch = Vec::new();
                for _ in 0..numbers.below(7) {
                    let scope = &scopes()[numbers.below(4) as usize];
                    let late = if numbers.below(5) == 0 { numbers.below(25) as i64 * 100 } else { 0 };
                    let time = round * 300 + numbers.below(6) as i64 * 100 - late;
                    let node = ["nn-1", "nn-2", "nn-3"][numbers.below(3) as usize];
                    batch.push(sample(
                        scope,
                        "lagscope.server.applied_state",
                        node,
                        time,
                        numbers.below(1_000) as f64,
                        None,
                    ));
                }
                // Spans mark scopes too: those of no cluster are passed, their samples unmarked.
                let spans: Vec<_> = (0..numbers.below(2))
                    .map(|_| {
                        crate::scope_cache::tests::span(
                            &scopes()[numbers.below(4) as usize],
                            numbers.below(1 << 40),
                            round * 300,
                        )
                    })
                    .collect();
                store.ingest(&IngestBatch { spans, samples: batch, ..IngestBatch::default() }).await.expect("ingest");
            }
            // Leases move: all shards, or a random half (some shards taken anew).
            let claimed = if numbers.below(4) == 0 {
                let before: std::collections::HashSet<i32> = shards.iter().copied().collect();
                shards = if numbers.below(2) == 0 {
                    all.clone()
                } else {
                    all.iter().copied().filter(|_| numbers.below(2) == 0).collect()
                };
                shards.iter().any(|shard| !before.contains(shard))
            } else {
                false
            };
            // Another instance analyses the other shards' marks now and then; and some shards
            // held went to another instance and came back since the last pass (so the pass
            // sees them held throughout, but taken in a round).
            let mut others: Vec<i32> = all.iter().copied().filter(|shard| !shards.contains(shard)).collect();
            let claimed = if numbers.below(5) == 0 {
                others.extend(shards.iter().copied().filter(|_| numbers.below(2) == 0));
                true
            } else {
                claimed
            };
            if numbers.below(2) == 0 && !others.is_empty() {
                let theirs = coordinator.pending_marks(&others, 100).await.expect("marks");
                coordinator.finish_marks(&theirs).await.expect("finish");
            }
            let limit = if numbers.below(5) == 0 { 2 } else { 100 };
            let marks = coordinator.pending_marks(&shards, limit).await.expect("marks");
            let every_mark_taken = marks.len() < limit as usize;
            cleared += usize::from(claimed || !every_mark_taken);
            crate::live::shards::hold_samples(&mut cache, &shards, claimed, every_mark_taken);
            let pass =
                crate::live::shards::resolve_marks(&store, coordinator, &shards.iter().copied().collect(), &marks)
                    .await
                    .expect("resolve");
            cache.committed(&pass.sample_times, now);
            for scope in &pass.scopes {
                let (cluster, namespace) = (scope.0.as_deref(), scope.1.as_deref());
                let from = cache.read_from(scope, now);
                let read = match from {
                    Some(from) => Some(store.scope_samples_from(cluster, namespace, WINDOW, from).await.expect("read")),
                    None => None,
                };
                passes += 1;
                partial += usize::from(from.is_none_or(|from| from > i64::MIN));
                let samples = cache.take(scope, read, WINDOW, None, now);
                let stored = store.scope_samples(cluster, namespace, WINDOW).await.expect("store");
                assert_eq!(texts(samples.samples()), texts(&stored), "round {round}, {scope:?}, shards {shards:?}");
                cache.give_back(scope, samples);
            }
            coordinator.finish_marks(&marks).await.expect("finish");
        }
        assert!(
            partial > 0 && partial < passes && cleared > 0,
            "{partial} of {passes} scope passes held, the cache cleared {cleared} times"
        );
    }

    /// Samples older than retention's cut-off go; a scope not passed for a while is let go;
    /// samples lent and not given back are read anew.
    #[tokio::test]
    async fn retention_idle_scopes_and_samples_not_given_back() {
        let directory = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open_dir(directory.path()).await.expect("store");
        let scope = &scopes()[0];
        let batch: Vec<Sample> =
            (1..=5).map(|step| sample(scope, "lagscope.server.applied_state", "nn-1", step * 100, 1.0, None)).collect();
        store.ingest(&IngestBatch { samples: batch, ..IngestBatch::default() }).await.expect("ingest");
        let mut cache = SampleCache::new(100);
        let start = Instant::now();
        let read = |from: Option<i64>| {
            let store = &store;
            async move {
                match from {
                    Some(from) => {
                        Some(store.scope_samples_from(Some("prod"), Some("ns1"), WINDOW, from).await.expect("read"))
                    }
                    None => None,
                }
            }
        };
        let from = cache.read_from(scope, start);
        assert_eq!(from, Some(i64::MIN), "not held: read in full");
        let samples = cache.take(scope, read(from).await, WINDOW, Some(250), start);
        assert_eq!(samples.samples().iter().map(|sample| sample.time_unix_nano).collect::<Vec<_>>(), [300, 400, 500]);
        cache.give_back(scope, samples);
        assert_eq!(cache.held(), 3);
        assert_eq!(cache.read_from(scope, start), None, "held, nothing committed since");

        // Lent and not given back: read anew.
        let samples = cache.take(scope, None, WINDOW, None, start);
        assert_eq!(samples.len(), 3);
        drop(samples);
        assert_eq!(cache.read_from(scope, start), Some(i64::MIN));

        // Not passed for a while: let go.
        let samples = cache.take(scope, read(Some(i64::MIN)).await, WINDOW, None, start);
        cache.give_back(scope, samples);
        assert_eq!(cache.held(), 5);
        cache.committed(&BTreeMap::new(), start + held::IDLE_AFTER);
        assert_eq!(cache.held(), 0);
    }
}
