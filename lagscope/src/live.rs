//! The live analyzer: re-analyzes each client whose spans were just committed and stores
//! what it finds. Same detectors as `lagscope analyze`, over the store instead of a file.
//!
//! On SQLite (one process) the receivers' in-memory marks say what to look at. On PostgreSQL
//! several instances may share the database: marks are committed with the data, the work is
//! split into shards held under leases ([`lagscope_store::Coordinator`]), and each instance
//! analyses the marks of its shards, whoever ingested them.
//!
//! This file runs the passes (`analysis_pass`); `shards.rs` holds the shards and routes clients
//! on PostgreSQL, `analysis.rs` the clients' and scopes' analyses a pass runs, `lines.rs` the log
//! lines it reads and whose they are, `written.rs` what it has written.

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

mod analysis;
mod lines;
pub(crate) mod shards;
#[cfg(test)]
mod tests;
mod written;

use analysis::{
    ClientWork, SCOPES_AT_ONCE, ScopeWork, Spans, client_analysis, client_probes, cluster_analysis, on_threads,
    scope_analysis,
};
use lines::{AddressCallers, Process, ProcessOwners, RecognisedLines};
use shards::{route_clients, run_coordinated};
use written::{Findings, NEW_ANOMALIES_LOG_INTERVAL, Recorder, ScopeKey, take_late};

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
    let not_held = load_clients(store, client_cache, &clients, (client_limit, kept_from), metrics).await?;
    let lines_lap = Instant::now();
    if held_shards.is_some() {
        // Several instances share the database: a cluster's new lines were read by the holder
        // of its mark, seldom the instance that analyses its clients and scopes.
        let of_pass = clusters_of_pass(&scopes, &clients, &not_held, client_cache);
        lines.refresh_stale(store, of_pass, &pending.log_clusters, holds_lines, config, logs_kept_from).await?;
    }
    times.client_lines += lines_lap.elapsed();
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
    let found_of_clients =
        on_threads(work, threads, |work| work.spans.len(), |work| client_analysis(work, horizon, settle_after, config));
    let mut address_callers = Vec::new();
    for (client_id, found) in clients.iter().zip(found_of_clients) {
        client_cache.settled(client_id, found.let_go);
        findings.anomalies.extend(found.anomalies);
        address_callers.extend(found.address_callers);
    }
    callers.record(address_callers, shared.map(|(coordinator, _)| coordinator), callers_window, Instant::now()).await?;
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
        let not_held = load_scopes(store, cache, chunk, (limit, kept_from), now, metrics).await?;
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
                ScopeWork { spans, samples, log_events: lines.of_scope(scope), judged_from }
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
        findings.anomalies.extend(cluster_analysis(store, cluster.as_deref(), config).await?.into_iter().map(Arc::new));
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

/// The spans of a chunk's scopes: held by the scope cache (brought up to date by the pass's
/// catch-up) or, when it cannot hold them (too many, or no span feed), read for this pass alone
/// and returned.
async fn load_scopes<'c>(
    store: &dyn Store,
    cache: &mut ScopeCache,
    chunk: &'c [ScopeKey],
    (limit, kept_from): (u32, Option<i64>),
    now: Instant,
    metrics: &SelfMetrics,
) -> Result<HashMap<&'c ScopeKey, Vec<lagscope_model::Span>>, lagscope_store::StoreError> {
    let mut not_held = HashMap::new();
    for scope in chunk {
        let source = match store.span_feed() {
            Some(feed) => {
                let (read, source) = cache.load(feed, scope, limit, kept_from, now).await?;
                if let Some(spans) = read {
                    not_held.insert(scope, spans);
                }
                source
            }
            None => {
                let spans = store.scope_spans(scope.0.as_deref(), scope.1.as_deref(), TimeRange::ALL, limit).await?;
                not_held.insert(scope, spans);
                Source::Store
            }
        };
        match source {
            Source::Cached => metrics.scope_reads_cached.add(1),
            Source::Store => metrics.scope_reads_full.add(1),
        }
    }
    Ok(not_held)
}

/// The clusters a pass's clients and scopes are in: a client's, from its own spans (those read
/// for the pass, or the client cache's record of them).
fn clusters_of_pass<'a>(
    scopes: &'a [ScopeKey],
    clients: &'a BTreeSet<String>,
    not_held: &'a HashMap<&str, Vec<lagscope_model::Span>>,
    client_cache: &'a ClientCache,
) -> BTreeSet<&'a Option<String>> {
    let mut of_pass: BTreeSet<&Option<String>> = scopes.iter().map(|(cluster, _)| cluster).collect();
    for client_id in clients {
        match not_held.get(client_id.as_str()) {
            Some(spans) => of_pass.extend(
                (spans.iter())
                    .filter(|span| span.call.client_id.as_deref() == Some(client_id.as_str()))
                    .map(|span| &span.resource.cluster),
            ),
            None => of_pass.extend(client_cache.clusters_of(client_id).into_iter().flatten()),
        }
    }
    of_pass
}

/// Every client's spans: held by the client cache (brought up to date from the span feed) or,
/// when it cannot hold them (too many, or no span feed), read for this pass alone and returned.
async fn load_clients<'c>(
    store: &dyn Store,
    client_cache: &mut ClientCache,
    clients: &'c BTreeSet<String>,
    (limit, kept_from): (u32, Option<i64>),
    metrics: &SelfMetrics,
) -> Result<HashMap<&'c str, Vec<lagscope_model::Span>>, lagscope_store::StoreError> {
    let feed = store.span_feed();
    let mut not_held = HashMap::new();
    for client_id in clients {
        match feed {
            Some(feed) => match client_cache.load(feed, client_id, limit, kept_from, Instant::now()).await? {
                Loaded::Held => metrics.client_reads_cached.add(1),
                Loaded::ReadAndHeld => metrics.client_reads_full.add(1),
                Loaded::Read(spans) => {
                    metrics.client_reads_full.add(1);
                    not_held.insert(client_id.as_str(), spans.into_iter().map(|(_, span)| span).collect());
                }
            },
            None => {
                metrics.client_reads_full.add(1);
                not_held.insert(client_id.as_str(), store.client_spans(client_id, TimeRange::ALL, limit).await?);
            }
        }
    }
    Ok(not_held)
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

/// The wall clock in Unix nanoseconds.
pub fn now_unix_nano() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_nanos() as i64)
}
