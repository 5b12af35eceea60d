//! The live analyzer: re-analyzes each client whose spans were just committed and stores
//! what it finds. Same detectors as `lagscope analyze`, over the store instead of a file.
//!
//! On SQLite (one process) the receivers' in-memory marks say what to look at. On PostgreSQL
//! several instances may share the database: marks are committed with the data, the work is
//! split into shards held under leases ([`lagscope_store::Coordinator`]), and each instance
//! analyses the marks of its shards, whoever ingested them.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lagscope_analyzer::log_events::{LogEvent, LogEventKind, classify, take_once};
use lagscope_analyzer::{
    AnalysisInput, HeldTimelines, SpanKey, analyze_held_kinds, analyze_kinds, growing, read_rollups,
};
use lagscope_collector::{DirtyClients, Pending};
use lagscope_model::{AnomalyKind, ROLLUP_STEP, ReadRollup, UnixNanos, rollup_step_of};
use lagscope_selfmetrics::{Counter, SelfMetrics};
use lagscope_store::{Coordinator, Mark, Store, TimeRange};
use tokio::sync::watch;

use crate::Config;
use crate::client_cache::{ClientCache, Loaded};
use crate::held::{LateSpans, Settling};
use crate::line_cache::LineCache;
use crate::sample_cache::SampleCache;
use crate::scope_cache::{ScopeCache, Source};

/// Marks analysed per pass on PostgreSQL: a pass is short enough that newly committed data
/// and lease changes are looked at again soon.
const MARKS_PER_PASS: u32 = 2_000;

/// After a failed pass, the marks stay; the next try waits this long.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(1);

pub async fn run_live_analyzer(
    store: Arc<dyn Store>,
    dirty: Arc<DirtyClients>,
    metrics: Arc<SelfMetrics>,
    config: Config,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    if store.coordinator().is_some() {
        return run_coordinated(store, dirty, metrics, config, shutdown).await;
    }
    let mut shutdown = shutdown;
    // The marks of this process's commits carry their sample times: scopes' samples are held.
    let mut kept = Kept::new(&config, config.live.scope_cache_samples, &metrics);
    // Each pass's findings are stored while the next pass analyses: most of a write is the
    // wait for the store's one writer (ingest holds it) and the log's sync, time in which the
    // next pass would otherwise stand still. At most one pass's findings wait to be written;
    // they are written in pass order.
    let (to_writer, passes) = tokio::sync::mpsc::channel(1);
    let writer = tokio::spawn(write_passes(Arc::clone(&store), Arc::clone(&metrics), passes));
    loop {
        let pending = tokio::select! {
            pending = dirty.take() => pending,
            _ = shutdown.wait_for(|stop| *stop) => break,
        };
        let started = Instant::now();
        let (through_batch, first_queued) = (pending.through_batch, pending.first_queued);
        let findings = analysis_pass(store.as_ref(), &metrics, &config, &mut kept, pending, None).await;
        let analysed = Analysed { findings, started, analysed: started.elapsed(), first_queued, through_batch };
        if to_writer.send(analysed).await.is_err() {
            break;
        }
    }
    // What the last passes found is stored before the analyzer stops.
    drop(to_writer);
    writer.await?;
    Ok(())
}

/// One pass's findings on their way to the store, and when the pass ran.
struct Analysed {
    /// `Err`: the pass failed; nothing to store.
    findings: Result<Findings, lagscope_store::StoreError>,
    started: Instant,
    /// The pass's analysis, without its write.
    analysed: Duration,
    first_queued: Option<Instant>,
    through_batch: u64,
}

/// Stores each pass's findings in pass order; a pass's batches count as analysed (and its
/// delay is measured) once its findings are stored.
async fn write_passes(
    store: Arc<dyn Store>,
    metrics: Arc<SelfMetrics>,
    mut passes: tokio::sync::mpsc::Receiver<Analysed>,
) {
    let mut recorder = Recorder::default();
    loop {
        let analysed = tokio::select! {
            analysed = passes.recv() => match analysed {
                Some(analysed) => analysed,
                None => break,
            },
            // What the last passes found is logged even when nothing more arrives.
            () = tokio::time::sleep(NEW_ANOMALIES_LOG_INTERVAL), if recorder.found.count > 0 => {
                recorder.found.log_every(NEW_ANOMALIES_LOG_INTERVAL);
                continue;
            }
        };
        let waited = analysed.started.elapsed().saturating_sub(analysed.analysed);
        let writing = Instant::now();
        let outcome = match analysed.findings {
            Ok(findings) => recorder.store(store.as_ref(), &metrics, findings).await,
            Err(error) => Err(error),
        };
        let writes = writing.elapsed();
        recorder.found.log_every(NEW_ANOMALIES_LOG_INTERVAL);
        match outcome {
            Ok(()) => metrics.analysis_passes.add(1),
            Err(error) => {
                // The data is committed; the next pass for these clients will find it again.
                metrics.analysis_errors.add(1);
                tracing::error!(%error, "live analysis pass failed");
            }
        }
        metrics.analysis_latency.observe(analysed.started.elapsed());
        let delay = analysed.first_queued.map(|queued| queued.elapsed());
        if let Some(delay) = delay {
            metrics.analysis_delay.observe(delay);
        }
        metrics.batches_analyzed.raise_to(analysed.through_batch);
        tracing::debug!(
            // From the pass's end to its write's start: the write of the pass before.
            waited_ms = waited.as_millis(),
            writes_ms = writes.as_millis(),
            delay_ms = delay.unwrap_or_default().as_millis(),
            "pass findings stored"
        );
    }
    recorder.found.log_every(Duration::ZERO);
}

/// The live analyzer on a database several instances share: a lease keeper renews and
/// balances this instance's shards while the analyzer works through their marks.
async fn run_coordinated(
    store: Arc<dyn Store>,
    dirty: Arc<DirtyClients>,
    metrics: Arc<SelfMetrics>,
    config: Config,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let Some(coordinator) = store.coordinator() else { return Ok(()) };
    let instance = config.cluster.instance_id();
    let lease = Duration::from_secs(config.cluster.lease_seconds);
    tracing::info!(%instance, lease_seconds = config.cluster.lease_seconds, "live analysis shared through database leases");
    let (leases_tx, leases_rx) = watch::channel(HeldShards::default());
    let keeper = keep_leases(coordinator, &instance, lease, &metrics, leases_tx, shutdown.clone());
    let analyzer = analyze_marks(store.as_ref(), coordinator, &dirty, &metrics, &config, leases_rx, shutdown);
    let ((), ()) = tokio::join!(keeper, analyzer);
    // A clean stop hands the shards over now rather than when the leases run out.
    if let Err(error) = coordinator.release(&instance).await {
        tracing::warn!(%error, %instance, "could not release the analysis leases; they expire on their own");
    }
    Ok(())
}

/// The shards this instance holds, as the lease keeper last published them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct HeldShards {
    /// Ascending.
    shards: Vec<i32>,
    /// Balancing rounds so far that took shards: the marks of a shard taken may have been
    /// analysed elsewhere since this instance last held it (so what it kept of them is stale).
    claims: u64,
}

/// Balances every third of the lease and publishes the shards held. A round that fails keeps
/// the shards known to be held until their leases would have run out.
async fn keep_leases(
    coordinator: &dyn Coordinator,
    instance: &str,
    lease: Duration,
    metrics: &SelfMetrics,
    leases_tx: watch::Sender<HeldShards>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut held_until = Instant::now();
    let mut claims = 0;
    loop {
        let round_started = Instant::now();
        match coordinator.balance(instance, lease).await {
            Ok(leases) => {
                if !leases.claimed.is_empty() || !leases.released.is_empty() {
                    tracing::info!(
                        %instance,
                        claimed = ?leases.claimed,
                        released = ?leases.released,
                        held = leases.shards.len(),
                        live_instances = leases.live_instances,
                        "analysis shards moved"
                    );
                }
                metrics.cluster_shards_claimed.add(leases.claimed.len() as u64);
                metrics.cluster_shards_held.set(leases.shards.len() as u64);
                metrics.cluster_live_instances.set(u64::from(leases.live_instances));
                held_until = round_started + lease;
                claims += u64::from(!leases.claimed.is_empty());
                leases_tx.send_replace(HeldShards { shards: leases.shards, claims });
            }
            Err(error) => {
                metrics.cluster_lease_failures.add(1);
                tracing::error!(%error, %instance, "lease balancing round failed");
                if Instant::now() >= held_until {
                    metrics.cluster_shards_held.set(0);
                    leases_tx.send_replace(HeldShards { shards: Vec::new(), claims });
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(lease / 3) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
    }
}

/// Takes the marks of the shards held, oldest first, and analyses them; removes each mark
/// once analysed (unless it was marked again meanwhile). Wakes on this instance's commits,
/// and every poll interval for the others'.
async fn analyze_marks(
    store: &dyn Store,
    coordinator: &dyn Coordinator,
    dirty: &DirtyClients,
    metrics: &SelfMetrics,
    config: &Config,
    mut leases: watch::Receiver<HeldShards>,
    mut shutdown: watch::Receiver<bool>,
) {
    let poll = Duration::from_millis(config.cluster.poll_interval_ms);
    // Scope marks carry the oldest time of the samples committed to the scope: scopes'
    // samples are held, with the care `hold_samples` takes.
    let mut kept = Kept::new(config, config.live.scope_cache_samples, metrics);
    let mut claims = 0;
    let mut recorder = Recorder::default();
    loop {
        let held = leases.borrow_and_update().clone();
        let shards = held.shards;
        // Batches committed here before the marks are read: analysed once the marks are.
        let marked = metrics.batches_marked.get();
        let started = Instant::now();
        // Whether a pass ran, and whether it took every mark waiting.
        let outcome = async {
            let marks = coordinator.pending_marks(&shards, MARKS_PER_PASS).await?;
            if marks.is_empty() {
                return Ok((false, true));
            }
            let claimed = std::mem::replace(&mut claims, held.claims) != held.claims;
            if claimed {
                // Lines committed while another instance held a cluster's mark were read there.
                kept.lines.current.clear();
            }
            hold_samples(&mut kept.samples, &shards, claimed, marks.len() < MARKS_PER_PASS as usize);
            let held: HashSet<i32> = shards.iter().copied().collect();
            let pass = resolve_marks(store, coordinator, &held, &marks).await?;
            let findings = analysis_pass(store, metrics, config, &mut kept, pass, Some(&held)).await?;
            recorder.store(store, metrics, findings).await?;
            recorder.found.log_every(NEW_ANOMALIES_LOG_INTERVAL);
            coordinator.finish_marks(&marks).await?;
            Ok::<_, lagscope_store::StoreError>((true, marks.len() < MARKS_PER_PASS as usize))
        }
        .await;
        if let Ok((true, _)) = outcome {
            metrics.analysis_passes.add(1);
            metrics.analysis_latency.observe(started.elapsed());
        }
        match outcome {
            // Nothing more waiting: sleep until woken.
            Ok((_, true)) => {
                // (Once shards are held: batches whose marks fall in shards held elsewhere are
                // those instances' to analyse; /api/v1/cluster counts what waits anywhere.)
                if !shards.is_empty() {
                    metrics.batches_analyzed.raise_to(marked);
                }
                recorder.found.log_every(NEW_ANOMALIES_LOG_INTERVAL);
                tokio::select! {
                    _ = dirty.take() => {}
                    _ = leases.changed() => {}
                    () = tokio::time::sleep(poll) => {}
                    _ = shutdown.wait_for(|stop| *stop) => return,
                }
                continue;
            }
            Ok((_, false)) => {}
            Err(error) => {
                metrics.analysis_errors.add(1);
                tracing::error!(%error, "live analysis pass failed; its marks stay for the next one");
                tokio::select! {
                    () = tokio::time::sleep(RETRY_AFTER_FAILURE) => {}
                    _ = shutdown.wait_for(|stop| *stop) => return,
                }
                continue;
            }
        }
        if *shutdown.borrow() {
            return;
        }
    }
}

/// Which scopes' samples the sample cache may hold for a pass (on a database several instances
/// share), so that what it holds plus what the pass's marks say was committed since is what
/// the store holds, as on SQLite, where the marks are this process's own:
/// - nothing held survives a round that took shards (`claimed`): their marks may have been
///   analysed, and removed, by another instance meanwhile;
/// - nor a pass that leaves marks of its shards waiting (it took as many as a pass takes, not
///   `every_mark_taken`): what they stand for is already visible to the pass's reads, but
///   their sample times are not known yet;
/// - a scope is held only while this instance holds the shards of its own mark and of its
///   cluster's samples of no namespace (read with it, marked under `(cluster, None)`); and not
///   without a cluster, whose samples mark no scope.
pub(crate) fn hold_samples(cache: &mut SampleCache, shards: &[i32], claimed: bool, every_mark_taken: bool) {
    if claimed || !every_mark_taken {
        cache.clear();
    }
    let held: HashSet<i32> = shards.iter().copied().collect();
    cache.hold_only(Box::new(move |(cluster, namespace): &ScopeKey| {
        cluster.is_some()
            && held.contains(&Mark::Scope(cluster.clone(), namespace.clone()).shard())
            && held.contains(&Mark::Scope(cluster.clone(), None).shard())
    }));
}

/// What a set of marks asks for, as one pass: the clients of marked traces (their spans are
/// committed now) join the pass when their shard is held here and are marked for their own
/// shard's holder otherwise.
pub(crate) async fn resolve_marks(
    store: &dyn Store,
    coordinator: &dyn Coordinator,
    held: &HashSet<i32>,
    marks: &[lagscope_store::PendingMark],
) -> Result<Pending, lagscope_store::StoreError> {
    let mut pass = Pending::default();
    let mut traces = Vec::new();
    for pending in marks {
        match &pending.mark {
            Mark::Client(client_id) => {
                pass.clients.insert(client_id.clone());
            }
            Mark::Trace(trace_id) => traces.push(trace_id.clone()),
            Mark::Scope(cluster, namespace) => {
                let scope = (cluster.clone(), namespace.clone());
                if let Some(time) = pending.samples_from {
                    let oldest = pass.sample_times.entry(scope.clone()).or_insert(time);
                    *oldest = (*oldest).min(time);
                }
                pass.scopes.insert(scope);
            }
            Mark::LogCluster(cluster) => {
                pass.log_clusters.insert(cluster.clone());
            }
        }
    }
    let clients = store.clients_of_traces(&traces).await?;
    route_clients(coordinator, held, clients, &mut pass.clients).await?;
    Ok(pass)
}

/// Clients to analyse again: those whose shard is `held` here join `pass`, the others are
/// marked for their shards' holders.
async fn route_clients(
    coordinator: &dyn Coordinator,
    held: &HashSet<i32>,
    clients: impl IntoIterator<Item = String>,
    pass: &mut BTreeSet<String>,
) -> Result<(), lagscope_store::StoreError> {
    let mut elsewhere = Vec::new();
    for client_id in clients {
        let mark = Mark::Client(client_id);
        if held.contains(&mark.shard()) {
            if let Mark::Client(client_id) = mark {
                pass.insert(client_id);
            }
        } else {
            elsewhere.push(mark);
        }
    }
    if !elsewhere.is_empty() {
        coordinator.add_marks(&elsewhere).await?;
    }
    Ok(())
}

/// What the live analyzer keeps from one pass to the next.
struct Kept {
    lines: RecognisedLines,
    scope_spans: ScopeCache,
    client_spans: ClientCache,
    samples: SampleCache,
    /// How far behind the newest span the held timelines are settled, widened by late spans.
    settling: Settling,
    /// Which clients called cluster URLs from which processes.
    callers: AddressCallers,
}

impl Kept {
    /// Holding at most `samples` metric samples between passes (0: none); the settling's gauge
    /// set to where it starts.
    fn new(config: &Config, samples: usize, metrics: &SelfMetrics) -> Self {
        let horizon = config.analyzer.stream.horizon();
        let settling = Settling::new(config.live.settle_seconds, config.live.max_settle_seconds, Instant::now());
        metrics.analysis_settle_seconds.set(settling.seconds());
        Self {
            lines: RecognisedLines::default(),
            scope_spans: ScopeCache::new(config.live.scope_cache_spans, horizon),
            client_spans: ClientCache::new(config.live.client_cache_spans, horizon),
            samples: SampleCache::new(samples),
            settling,
            callers: AddressCallers::default(),
        }
    }
}

/// Takes what a cache's catch-up found late: counted on `counter`, and the settling widened
/// for it (its gauge with it).
fn take_late<K: Eq + std::hash::Hash + std::fmt::Debug>(
    late: &mut LateSpans<K>,
    counter: &Counter,
    settling: &mut Settling,
    metrics: &SelfMetrics,
) {
    let (count, wanted) = late.take();
    counter.add(count);
    settling.observe(wanted, Instant::now());
    metrics.analysis_settle_seconds.set(settling.seconds());
}

/// The read rollups this analyzer last wrote, per scope: a pass writes only the rows that
/// changed. Holds the minutes of each scope's latest pass (the scope window), no more.
#[derive(Default)]
struct WrittenRollups {
    by_scope: HashMap<ScopeKey, HashMap<(i64, Option<String>), ReadRollup>>,
}

/// (cluster, namespace).
type ScopeKey = (Option<String>, Option<String>);

impl WrittenRollups {
    /// Of the scopes' read rollups (from the minute their reads are complete), those that
    /// differ from what was written before.
    fn changed(&self, rollups_of_scopes: &[(ScopeKey, Vec<ReadRollup>)]) -> Vec<ReadRollup> {
        let mut changed: Vec<ReadRollup> = Vec::new();
        for (scope, rollups) in rollups_of_scopes {
            let written = self.by_scope.get(scope);
            changed.extend(
                rollups
                    .iter()
                    .filter(|rollup| {
                        written.and_then(|written| written.get(&(rollup.minute_unix_nano, rollup.node.clone())))
                            != Some(*rollup)
                    })
                    .cloned(),
            );
        }
        changed
    }

    /// The scopes' rollups are stored: each scope's replace what was held of it.
    fn wrote(&mut self, rollups_of_scopes: Vec<(ScopeKey, Vec<ReadRollup>)>) {
        for (scope, rollups) in rollups_of_scopes {
            let written = rollups.into_iter().map(|rollup| ((rollup.minute_unix_nano, rollup.node.clone()), rollup));
            self.by_scope.insert(scope, written.collect());
        }
    }
}

/// What one pass found, stored in one write ([`Recorder::store`]): every anomaly of its
/// clients, scopes and clusters, and its scopes' read rollups.
#[derive(Default)]
struct Findings {
    anomalies: Vec<Arc<lagscope_model::Anomaly>>,
    rollups: Vec<(ScopeKey, Vec<ReadRollup>)>,
}

/// What the passes' writes keep from one to the next: what was written (not written again
/// unchanged), and the new anomalies not logged yet.
#[derive(Default)]
struct Recorder {
    rollups: WrittenRollups,
    found: NewAnomalies,
    written: WrittenAnomalies,
}

impl Recorder {
    /// Stores what the pass found that was not written before as it is now, anomalies and
    /// rollups in one transaction ([`Store::upsert_findings`]).
    async fn store(
        &mut self,
        store: &dyn Store,
        metrics: &SelfMetrics,
        findings: Findings,
    ) -> Result<(), lagscope_store::StoreError> {
        let Recorder { rollups, found, written } = self;
        written.next_pass();
        let hashed: Vec<_> =
            findings.anomalies.iter().map(|anomaly| (anomaly, written.content_hash(anomaly))).collect();
        let (anomalies, unchanged): (Vec<_>, Vec<_>) =
            hashed.into_iter().partition(|(anomaly, hash)| !written.seen(anomaly, *hash));
        metrics.anomalies_unchanged.add(unchanged.len() as u64);
        let changed_rollups = rollups.changed(&findings.rollups);
        let upsert: Vec<lagscope_model::Anomaly> =
            anomalies.iter().map(|(anomaly, _)| lagscope_model::Anomaly::clone(anomaly)).collect();
        let outcome = store.upsert_findings(&upsert, &changed_rollups, now_unix_nano()).await?;
        for (anomaly, hash) in anomalies {
            written.wrote(anomaly, hash);
        }
        rollups.wrote(findings.rollups);
        metrics.anomalies_new.add(outcome.inserted.len() as u64);
        metrics.anomalies_changed.add(outcome.updated);
        metrics.anomalies_unchanged.add(outcome.unchanged);
        metrics.anomalies_superseded.add(outcome.superseded);
        for &id in &outcome.inserted {
            tracing::debug!(anomaly_id = id, "new anomaly");
            found.add(id);
        }
        Ok(())
    }
}

/// The recognised log lines of each cluster, as last read from the store: every pass sees
/// them, not only the passes of batches that brought new lines (a window's evidence would
/// otherwise change with which batch came last). Re-read when a cluster's lines arrive; as
/// the store's read, at most `max_logs_per_cluster` lines of the scope window per cluster.
#[derive(Default)]
struct RecognisedLines {
    /// Shared (not copied) with every pass that reads them.
    by_cluster: BTreeMap<Option<String>, Vec<Arc<LogEvent>>>,
    /// The lines that name a client (a Pulsar client's switches, an Ozone client's disabling
    /// of follower reads), by client: what each client pass reads.
    by_client: HashMap<String, Vec<Arc<LogEvent>>>,
    /// Switch lines that name no client, by the process (cluster, node) that logged them: a
    /// client pass reads those of the processes it is the one client of ([`AddressCallers`]).
    unnamed_switches: HashMap<Process, Vec<Arc<LogEvent>>>,
    /// What the store fed (SQLite): each cluster's lines, read and classified once.
    held: LineCache,
    /// Several instances sharing the database: the clusters whose lines were read since this
    /// instance last claimed shards, while it held their marks' shards. It reads every new line
    /// of those (their marks are its own) and need not look again until it claims shards.
    current: HashSet<Option<String>>,
}

/// What a pass reads of a cluster's recognised lines: the scope window (nanoseconds) and the
/// newest `live.max_logs_per_cluster` of it.
fn lines_window(config: &Config) -> (i64, u32) {
    (config.live.scope_window_seconds * 1_000_000_000, config.live.max_logs_per_cluster)
}

impl RecognisedLines {
    /// Reads the recognised lines of the scope window of each of `clusters` (as the store's
    /// read, at most `max_logs_per_cluster` each), replacing what was held of them. On a feed
    /// they are held between passes: one read brings every cluster's lines committed since
    /// ([`LineCache::refresh`]). Whether any cluster's lines changed.
    async fn refresh(
        &mut self,
        store: &dyn Store,
        clusters: &[Option<String>],
        config: &Config,
        kept_from: Option<UnixNanos>,
    ) -> Result<bool, lagscope_store::StoreError> {
        let (window, limit) = lines_window(config);
        if let Some(feed) = store.span_feed() {
            let changed = self.held.refresh(feed, clusters, (window, limit), kept_from).await?;
            let any = !changed.is_empty();
            self.by_cluster.extend(changed);
            return Ok(any);
        }
        for cluster in clusters {
            // Only candidate lines (an index finds them) leave the store; classify decides.
            let logs = store.recognised_logs(cluster.as_deref(), window, limit).await?;
            let mut events: Vec<Arc<LogEvent>> = logs.iter().filter_map(classify).map(Arc::new).collect();
            // A line stored twice is one line: the store keeps a record sent again once, but
            // not one line forwarded by two shippers (observed twice).
            take_once(&mut events);
            self.by_cluster.insert(cluster.clone(), events);
        }
        Ok(!clusters.is_empty())
    }

    fn index_clients(&mut self) {
        self.by_client.clear();
        self.unnamed_switches.clear();
        for event in self.by_cluster.values().flatten() {
            if let Some(client) = &event.client_id {
                self.by_client.entry(client.clone()).or_default().push(Arc::clone(event));
            } else if event.kind == LogEventKind::ClusterSwitch
                && let Some(node) = &event.node_id
            {
                let process = (event.cluster.clone(), node.clone());
                self.unnamed_switches.entry(process).or_default().push(Arc::clone(event));
            }
        }
    }

    /// A client's lines: those that name it, and the unnamed switch lines of the processes it
    /// is the one client of, by `owned` ([`RecognisedLines::unnamed_by_owner`]), in time order.
    fn of_client(&self, client: &str, owned: &HashMap<&str, Vec<&Arc<LogEvent>>>) -> Vec<Arc<LogEvent>> {
        let mut events = self.by_client.get(client).cloned().unwrap_or_default();
        if let Some(unnamed) = owned.get(client) {
            events.extend(unnamed.iter().map(|event| Arc::clone(event)));
            events.sort_by_key(|event| event.time_unix_nano);
        }
        events
    }

    /// The unnamed switch lines, by the one client of the process that logged them (every
    /// process with such lines found in `owners`).
    fn unnamed_by_owner<'a>(&'a self, owners: &'a ProcessOwners) -> HashMap<&'a str, Vec<&'a Arc<LogEvent>>> {
        let mut owned: HashMap<&str, Vec<&Arc<LogEvent>>> = HashMap::new();
        for (process, events) in &self.unnamed_switches {
            if let Some(client) = owners.owner(process) {
                owned.entry(client).or_default().extend(events);
            }
        }
        owned
    }
}

/// A process: the cluster and node of its resource.
type Process = (Option<String>, String);

/// The clients that called cluster URLs (`server.address`) from each process, as this
/// instance's client passes saw them: the switch lines a process logs without naming a client
/// are the switches of its one such client (`failover_flapping`), and of no one where there
/// are several. A client not seen for a scope window is forgotten. With several instances
/// sharing a database, each sees the clients of the shards it holds: what they saw is written
/// to the database ([`Coordinator::note_process_clients`]) and the owners are read from there
/// ([`ProcessOwners`]).
#[derive(Default)]
struct AddressCallers {
    /// Per process, its clients (at most two are kept: two is already "several"), each with
    /// when a pass last saw it.
    processes: HashMap<Process, Vec<(String, Instant)>>,
    pruned: Option<Instant>,
    /// Several instances: when this instance last wrote each pair to the database.
    written: HashMap<(Process, String), Instant>,
}

impl AddressCallers {
    fn note(&mut self, (cluster, node): (Option<&str>, &str), client: &str, now: Instant) {
        let process = (cluster.map(str::to_string), node.to_string());
        let clients = self.processes.entry(process).or_default();
        if let Some((_, seen)) = clients.iter_mut().find(|(known, _)| known == client) {
            *seen = now;
        } else if clients.len() < 2 {
            clients.push((client.to_string(), now));
        }
    }

    fn owner(&self, process: &Process) -> Option<&str> {
        match self.processes.get(process).map(Vec::as_slice) {
            Some([(client, _)]) => Some(client),
            _ => None,
        }
    }

    /// Whether a pair seen at `now` is to be written to the database: it never was, or not for
    /// a quarter of `window` (the database forgets pairs not written for a window).
    fn write_due(&self, (cluster, node): (Option<&str>, &str), client: &str, window: Duration, now: Instant) -> bool {
        let pair = ((cluster.map(str::to_string), node.to_string()), client.to_string());
        self.written.get(&pair).is_none_or(|written| now.duration_since(*written) >= window / 4)
    }

    /// Notes the pairs written to the database at `now`.
    fn wrote(&mut self, pairs: Vec<(Option<String>, String, String)>, now: Instant) {
        for (cluster, node, client) in pairs {
            self.written.insert(((cluster, node), client), now);
        }
    }

    /// Forgets the clients not seen for `window` (looked at once per `window` at most);
    /// whether it looked.
    fn prune(&mut self, window: Duration, now: Instant) -> bool {
        if self.pruned.is_some_and(|pruned| now.duration_since(pruned) < window) {
            return false;
        }
        self.pruned = Some(now);
        for clients in self.processes.values_mut() {
            clients.retain(|(_, seen)| now.duration_since(*seen) < window);
        }
        self.processes.retain(|_, clients| !clients.is_empty());
        self.written.retain(|_, written| now.duration_since(*written) < window);
        true
    }
}

/// The one client of each process a pass asks about (whose its unnamed switch lines are): from
/// this instance's [`AddressCallers`] alone, or, with several instances sharing the database,
/// from what every instance wrote there (the clients of one process may be analysed by
/// different instances, each seeing only its own). Read once per process per pass.
struct ProcessOwners<'a> {
    shared: Option<(&'a dyn Coordinator, Duration)>,
    known: HashMap<Process, Option<String>>,
}

impl<'a> ProcessOwners<'a> {
    fn new(shared: Option<(&'a dyn Coordinator, Duration)>) -> Self {
        Self { shared, known: HashMap::new() }
    }

    /// Finds the owners of `processes` not asked about before.
    async fn find<'p>(
        &mut self,
        processes: impl IntoIterator<Item = &'p Process>,
        callers: &AddressCallers,
    ) -> Result<(), lagscope_store::StoreError> {
        let asked: Vec<&Process> = processes.into_iter().filter(|process| !self.known.contains_key(*process)).collect();
        match self.shared {
            Some((coordinator, window)) if !asked.is_empty() => {
                let keys: Vec<(Option<&str>, &str)> =
                    asked.iter().map(|(cluster, node)| (cluster.as_deref(), node.as_str())).collect();
                let owners = coordinator.process_owners(&keys, window).await?;
                self.known.extend(asked.into_iter().cloned().zip(owners));
            }
            _ => {
                for process in asked {
                    self.known.insert(process.clone(), callers.owner(process).map(str::to_string));
                }
            }
        }
        Ok(())
    }

    /// The owner of a process found before.
    fn owner(&self, process: &Process) -> Option<&str> {
        self.known.get(process).and_then(Option::as_deref)
    }
}

async fn analysis_pass(
    store: &dyn Store,
    metrics: &SelfMetrics,
    config: &Config,
    kept: &mut Kept,
    pending: Pending,
    held_shards: Option<&HashSet<i32>>,
) -> Result<Findings, lagscope_store::StoreError> {
    let Kept { lines, scope_spans: cache, client_spans: client_cache, samples: sample_cache, settling, callers } = kept;
    // Before any read: every commit the marks name is visible to this pass's reads.
    sample_cache.committed(&pending.sample_times, Instant::now());
    let mut scopes = pending.scopes;
    let mut findings = Findings::default();
    let mut times = PassTimes::default();
    let mut lap = Instant::now();
    // The recognised lines of each cluster with new log records: they name the scopes to look
    // at again, and replace what the passes remember of the cluster's lines. (Passes of
    // clusters without new logs read none from the store: reading a busy cluster's logs on
    // every batch of spans would cost more than the spans.)
    // What the retention has cut (or is about to): held spans, samples and lines go with it.
    let retention = config.retention.durations().ok().unwrap_or_default();
    let [kept_from, samples_kept_from, logs_kept_from, _] =
        retention.map(|keep| keep.map(|keep| now_unix_nano() - keep));
    // Whether this instance holds the mark of a cluster's new lines (always, on SQLite).
    let holds_lines = |cluster: &Option<String>| {
        held_shards.is_none_or(|held| held.contains(&Mark::LogCluster(cluster.clone()).shard()))
    };
    let log_clusters: Vec<Option<String>> = pending.log_clusters.iter().cloned().collect();
    lines.refresh(store, &log_clusters, config, logs_kept_from).await?;
    for cluster in &log_clusters {
        let events = lines.by_cluster.get(cluster).into_iter().flatten();
        scopes.extend(events.map(|event| (cluster.clone(), event.namespace.clone())));
        if held_shards.is_some() && holds_lines(cluster) {
            lines.current.insert(cluster.clone());
        }
    }
    let mut clients: BTreeSet<String> = pending.clients;
    // Several instances: who the clients of a process are is known from the database.
    let callers_window = Duration::from_secs(config.live.scope_window_seconds.max(1) as u64);
    let shared = held_shards.and(store.coordinator()).map(|coordinator| (coordinator, callers_window));
    let mut owners = ProcessOwners::new(shared);
    if !pending.log_clusters.is_empty() {
        lines.index_clients();
        // Switch lines that name no client are their process's client's: its pass reads those
        // of the clusters just read now, though it sent no span since (the pass of the
        // instance that holds its shard, when several share the database).
        let new_lines: Vec<&Process> =
            lines.unnamed_switches.keys().filter(|process| pending.log_clusters.contains(&process.0)).collect();
        owners.find(new_lines.iter().copied(), callers).await?;
        let owners: Vec<String> =
            new_lines.iter().filter_map(|process| owners.owner(process).map(str::to_string)).collect();
        match (held_shards, shared) {
            (Some(held), Some((coordinator, _))) => route_clients(coordinator, held, owners, &mut clients).await?,
            _ => clients.extend(owners),
        }
    }
    let traces: Vec<String> = pending.traces.into_iter().collect();
    clients.extend(store.clients_of_traces(&traces).await?);
    let client_limit = config.live.max_spans_per_client;
    times.logs_and_traces += lap.elapsed();
    // Node- and namespace-level detectors (lags, storms, windows, pressure) need every
    // client's spans and the metrics of the scope: one pass per touched scope, a few scopes at
    // a time (their samples and spans are held together while analysed).
    // (The clusters of these scopes get the per-cluster pass below.)
    let clusters: BTreeSet<Option<String>> = scopes.iter().map(|(cluster, _)| cluster.clone()).collect();
    let scope_count = scopes.len();
    let window = config.live.scope_window_seconds * 1_000_000_000;
    let scopes: Vec<ScopeKey> = scopes.into_iter().collect();
    let threads = config.live.threads();
    let scope_chunk = SCOPES_AT_ONCE.max(threads);
    // The first few scopes' samples before the span feed is read: their spans can then come
    // from the clients' read of the feed (on PostgreSQL each read waits for the ingests in
    // flight), and still not from before their samples (see the scope loop).
    lap = Instant::now();
    let mut first_samples = match scopes.chunks(scope_chunk).next() {
        Some(chunk) => Some(read_samples(store, sample_cache, chunk, window, samples_kept_from).await?),
        None => None,
    };
    times.scope_samples += lap.elapsed();
    lap = Instant::now();
    let feed = store.span_feed();
    let mut latest = match feed {
        Some(feed) if !clients.is_empty() || !scopes.is_empty() => Some(feed.latest_span_id().await?),
        _ => None,
    };
    // What the client cache's catch-up read of everything committed since its last one: the
    // scope cache's first catch-up of the pass takes its part of it from memory.
    let mut committed = None;
    if let (Some(feed), Some(latest)) = (feed, latest)
        && !clients.is_empty()
    {
        committed = client_cache.catch_up(feed, latest, client_limit, Instant::now()).await?;
        take_late(client_cache.late(), &metrics.analysis_late_spans, settling, metrics);
    }
    times.client_catch_up += lap.elapsed();
    let client_count = clients.len();
    // Every client's spans first (the cache's, or read), then its analysis, on the pass's
    // threads: the analysis is pure, and most of a busy pass.
    let mut not_held: HashMap<&str, Vec<lagscope_model::Span>> = HashMap::new();
    for client_id in &clients {
        match feed {
            Some(feed) => match client_cache.load(feed, client_id, client_limit, kept_from, Instant::now()).await? {
                Loaded::Held => metrics.client_reads_cached.add(1),
                Loaded::ReadAndHeld => metrics.client_reads_full.add(1),
                Loaded::Read(spans) => {
                    metrics.client_reads_full.add(1);
                    not_held.insert(client_id, spans.into_iter().map(|(_, span)| span).collect());
                }
            },
            None => {
                metrics.client_reads_full.add(1);
                not_held.insert(client_id, store.client_spans(client_id, TimeRange::ALL, client_limit).await?);
            }
        }
    }
    let lines_lap = Instant::now();
    if held_shards.is_some() {
        // Several instances share the database: a cluster's new lines were read by the holder
        // of its mark, seldom the instance that analyses its clients and scopes. The lines of
        // the clusters this pass's clients and scopes are in are brought up to date here (on a
        // feed, the lines committed since this instance last read them, for all those
        // clusters in one read), unless this instance holds their mark and has read them since
        // it last claimed shards.
        let mut of_pass: BTreeSet<&Option<String>> = scopes.iter().map(|(cluster, _)| cluster).collect();
        for client_id in &clients {
            match not_held.get(client_id.as_str()) {
                Some(spans) => of_pass.extend(
                    (spans.iter())
                        .filter(|span| span.call.client_id.as_deref() == Some(client_id.as_str()))
                        .map(|span| &span.resource.cluster),
                ),
                None => of_pass.extend(client_cache.clusters_of(client_id).into_iter().flatten()),
            }
        }
        let stale: Vec<Option<String>> = (of_pass.into_iter())
            .filter(|cluster| !pending.log_clusters.contains(*cluster))
            .filter(|cluster| !(holds_lines(cluster) && lines.current.contains(*cluster)))
            .cloned()
            .collect();
        if lines.refresh(store, &stale, config, logs_kept_from).await? {
            lines.index_clients();
        }
        lines.current.extend(stale.into_iter().filter(|cluster| holds_lines(cluster)));
    }
    times.client_lines += lines_lap.elapsed();
    let events_by_cluster = &lines.by_cluster;
    let mut work = Vec::with_capacity(clients.len());
    if !clients.is_empty() {
        owners.find(lines.unnamed_switches.keys(), callers).await?;
    }
    let unnamed_by_owner = lines.unnamed_by_owner(&owners);
    let judged_from: HashMap<&str, i64> = (clients.iter())
        .filter_map(|client_id| Some((client_id.as_str(), client_cache.late().judged_from(client_id)?)))
        .collect();
    let mut held = client_cache.held_mut(&clients.iter().map(String::as_str).collect());
    for client_id in &clients {
        let spans = match (not_held.get(client_id.as_str()), held.remove(client_id.as_str())) {
            (Some(spans), _) => Spans::Read(spans.iter().collect()),
            (None, Some(held)) => Spans::Held(held),
            (None, None) => Spans::Read(Vec::new()),
        };
        let probing = Instant::now();
        let probes = client_probes(store, &spans, client_id).await?;
        times.client_probes += probing.elapsed();
        // The client's own lines (a client that logs its switches is judged by them).
        let log_events = lines.of_client(client_id, &unnamed_by_owner);
        let judged_from = judged_from.get(client_id.as_str()).copied();
        work.push(ClientWork { client_id, spans, probes, log_events, judged_from });
    }
    times.client_reads += lap.elapsed();
    lap = Instant::now();
    let horizon = config.analyzer.stream.horizon();
    let settle_after = settling.after();
    let found_of_clients = on_threads(
        work,
        threads,
        |work| work.spans.len(),
        |work| {
            let started = Instant::now();
            let mut spans = work.spans;
            let span_count = spans.len();
            let mut input = match &mut spans {
                Spans::Held(held) => {
                    held.refresh();
                    let mut input = AnalysisInput::from_held(held, work.probes);
                    // Calls judged by an earlier pass and unchanged since are not judged again.
                    input.verdicts = held.take_verdicts();
                    input
                }
                Spans::Read(spans) => AnalysisInput::from_span_refs(spans, work.probes, horizon),
            };
            input.log_events = work.log_events;
            // Spans of shared traces bring in fragments of other clients' timelines: each
            // client's anomalies come from its own, complete pass.
            // (Kinds that name no client would be dropped below: they are not run.)
            let found = analyze_held_kinds(&mut input, &config.analyzer, is_client_pass_kind)
                .into_iter()
                .filter(|anomaly| {
                    anomaly.client_id.as_deref() == Some(work.client_id) && spans.reports(anomaly, work.judged_from)
                })
                .collect::<Vec<_>>();
            let address_callers: Vec<(Option<String>, String, String)> = (input.address_callers().into_iter())
                .map(|(cluster, node, client)| (cluster.map(str::to_string), node.to_string(), client.to_string()))
                .collect();
            let mut let_go = Vec::new();
            let analysed = started.elapsed();
            if let Spans::Held(held) = spans {
                let verdicts = std::mem::take(&mut input.verdicts);
                let (timelines, _) = input.into_parts();
                held.give_back(timelines);
                held.give_back_verdicts(verdicts);
                let_go = settle(held, &found, settle_after, config);
            }
            let took = Took::since(started, analysed, span_count, let_go.len());
            took.log_if_slow("client", || work.client_id.to_string());
            (found, let_go, address_callers)
        },
    );
    let now = Instant::now();
    let mut to_write = Vec::new();
    for (client_id, (found, let_go, address_callers)) in clients.iter().zip(found_of_clients) {
        client_cache.settled(client_id, let_go);
        findings.anomalies.extend(found);
        for (cluster, node, client) in address_callers {
            callers.note((cluster.as_deref(), &node), &client, now);
            if shared.is_some() && callers.write_due((cluster.as_deref(), &node), &client, callers_window, now) {
                to_write.push((cluster, node, client));
            }
        }
    }
    let pruned = callers.prune(callers_window, now);
    if let Some((coordinator, window)) = shared {
        let seen: Vec<(Option<&str>, &str, &str)> = (to_write.iter())
            .map(|(cluster, node, client)| (cluster.as_deref(), node.as_str(), client.as_str()))
            .collect();
        coordinator.note_process_clients(&seen).await?;
        callers.wrote(to_write, now);
        if pruned {
            coordinator.forget_process_clients(window).await?;
        }
    }
    drop(not_held);
    times.client_analysis += lap.elapsed();
    let limit = config.live.max_spans_per_scope;
    for chunk in scopes.chunks(scope_chunk) {
        // The samples first: what is committed meanwhile adds to the spans, and metrics read
        // after the spans would run ahead of them and close a window whose spans are still
        // arriving (the window ends where its cluster's telemetry has moved past it). The
        // first chunk's were read before the clients' read of the feed.
        lap = Instant::now();
        let samples = match first_samples.take() {
            Some(samples) => samples,
            None => read_samples(store, sample_cache, chunk, window, samples_kept_from).await?,
        };
        times.scope_samples += lap.elapsed();
        // From the scope cache, brought up to date after the samples: to the id the clients'
        // catch-up read for the first chunk, to a newer one for the others.
        let mut not_held: HashMap<&ScopeKey, Vec<lagscope_model::Span>> = HashMap::new();
        let now = Instant::now();
        if let Some(feed) = feed {
            let latest = match latest.take() {
                Some(latest) => latest,
                None => feed.latest_span_id().await?,
            };
            cache.catch_up(feed, latest, limit, kept_from, now, committed.take().as_ref()).await?;
            take_late(cache.late(), &metrics.analysis_scope_late_spans, settling, metrics);
            times.scope_catch_up += now.elapsed();
        }
        for scope in chunk {
            let source = match feed {
                Some(feed) => {
                    let (read, source) = cache.load(feed, scope, limit, kept_from, now).await?;
                    if let Some(spans) = read {
                        not_held.insert(scope, spans);
                    }
                    source
                }
                None => {
                    let spans =
                        store.scope_spans(scope.0.as_deref(), scope.1.as_deref(), TimeRange::ALL, limit).await?;
                    not_held.insert(scope, spans);
                    Source::Store
                }
            };
            match source {
                Source::Cached => metrics.scope_reads_cached.add(1),
                Source::Store => metrics.scope_reads_full.add(1),
            }
        }
        let judged_from: Vec<Option<i64>> = chunk.iter().map(|scope| cache.late().judged_from(scope)).collect();
        let mut held = cache.held_mut(chunk);
        let work: Vec<ScopeWork> = chunk
            .iter()
            .zip(samples)
            .zip(judged_from)
            .map(|((scope, samples), judged_from)| {
                let spans = match (not_held.get(scope), held.remove(scope)) {
                    (Some(spans), _) => Spans::Read(spans.iter().collect()),
                    (None, Some(held)) => Spans::Held(held),
                    (None, None) => Spans::Read(Vec::new()),
                };
                let (cluster, namespace) = scope;
                let log_events = events_by_cluster
                    .get(cluster)
                    .map(|events| {
                        // The namespace's lines, and every evidence line of the cluster
                        // (matched to anomalies by node and shard when attached).
                        events
                            .iter()
                            .filter(|event| event.namespace == *namespace || event.kind.is_evidence())
                            .map(Arc::clone)
                            .collect()
                    })
                    .unwrap_or_default();
                ScopeWork { spans, samples, log_events, judged_from }
            })
            .collect();
        times.scope_reads += lap.elapsed();
        lap = Instant::now();
        // (Widened, perhaps, by the scope cache's catch-up.)
        let settle_after = settling.after();
        let found_of_scopes = on_threads(
            work,
            threads,
            |work| work.spans.len(),
            |work| scope_analysis(work, limit, settle_after, config),
        );
        times.scope_analysis += lap.elapsed();
        for (scope, found_of_scope) in chunk.iter().zip(found_of_scopes) {
            found_of_scope.took.log_if_slow("scope", || {
                format!("{}/{}", scope.0.as_deref().unwrap_or("-"), scope.1.as_deref().unwrap_or("-"))
            });
            sample_cache.give_back(scope, found_of_scope.samples);
            cache.settled(scope, found_of_scope.let_go);
            times.scope_timelines += found_of_scope.timelines;
            findings.anomalies.extend(found_of_scope.anomalies.into_iter().map(Arc::new));
            findings.rollups.push((scope.clone(), found_of_scope.rollups));
        }
    }
    metrics.scope_spans_cached.set(cache.held() as u64);
    metrics.scope_samples_cached.set(sample_cache.held() as u64);
    metrics.client_spans_cached.set(client_cache.held() as u64);
    // Detectors comparing a node's namespaces (shards) with each other see the whole cluster.
    lap = Instant::now();
    for cluster in clusters {
        let window = config.live.scope_window_seconds * 1_000_000_000;
        let samples = store.cluster_samples(cluster.as_deref(), CLUSTER_METRICS, window).await?;
        if samples.is_empty() {
            continue;
        }
        let input = AnalysisInput::from_telemetry(&[], samples, config.analyzer.stream.horizon());
        findings.anomalies.extend(analyze_kinds(&input, &config.analyzer, is_cluster_kind).into_iter().map(Arc::new));
    }
    times.clusters += lap.elapsed();
    tracing::debug!(
        clients = client_count,
        scopes = scope_count,
        scope_spans_held = cache.held(),
        client_spans_held = client_cache.held(),
        logs_and_traces_ms = times.logs_and_traces.as_millis(),
        client_reads_ms = times.client_reads.as_millis(),
        client_catch_up_ms = times.client_catch_up.as_millis(),
        client_probes_ms = times.client_probes.as_millis(),
        client_lines_ms = times.client_lines.as_millis(),
        client_analysis_ms = times.client_analysis.as_millis(),
        scope_samples_ms = times.scope_samples.as_millis(),
        scope_spans_ms = times.scope_reads.saturating_sub(times.scope_samples).as_millis(),
        scope_catch_up_ms = times.scope_catch_up.as_millis(),
        scope_analysis_ms = times.scope_analysis.as_millis(),
        scope_timelines_ms = times.scope_timelines.as_millis(),
        clusters_ms = times.clusters.as_millis(),
        threads,
        "analysis pass"
    );
    Ok(findings)
}

/// The samples of `chunk`'s scopes, read at once (the store reads them on several
/// connections; SQLite: a thread each); held scopes read only what was committed to them
/// since (the sample cache).
async fn read_samples(
    store: &dyn Store,
    sample_cache: &mut SampleCache,
    chunk: &[ScopeKey],
    window: i64,
    samples_kept_from: Option<i64>,
) -> Result<Vec<lagscope_analyzer::IndexedSamples>, lagscope_store::StoreError> {
    let now = Instant::now();
    let reads = chunk.iter().map(|scope| {
        let from = sample_cache.read_from(scope, now);
        let (cluster, namespace) = scope;
        async move {
            match from {
                Some(from) => {
                    store.scope_samples_from(cluster.as_deref(), namespace.as_deref(), window, from).await.map(Some)
                }
                None => Ok(None),
            }
        }
    });
    let reads = futures::future::try_join_all(reads.collect::<Vec<_>>()).await?;
    Ok(chunk
        .iter()
        .zip(reads)
        .map(|(scope, read)| sample_cache.take(scope, read, window, samples_kept_from, now))
        .collect())
}

/// Where a pass's time went, for its debug line (`LAGSCOPE_LOG=lagscope::live=debug`).
#[derive(Default)]
struct PassTimes {
    /// Reading new log lines, and the clients of hop-only traces.
    logs_and_traces: Duration,
    /// Reading each client's spans (with their traces) and probe verdicts.
    client_reads: Duration,
    /// Of `client_reads`, the client cache's catch-up, the probe verdicts, and (several
    /// instances on one database) bringing the lines of the pass's clusters up to date.
    client_catch_up: Duration,
    client_probes: Duration,
    client_lines: Duration,
    /// (As `scope_analysis`.)
    client_analysis: Duration,
    /// Reading each scope's samples and spans (held or not), and the samples alone.
    scope_reads: Duration,
    scope_samples: Duration,
    /// Of `scope_reads`, the scope cache's catch-ups.
    scope_catch_up: Duration,
    /// Of the scope analysis, building the timelines (joining the spans, each pass anew),
    /// summed over the threads it ran on.
    scope_timelines: Duration,
    /// The client and scope analyses, from the first thread's start to the last one's end.
    scope_analysis: Duration,
    /// The per-cluster pass.
    clusters: Duration,
}

/// Scopes whose samples and spans a pass gathers before analysing them together (at least
/// one per thread): enough to keep the threads busy, few enough that the scopes' samples and
/// timelines are not all in memory at once.
const SCOPES_AT_ONCE: usize = 8;

/// What one client's analysis reads.
struct ClientWork<'a> {
    client_id: &'a str,
    spans: Spans<'a>,
    probes: Vec<lagscope_model::Sample>,
    log_events: Vec<Arc<LogEvent>>,
    /// Read anew for spans too late for what was held: what ended before this was reported
    /// by earlier passes ([`crate::held::LateSpans::judged_from`]).
    judged_from: Option<i64>,
}

/// What one scope's analysis reads.
struct ScopeWork<'a> {
    spans: Spans<'a>,
    samples: lagscope_analyzer::IndexedSamples,
    log_events: Vec<Arc<LogEvent>>,
    /// As [`ClientWork::judged_from`].
    judged_from: Option<i64>,
}

/// A client's or scope's spans: held with their timelines between passes, or read for this
/// pass alone.
enum Spans<'a> {
    Held(&'a mut HeldTimelines),
    Read(Vec<&'a lagscope_model::Span>),
}

impl Spans<'_> {
    fn len(&self) -> usize {
        match self {
            Self::Held(held) => held.len(),
            Self::Read(spans) => spans.len(),
        }
    }

    fn first_start(&self) -> Option<i64> {
        match self {
            Self::Held(held) => held.first_start(),
            Self::Read(spans) => spans.iter().map(|span| span.start_unix_nano).min(),
        }
    }

    /// Whether a pass over these spans reports `anomaly`: not when it is about attempts
    /// their held timeline settled ([`HeldTimelines::is_settled`]), nor when, read anew for
    /// late spans, it ended before what they may have changed (`judged_from`,
    /// [`crate::held::LateSpans::judged_from`]).
    fn reports(&self, anomaly: &lagscope_model::Anomaly, judged_from: Option<i64>) -> bool {
        !matches!(self, Self::Held(held) if held.is_settled(anomaly))
            && judged_from.is_none_or(|from| anomaly.end_unix_nano >= from)
    }

    fn iter(&self) -> Box<dyn Iterator<Item = &lagscope_model::Span> + '_> {
        match self {
            Self::Held(held) => Box::new(held.spans()),
            Self::Read(spans) => Box::new(spans.iter().copied()),
        }
    }
}

/// What one scope's analysis found, and what building its timelines took.
struct ScopeFound {
    anomalies: Vec<lagscope_model::Anomaly>,
    rollups: Vec<ReadRollup>,
    timelines: Duration,
    /// The scope's samples, to give back to the sample cache.
    samples: lagscope_analyzer::IndexedSamples,
    /// The spans its settling let go of ([`settle`]).
    let_go: Vec<(SpanKey, lagscope_model::Span)>,
    took: Took,
}

/// Settles a held window ([`HeldTimelines::settle`]) `after` its newest span ([`Settling`])
/// after its pass, with the anomalies the pass found holding what they may still grow over: at
/// most once per half of that time of telemetry. Returns the spans let go, for the cache's
/// count.
fn settle<A: Borrow<lagscope_model::Anomaly>>(
    held: &mut HeldTimelines,
    found: &[A],
    after: UnixNanos,
    config: &Config,
) -> Vec<(SpanKey, lagscope_model::Span)> {
    let Some(newest) = held.last_start() else { return Vec::new() };
    let before = newest.saturating_sub(after);
    if after == 0 || before.saturating_sub(held.last_settle()) < after / 2 {
        return Vec::new();
    }
    held.settle(before, growing(found, before, &config.analyzer))
}

/// The scope kinds over a scope's spans and samples, and the staleness of its reads per node
/// and minute (for the pages).
fn scope_analysis(work: ScopeWork<'_>, limit: u32, settle_after: UnixNanos, config: &Config) -> ScopeFound {
    let started = Instant::now();
    let mut spans = work.spans;
    let span_count = spans.len();
    let mut input = match &mut spans {
        // Joins what changed since the last pass; the timelines are lent to the analysis.
        Spans::Held(held) => {
            held.refresh();
            AnalysisInput::from_held(held, work.samples)
        }
        Spans::Read(spans) => AnalysisInput::from_span_refs(spans, work.samples, config.analyzer.stream.horizon()),
    };
    let timelines = started.elapsed();
    input.log_events = work.log_events;
    let mut anomalies = analyze_kinds(&input, &config.analyzer, is_scope_kind);
    anomalies.retain(|anomaly| spans.reports(anomaly, work.judged_from));
    // Rare: the scope's callers are gathered (a look at every span) only when one is found.
    if anomalies.iter().any(|anomaly| is_client_kind(anomaly.kind)) {
        let callers: HashSet<&str> = spans.iter().filter_map(|span| span.call.client_id.as_deref()).collect();
        anomalies.retain(|anomaly| {
            !is_client_kind(anomaly.kind) || anomaly.client_id.as_deref().is_none_or(|client| !callers.contains(client))
        });
    }
    // When the read limit cut the scope's oldest spans, their first minute is partial: left
    // as written.
    let mut complete_from = if spans.len() >= limit as usize {
        spans.first_start().map_or(i64::MAX, |first| rollup_step_of(first) + ROLLUP_STEP)
    } else {
        i64::MIN
    };
    // Nor are the minutes whose calls were settled (all but the witnesses let go).
    if let Spans::Held(held) = &spans
        && held.settled_through() > i64::MIN
    {
        complete_from = complete_from.max(rollup_step_of(held.settled_through()) + ROLLUP_STEP);
    }
    let rollups = read_rollups(&input, complete_from);
    let mut let_go = Vec::new();
    let (timelines_analysed, samples) = input.into_parts();
    let analysed = started.elapsed();
    if let Spans::Held(held) = spans {
        held.give_back(timelines_analysed);
        let_go = settle(held, &anomalies, settle_after, config);
    }
    let took = Took::since(started, analysed, span_count, let_go.len());
    ScopeFound { anomalies, rollups, timelines, samples, let_go, took }
}

/// A client's or scope's analysis that took at least this long says so at debug level.
const SLOW_ANALYSIS: Duration = Duration::from_millis(100);

/// What one client's or scope's analysis took: the analysis, then the settling.
#[derive(Debug)]
struct Took {
    analysed: Duration,
    settled: Duration,
    /// The spans it analysed, and those its settling let go of.
    spans: usize,
    let_go: usize,
}

impl Took {
    /// An analysis that began at `started` and took `analysed`, settled since.
    fn since(started: Instant, analysed: Duration, spans: usize, let_go: usize) -> Self {
        Self { analysed, settled: started.elapsed().saturating_sub(analysed), spans, let_go }
    }

    /// Took [`SLOW_ANALYSIS`] or longer, its settling included.
    fn is_slow(&self) -> bool {
        self.analysed + self.settled >= SLOW_ANALYSIS
    }

    /// A debug line naming the client or scope when it took [`SLOW_ANALYSIS`] or longer: the
    /// longest passes under load are often one such, and the pass's line does not say which.
    fn log_if_slow(&self, what: &str, name: impl FnOnce() -> String) {
        // (The name is built only when the line is written: debug level enabled.)
        if self.is_slow() {
            tracing::debug!(
                what,
                name = name(),
                spans = self.spans,
                analysis_ms = self.analysed.as_millis(),
                settle_ms = self.settled.as_millis(),
                let_go = self.let_go,
                "slow analysis"
            );
        }
    }
}

/// `analyse` over every item, on up to `threads` threads (this one among them), the largest
/// items (by `size`) first so that no thread is left with a large one at the end; the results
/// in the items' order. One thread, or one item, runs here alone.
fn on_threads<T: Send, R: Send>(
    items: Vec<T>,
    threads: usize,
    size: impl Fn(&T) -> usize,
    analyse: impl Fn(T) -> R + Sync,
) -> Vec<R> {
    let threads = threads.clamp(1, items.len().max(1));
    if threads == 1 {
        return items.into_iter().map(analyse).collect();
    }
    let mut queue: Vec<(usize, T)> = items.into_iter().enumerate().collect();
    queue.sort_by_key(|(_, item)| std::cmp::Reverse(size(item)));
    let queue = std::sync::Mutex::new(queue.into_iter());
    let run = || {
        let mut done = Vec::new();
        loop {
            let next = queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner).next();
            let Some((index, item)) = next else { return done };
            done.push((index, analyse(item)));
        }
    };
    let mut done = std::thread::scope(|scope| {
        let helpers: Vec<_> = (1..threads).map(|_| scope.spawn(run)).collect();
        let mut done = run();
        for helper in helpers {
            match helper.join() {
                Ok(theirs) => done.extend(theirs),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        done
    });
    done.sort_by_key(|(index, _)| *index);
    done.into_iter().map(|(_, result)| result).collect()
}

/// Kinds found once per (cluster, namespace) from every client's spans and the scope's
/// metrics: the window kinds, and `pinned_retry` (whether another node served meanwhile is
/// in other clients' spans). The other per-attempt kinds come from the client passes.
/// Kinds a client pass judges: those that name a client, but `untrusted_state`. That compares
/// the states a client carried with the highest committed state any server of the namespace
/// had reported: the scope pass, which reads every server's spans and the namespace's
/// metrics, judges it. A client pass knows only the servers its own calls reached: a client
/// that came back to a namespace after a minute away carried a state beyond everything its
/// own calls had seen reported, and was found untrusted live only (a sweep's seed 6230).
fn is_client_pass_kind(kind: AnomalyKind) -> bool {
    kind.names_client() && kind != AnomalyKind::UntrustedState
}

fn is_scope_kind(kind: AnomalyKind) -> bool {
    (kind.is_window() && !is_cluster_kind(kind)) || kind == AnomalyKind::PinnedRetry
}

/// Window kinds found from one client's own history alone (the cluster URLs its calls went
/// to, its probes' verdicts, the switches it logged). A client with calls is judged by its
/// client pass, which reads all of that, so that no pass with less of it writes another
/// verdict over its; a scope pass keeps only those of clients it has no calls of (known from
/// their log lines alone).
fn is_client_kind(kind: AnomalyKind) -> bool {
    matches!(kind, AnomalyKind::BlindFailoverProbe | AnomalyKind::FailoverFlapping)
}

/// The client's probe verdicts (`lagscope.probe.up` of its clusters, naming it or no client)
/// over the time its calls cover, when they name the cluster URL they went to (the only calls
/// whose detectors read them): none otherwise, at no cost. Over all of that time, since the
/// pass judges all of those calls again: a verdict it lacked would change what it says of them.
async fn client_probes(
    store: &dyn Store,
    spans: &Spans<'_>,
    client_id: &str,
) -> Result<Vec<lagscope_model::Sample>, lagscope_store::StoreError> {
    let (mut clusters, mut first, mut last) = (BTreeSet::new(), i64::MAX, i64::MIN);
    for span in spans.iter().filter(|span| span.attributes.contains_key("server.address")) {
        clusters.insert(span.resource.cluster.as_deref());
        (first, last) = (first.min(span.start_unix_nano), last.max(span.end_unix_nano));
    }
    if clusters.is_empty() {
        return Ok(Vec::new());
    }
    // Back from the latest verdict to before the first call: the verdicts may have gone on
    // since the calls (to now, unless the senders' clocks are ahead of this one's).
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(i64::MAX, |now| now.as_nanos() as i64);
    let window = now.max(last).saturating_sub(first).saturating_add(15 * 60 * 1_000_000_000);
    let mut probes = Vec::new();
    for cluster in clusters {
        let samples = store.cluster_samples(cluster, &[lagscope_model::conventions::METRIC_PROBE_UP], window).await?;
        probes.extend(samples.into_iter().filter(|sample| {
            sample.series.label(lagscope_model::conventions::CLIENT_ID).is_none_or(|probing| probing == client_id)
        }));
    }
    Ok(probes)
}

/// The metrics the per-cluster kinds read (a cluster without them costs one index lookup).
const CLUSTER_METRICS: &[&str] = &[
    lagscope_model::conventions::METRIC_SHARD_INFLIGHT_BYTES,
    lagscope_model::conventions::METRIC_SHARD_LIMIT_BYTES,
    lagscope_model::conventions::METRIC_SHARD_REJECTIONS,
];

/// Kinds found once per cluster from the metrics of all its namespaces.
fn is_cluster_kind(kind: AnomalyKind) -> bool {
    kind == AnomalyKind::UnfairRejection
}

/// What this analyzer last stored of each anomaly (by fingerprint, a hash of all of it): an
/// anomaly found again exactly as it was written is not sent to the store at all. (The store
/// would leave it unchanged too, but in a transaction of its own per client and scope: most
/// of a pass's writes under sustained load.) An anomaly not found for [`FORGET_AFTER_PASSES`]
/// passes (to twice that: forgetting runs every that many) is forgotten; found again later,
/// the store compares it.
#[derive(Default)]
struct WrittenAnomalies {
    by_fingerprint: HashMap<String, (u64, u64)>,
    pass: u64,
    /// Seeded at random per process: the text hashed comes from telemetry.
    hasher: foldhash::quality::RandomState,
}

/// Passes after which [`WrittenAnomalies`] forgets an anomaly not found meanwhile.
const FORGET_AFTER_PASSES: u64 = 256;

impl WrittenAnomalies {
    fn next_pass(&mut self) {
        self.pass += 1;
        if self.pass.is_multiple_of(FORGET_AFTER_PASSES) {
            let pass = self.pass;
            self.by_fingerprint.retain(|_, (_, seen)| pass - *seen < FORGET_AFTER_PASSES);
        }
    }

    /// Whether the anomaly was written as it is now (and so need not be again).
    fn seen(&mut self, anomaly: &lagscope_model::Anomaly, hash: u64) -> bool {
        match self.by_fingerprint.get_mut(&anomaly.fingerprint) {
            Some((written, seen)) if *written == hash => {
                *seen = self.pass;
                true
            }
            _ => false,
        }
    }

    fn wrote(&mut self, anomaly: &lagscope_model::Anomaly, hash: u64) {
        self.by_fingerprint.insert(anomaly.fingerprint.clone(), (hash, self.pass));
    }

    fn content_hash(&self, anomaly: &lagscope_model::Anomaly) -> u64 {
        content_hash(anomaly, self.hasher.build_hasher())
    }
}

/// A hash of everything an anomaly says, field by field (the evidence as the JSON text its
/// detector wrote: found again unchanged, it is written the same). Every field is named, so
/// that a field added to `Anomaly` cannot be left out. (Serializing the whole anomaly to hash
/// it cost a busy pass tens of milliseconds: every pass finds hundreds again. Hashed with
/// SipHash, the hundreds cost a twentieth of a busy run's passes; foldhash takes a fraction
/// of that.)
fn content_hash(anomaly: &lagscope_model::Anomaly, mut hasher: impl std::hash::Hasher) -> u64 {
    use std::hash::Hash;
    let lagscope_model::Anomaly {
        kind,
        severity,
        cluster,
        namespace,
        client_id,
        node_id,
        start_unix_nano,
        end_unix_nano,
        summary,
        cause,
        evidence,
        fingerprint,
        open,
    } = anomaly;
    (kind, severity, cluster, namespace, client_id, node_id, start_unix_nano, end_unix_nano).hash(&mut hasher);
    (summary, cause, evidence.as_json(), fingerprint, open).hash(&mut hasher);
    hasher.finish()
}

/// How often the live analyzer logs the anomalies it found since it last did.
const NEW_ANOMALIES_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// New anomalies not logged yet: a stale-read storm finds thousands a minute, and a log line
/// each (kept at debug level) would bury everything else the service logs. At info level the
/// live analyzer says how many it found, and their ids, at most once per interval (the first
/// right away).
#[derive(Debug)]
struct NewAnomalies {
    count: u64,
    first_id: i64,
    last_id: i64,
    /// When the last line was logged; `None` before the first.
    logged_at: Option<Instant>,
}

impl Default for NewAnomalies {
    fn default() -> Self {
        NewAnomalies { count: 0, first_id: i64::MAX, last_id: i64::MIN, logged_at: None }
    }
}

impl NewAnomalies {
    fn add(&mut self, id: i64) {
        self.count += 1;
        self.first_id = self.first_id.min(id);
        self.last_id = self.last_id.max(id);
    }

    /// Logs what was found and starts counting again, unless nothing was, or the last line
    /// is younger than `interval`.
    fn log_every(&mut self, interval: Duration) {
        if self.count == 0 || self.logged_at.is_some_and(|at| at.elapsed() < interval) {
            return;
        }
        tracing::info!(new = self.count, first_id = self.first_id, last_id = self.last_id, "new anomalies");
        *self = NewAnomalies { logged_at: Some(Instant::now()), ..NewAnomalies::default() };
    }
}

/// The wall clock in Unix nanoseconds.
pub fn now_unix_nano() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_nanos() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_with_one_calling_client_owns_its_lines_until_another_calls_or_it_is_forgotten() {
        let start = Instant::now();
        let mut callers = AddressCallers::default();
        let east = |node: &str| (Some("pulsar-east".to_string()), node.to_string());
        callers.note((Some("pulsar-east"), "app-1"), "producer-1", start);
        callers.note((Some("pulsar-east"), "app-1"), "producer-1", start);
        callers.note((Some("pulsar-west"), "app-1"), "producer-9", start);
        assert_eq!(callers.owner(&east("app-1")), Some("producer-1"));
        assert_eq!(callers.owner(&(Some("pulsar-west".to_string()), "app-1".to_string())), Some("producer-9"));
        assert_eq!(callers.owner(&east("app-2")), None);
        // A second client calling from the process: the lines are no one's.
        callers.note((Some("pulsar-east"), "app-1"), "producer-2", start);
        assert_eq!(callers.owner(&east("app-1")), None);
        // Not seen for a window: forgotten (and known anew from the next pass that sees it).
        let window = Duration::from_secs(600);
        callers.note((Some("pulsar-east"), "app-2"), "producer-3", start + window);
        // Each client is forgotten on its own: app-1's second client, seen again, is its one.
        callers.note((Some("pulsar-east"), "app-1"), "producer-2", start + window);
        assert!(callers.prune(window, start + window + Duration::from_secs(1)));
        assert_eq!(callers.processes.len(), 2);
        assert_eq!(callers.owner(&east("app-2")), Some("producer-3"));
        assert_eq!(callers.owner(&east("app-1")), Some("producer-2"));
        // Looked at once per window at most.
        assert!(!callers.prune(window, start + window + Duration::from_secs(2)));
    }

    /// With several instances, a pair is written to the database when first seen, and again
    /// once a quarter of the window has passed (the database forgets it after a window).
    #[test]
    fn a_seen_pair_is_written_again_before_the_database_forgets_it() {
        let start = Instant::now();
        let window = Duration::from_secs(600);
        let mut callers = AddressCallers::default();
        let process = (Some("pulsar-east"), "app-1");
        let pair = |client: &str| (Some("pulsar-east".to_string()), "app-1".to_string(), client.to_string());
        assert!(callers.write_due(process, "producer-1", window, start));
        // Due until written.
        assert!(callers.write_due(process, "producer-1", window, start + window / 8));
        callers.wrote(vec![pair("producer-1")], start + window / 8);
        assert!(!callers.write_due(process, "producer-1", window, start + window / 4));
        assert!(callers.write_due(process, "producer-2", window, start + window / 4));
        assert!(callers.write_due(process, "producer-1", window, start + window / 8 + window / 4));
        assert!(callers.write_due((None, "app-1"), "producer-1", window, start + window / 4));
    }

    /// An `apply_lag` anomaly of observer nn-obs1 in prod/ns1, from 10 to `end`.
    fn apply_lag(end: i64, summary: &str) -> lagscope_model::Anomaly {
        lagscope_model::Anomaly {
            kind: AnomalyKind::ApplyLag,
            severity: lagscope_model::Severity::Warning,
            cluster: Some("prod".to_string()),
            namespace: Some("ns1".to_string()),
            client_id: None,
            node_id: Some("nn-obs1".to_string()),
            start_unix_nano: 10,
            end_unix_nano: end,
            summary: summary.to_string(),
            cause: "apply lag".to_string(),
            evidence: Default::default(),
            fingerprint: "f1".to_string(),
            open: true,
        }
    }

    /// The writer stores each pass's findings in pass order (a later pass's version of an
    /// anomaly or rollup wins), and counts a pass's batches as analysed only once its findings
    /// are in the store; a failed pass counts as an error and still lets its batches go.
    #[tokio::test]
    async fn pass_findings_are_stored_in_pass_order_before_their_batches_count_as_analysed() {
        use lagscope_store::{AnomalyFilter, SqliteStore, StoreError};
        let directory = tempfile::tempdir().expect("temp dir");
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(directory.path()).await.expect("store"));
        let metrics = Arc::new(SelfMetrics::default());
        let (to_writer, passes) = tokio::sync::mpsc::channel(1);
        let writer = tokio::spawn(write_passes(Arc::clone(&store), Arc::clone(&metrics), passes));
        let anomaly = |end: i64| Arc::new(apply_lag(end, "observer nn-obs1 is behind"));
        let scope: ScopeKey = (Some("prod".to_string()), Some("ns1".to_string()));
        let rollup = |reads: u64| ReadRollup {
            cluster: scope.0.clone(),
            namespace: scope.1.clone(),
            node: Some("nn-obs1".to_string()),
            minute_unix_nano: 60_000_000_000,
            reads,
            compared: reads,
            ..ReadRollup::default()
        };
        let pass = |findings, through_batch| Analysed {
            findings,
            started: Instant::now(),
            analysed: Duration::ZERO,
            first_queued: Some(Instant::now()),
            through_batch,
        };
        let stored = |store: Arc<dyn Store>| async move {
            let anomalies = store.anomalies(&AnomalyFilter { limit: 10, ..AnomalyFilter::default() }).await;
            let ends: Vec<i64> = anomalies.expect("anomalies").iter().map(|a| a.anomaly.end_unix_nano).collect();
            let rollups = store.read_rollups(TimeRange::ALL, 10).await.expect("rollups");
            (ends, rollups.iter().map(|rollup| rollup.reads).collect::<Vec<_>>())
        };
        let analysed_through = |batch: u64| {
            let metrics = Arc::clone(&metrics);
            async move {
                // Looked at as soon as the writer yields: a count raised before the write
                // ended would be seen before its findings are.
                while metrics.batches_analyzed.get() < batch {
                    tokio::task::yield_now().await;
                }
            }
        };

        let first = Findings { anomalies: vec![anomaly(20)], rollups: vec![(scope.clone(), vec![rollup(3)])] };
        to_writer.send(pass(Ok(first), 1)).await.expect("sent");
        analysed_through(1).await;
        assert_eq!(stored(Arc::clone(&store)).await, (vec![20], vec![3]), "stored when counted");
        // Two passes queued at once: the later one's findings win.
        let grown = Findings { anomalies: vec![anomaly(30)], rollups: vec![(scope.clone(), vec![rollup(4)])] };
        let again = Findings { anomalies: vec![anomaly(40)], rollups: vec![(scope.clone(), vec![rollup(5)])] };
        to_writer.send(pass(Ok(grown), 2)).await.expect("sent");
        to_writer.send(pass(Ok(again), 3)).await.expect("sent");
        let failed = StoreError::Corrupt { what: "pass", detail: "failed on purpose".to_string() };
        to_writer.send(pass(Err(failed), 4)).await.expect("sent");
        drop(to_writer);
        writer.await.expect("writer");
        assert_eq!(stored(Arc::clone(&store)).await, (vec![40], vec![5]));
        assert_eq!(metrics.batches_analyzed.get(), 4, "a failed pass's batches are let go too");
        assert_eq!((metrics.analysis_passes.get(), metrics.analysis_errors.get()), (3, 1));
        assert_eq!((metrics.anomalies_new.get(), metrics.anomalies_changed.get()), (1, 2));
    }

    /// Only an analysis that took `SLOW_ANALYSIS` or longer, its settling included, is slow.
    #[test]
    fn an_analysis_is_slow_from_a_tenth_of_a_second_with_its_settling() {
        let took = |analysed: u64, settled: u64| Took {
            analysed: Duration::from_millis(analysed),
            settled: Duration::from_millis(settled),
            spans: 10,
            let_go: 0,
        };
        assert!(!took(60, 39).is_slow());
        assert!(took(60, 40).is_slow(), "the settling counts");
        assert!(took(250, 0).is_slow());
    }

    /// An anomaly found again as written is not written again; changed, it is; one not found
    /// for a while is forgotten (and so compared by the store again).
    #[test]
    fn anomalies_written_before_are_not_written_again_unless_changed() {
        let mut anomaly = apply_lag(20, "observer nn-obs1 is 12 000 states behind");
        let mut written = WrittenAnomalies::default();
        written.next_pass();
        let hash = written.content_hash(&anomaly);
        assert!(!written.seen(&anomaly, hash), "never written");
        written.wrote(&anomaly, hash);
        assert!(written.seen(&anomaly, written.content_hash(&anomaly)));
        for change in [
            |anomaly: &mut lagscope_model::Anomaly| anomaly.open = false,
            |anomaly: &mut lagscope_model::Anomaly| anomaly.end_unix_nano = 30,
            |anomaly: &mut lagscope_model::Anomaly| anomaly.severity = lagscope_model::Severity::Critical,
            |anomaly: &mut lagscope_model::Anomaly| anomaly.summary.push_str(" (13 000 now)"),
            |anomaly: &mut lagscope_model::Anomaly| anomaly.node_id = Some("nn-obs2".to_string()),
            |anomaly: &mut lagscope_model::Anomaly| {
                anomaly.evidence.insert("lag_states", serde_json::json!(12_001));
            },
        ] {
            let mut changed = anomaly.clone();
            change(&mut changed);
            assert!(!written.seen(&changed, written.content_hash(&changed)), "{changed:?}");
        }
        anomaly.open = false;
        written.wrote(&anomaly, written.content_hash(&anomaly));
        for _ in 0..2 * FORGET_AFTER_PASSES {
            written.next_pass();
        }
        assert!(!written.seen(&anomaly, written.content_hash(&anomaly)), "forgotten after passes without it");
    }

    /// Every item is analysed once, on at most as many threads as asked (and items), and the
    /// results come back in the items' order whatever order they were taken in.
    #[test]
    fn work_on_threads_is_done_once_each_and_returned_in_order() {
        for (count, threads) in [(0, 2), (1, 4), (7, 1), (7, 2), (30, 3), (5, 16)] {
            let items: Vec<usize> = (0..count).collect();
            let seen = std::sync::Mutex::new(Vec::new());
            let on = std::sync::Mutex::new(HashSet::new());
            // Sizes out of order, so the largest-first order differs from the items'.
            let results = on_threads(
                items,
                threads,
                |item| (item * 7) % 5,
                |item| {
                    seen.lock().expect("lock").push(item);
                    on.lock().expect("lock").insert(std::thread::current().id());
                    item * 10
                },
            );
            assert_eq!(results, (0..count).map(|item| item * 10).collect::<Vec<_>>(), "{count} on {threads}");
            let mut seen = seen.into_inner().expect("lock");
            seen.sort_unstable();
            assert_eq!(seen, (0..count).collect::<Vec<_>>(), "each once");
            let used = on.into_inner().expect("lock").len();
            assert!(used <= threads.min(count).max(1), "{count} items on {threads} threads used {used}");
        }
    }

    /// Two items on two threads run at the same time: each waits to hear from the other, which
    /// on one thread the first would wait for in vain.
    #[test]
    fn two_items_on_two_threads_run_together() {
        let (to_first, first_hears) = std::sync::mpsc::channel::<()>();
        let (to_second, second_hears) = std::sync::mpsc::channel::<()>();
        let ends = std::sync::Mutex::new([(to_second, first_hears), (to_first, second_hears)].map(Some));
        let met = on_threads(
            vec![0, 1],
            2,
            |_| 1,
            |item: usize| {
                let (tell, hear) = ends.lock().expect("lock")[item].take().expect("each item once");
                tell.send(()).expect("the other item's end");
                hear.recv_timeout(Duration::from_secs(20)).is_ok()
            },
        );
        assert_eq!(met, [true, true]);
    }

    /// A panic in an analysis is the pass's, on whichever thread it happened.
    #[test]
    fn a_panic_on_a_helper_thread_reaches_the_pass() {
        let outcome = std::panic::catch_unwind(|| {
            on_threads(
                (0..8).collect::<Vec<usize>>(),
                2,
                |_| 1,
                |item| {
                    std::thread::sleep(Duration::from_millis(5));
                    assert!(item != 5, "analysis of item 5 failed");
                    item
                },
            )
        });
        assert!(outcome.is_err());
    }

    #[test]
    fn new_anomalies_are_logged_at_once_then_at_most_once_per_interval() {
        let mut found = NewAnomalies::default();
        found.log_every(Duration::from_secs(3600));
        assert!(found.logged_at.is_none(), "nothing found, nothing logged");
        found.add(7);
        found.add(5);
        assert_eq!((found.count, found.first_id, found.last_id), (2, 5, 7));
        // The first line right away.
        found.log_every(Duration::from_secs(3600));
        assert_eq!(found.count, 0, "logged and counting again");
        assert!(found.logged_at.is_some());
        // The next waits for the interval.
        found.add(8);
        found.log_every(Duration::from_secs(3600));
        assert_eq!((found.count, found.first_id, found.last_id), (1, 8, 8), "held until the interval passes");
        found.log_every(Duration::ZERO);
        assert_eq!(found.count, 0);
    }
}
