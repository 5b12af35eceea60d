//! One pass of the live analyzer over what its marks name: the scopes and clients they (and the
//! clusters' new log lines) touch, then every client's analysis, then the scopes' a few at a
//! time, then the clusters'.
//!
//! The reads keep an order the held caches rely on: a chunk's samples before its spans (metrics
//! read after the spans would run ahead of them and close a window whose spans are still
//! arriving), and the first chunk's samples before the clients' read of the span feed, whose
//! spans the scope cache then takes from memory.

use super::*;
use crate::held::Committed;

/// One pass: what every step reads (the store, the configuration, the retention's and the
/// shards' bounds), and what the steps add up (the findings, the times).
struct Pass<'p> {
    store: &'p dyn Store,
    metrics: &'p SelfMetrics,
    config: &'p Config,
    /// With several instances on one database: the shards this one holds.
    held_shards: Option<&'p HashSet<i32>>,
    /// With several instances: the coordinator, and how long a process's clients are
    /// remembered (`callers_window`).
    shared: Option<(&'p dyn Coordinator, Duration)>,
    callers_window: Duration,
    /// What the retention has cut (or is about to): held spans, samples and lines before these
    /// go with it.
    kept_from: Option<i64>,
    samples_kept_from: Option<i64>,
    logs_kept_from: Option<i64>,
    threads: usize,
    findings: Findings,
    times: PassTimes,
}

/// The scopes and clients the pass's marks name, and the traces whose clients it looks up.
struct Marked {
    scopes: BTreeSet<ScopeKey>,
    clients: BTreeSet<String>,
    traces: BTreeSet<String>,
}

/// Where the pass has read the span feed to: its newest span id when the pass began, and what
/// the client cache's catch-up read (the scope cache's first catch-up takes its part of it from
/// memory). Each is used once.
struct FeedRead {
    latest: Option<i64>,
    committed: Option<Committed>,
}

pub(super) async fn analysis_pass(
    store: &dyn Store,
    metrics: &SelfMetrics,
    config: &Config,
    kept: &mut Kept,
    pending: Pending,
    held_shards: Option<&HashSet<i32>>,
) -> Result<Findings, lagscope_store::StoreError> {
    // Before any read: every commit the marks name is visible to this pass's reads.
    kept.samples.committed(&pending.sample_times, Instant::now());
    let Pending { clients, traces, scopes, log_clusters, .. } = pending;
    let mut pass = Pass::new(store, metrics, config, held_shards);
    let mut owners = ProcessOwners::new(pass.shared);
    let lap = Instant::now();
    let (scopes, clients) = pass.touched(Marked { scopes, clients, traces }, &log_clusters, kept, &mut owners).await?;
    pass.times.logs_and_traces += lap.elapsed();
    // Node- and namespace-level detectors (lags, storms, windows, pressure) need every
    // client's spans and the metrics of the scope: one pass per touched scope, a few scopes at
    // a time (their samples and spans are held together while analysed). The clusters of
    // these scopes get the per-cluster pass.
    let clusters: BTreeSet<Option<String>> = scopes.iter().map(|(cluster, _)| cluster.clone()).collect();
    let scopes: Vec<ScopeKey> = scopes.into_iter().collect();
    let scope_chunk = SCOPES_AT_ONCE.max(pass.threads);
    // The first few scopes' samples before the span feed is read: their spans can then come
    // from the clients' read of the feed (on PostgreSQL each read waits for the ingests in
    // flight), and still not from before their samples.
    let lap = Instant::now();
    let mut first_samples = match scopes.chunks(scope_chunk).next() {
        Some(chunk) => Some(pass.read_samples(&mut kept.samples, chunk).await?),
        None => None,
    };
    pass.times.scope_samples += lap.elapsed();
    let reads_started = Instant::now();
    let mut feed_read = pass.read_feed(kept, !clients.is_empty(), !scopes.is_empty()).await?;
    pass.times.client_catch_up += reads_started.elapsed();
    pass.analyse_clients(kept, &clients, &scopes, &log_clusters, &mut owners, reads_started).await?;
    for chunk in scopes.chunks(scope_chunk) {
        pass.analyse_scopes(kept, chunk, first_samples.take(), &mut feed_read).await?;
    }
    metrics.scope_spans_cached.set(kept.scope_spans.held() as u64);
    metrics.scope_samples_cached.set(kept.samples.held() as u64);
    metrics.client_spans_cached.set(kept.client_spans.held() as u64);
    // Detectors comparing a node's namespaces (shards) with each other see the whole cluster.
    let lap = Instant::now();
    for cluster in clusters {
        let found = cluster_analysis(store, cluster.as_deref(), config).await?;
        pass.findings.anomalies.extend(found.into_iter().map(Arc::new));
    }
    pass.times.clusters += lap.elapsed();
    pass.times.log(clients.len(), scopes.len(), kept, pass.threads);
    Ok(pass.findings)
}

impl<'p> Pass<'p> {
    fn new(
        store: &'p dyn Store,
        metrics: &'p SelfMetrics,
        config: &'p Config,
        held_shards: Option<&'p HashSet<i32>>,
    ) -> Self {
        let retention = config.retention.durations().ok().unwrap_or_default();
        let [kept_from, samples_kept_from, logs_kept_from, _] =
            retention.map(|keep| keep.map(|keep| now_unix_nano() - keep));
        let callers_window = Duration::from_secs(config.live.scope_window_seconds.max(1) as u64);
        Self {
            store,
            metrics,
            config,
            held_shards,
            shared: held_shards.and(store.coordinator()).map(|coordinator| (coordinator, callers_window)),
            callers_window,
            kept_from,
            samples_kept_from,
            logs_kept_from,
            threads: config.live.threads(),
            findings: Findings::default(),
            times: PassTimes::default(),
        }
    }

    /// Whether this instance holds the mark of a cluster's new lines (always, on SQLite).
    fn holds_lines(&self, cluster: &Option<String>) -> bool {
        self.held_shards.is_none_or(|held| held.contains(&Mark::LogCluster(cluster.clone()).shard()))
    }

    /// The scopes and clients the pass looks at: those its marks name, the scopes of the
    /// clusters' new log lines, the clients of processes that logged switch lines naming no
    /// client, and the clients of the traces marked without one.
    async fn touched(
        &self,
        marked: Marked,
        log_clusters: &BTreeSet<Option<String>>,
        kept: &mut Kept,
        owners: &mut ProcessOwners<'p>,
    ) -> Result<(BTreeSet<ScopeKey>, BTreeSet<String>), lagscope_store::StoreError> {
        let Marked { mut scopes, mut clients, traces } = marked;
        let lines = &mut kept.lines;
        // The recognised lines of each cluster with new log records: they name the scopes to
        // look at again, and replace what the passes remember of the cluster's lines. (Passes
        // of clusters without new logs read none from the store: reading a busy cluster's logs
        // on every batch of spans would cost more than the spans.)
        let log_clusters_read: Vec<Option<String>> = log_clusters.iter().cloned().collect();
        lines.refresh(self.store, &log_clusters_read, self.config, self.logs_kept_from).await?;
        for cluster in log_clusters {
            let events = lines.by_cluster.get(cluster).into_iter().flatten();
            scopes.extend(events.map(|event| (cluster.clone(), event.namespace.clone())));
            if self.held_shards.is_some() && self.holds_lines(cluster) {
                lines.current.insert(cluster.clone());
            }
        }
        if !log_clusters.is_empty() {
            lines.index_clients();
            // Switch lines that name no client are their process's client's: its pass reads
            // those of the clusters just read now, though it sent no span since (the pass of
            // the instance that holds its shard, when several share the database).
            let new_lines: Vec<&Process> =
                lines.unnamed_switches.keys().filter(|process| log_clusters.contains(&process.0)).collect();
            owners.find(new_lines.iter().copied(), &kept.callers).await?;
            let owned: Vec<String> =
                new_lines.iter().filter_map(|process| owners.owner(process).map(str::to_string)).collect();
            match (self.held_shards, self.shared) {
                (Some(held), Some((coordinator, _))) => route_clients(coordinator, held, owned, &mut clients).await?,
                _ => clients.extend(owned),
            }
        }
        let traces: Vec<String> = traces.into_iter().collect();
        clients.extend(self.store.clients_of_traces(&traces).await?);
        Ok((scopes, clients))
    }

    /// The span feed's newest id, when there is anything to read, and the client cache brought
    /// up to it.
    async fn read_feed(
        &self,
        kept: &mut Kept,
        any_clients: bool,
        any_scopes: bool,
    ) -> Result<FeedRead, lagscope_store::StoreError> {
        let mut read = FeedRead { latest: None, committed: None };
        let Some(feed) = self.store.span_feed() else { return Ok(read) };
        if !any_clients && !any_scopes {
            return Ok(read);
        }
        let latest = feed.latest_span_id().await?;
        read.latest = Some(latest);
        if any_clients {
            let limit = self.config.live.max_spans_per_client;
            read.committed = kept.client_spans.catch_up(feed, latest, limit, Instant::now()).await?;
            take_late(kept.client_spans.late(), &self.metrics.analysis_late_spans, &mut kept.settling, self.metrics);
        }
        Ok(read)
    }

    /// Every client's spans first (the cache's, or read), then its analysis, on the pass's
    /// threads: the analysis is pure, and most of a busy pass.
    async fn analyse_clients(
        &mut self,
        kept: &mut Kept,
        clients: &BTreeSet<String>,
        scopes: &[ScopeKey],
        log_clusters: &BTreeSet<Option<String>>,
        owners: &mut ProcessOwners<'p>,
        reads_started: Instant,
    ) -> Result<(), lagscope_store::StoreError> {
        let Kept { lines, client_spans: client_cache, settling, callers, .. } = kept;
        let bounds = (self.config.live.max_spans_per_client, self.kept_from);
        let not_held = load_clients(self.store, client_cache, clients, bounds, self.metrics).await?;
        let lines_lap = Instant::now();
        if self.held_shards.is_some() {
            // Several instances share the database: a cluster's new lines were read by the
            // holder of its mark, seldom the instance that analyses its clients and scopes.
            let of_pass = clusters_of_pass(scopes, clients, &not_held, client_cache);
            let holds = |cluster: &Option<String>| self.holds_lines(cluster);
            lines.refresh_stale(self.store, of_pass, log_clusters, holds, self.config, self.logs_kept_from).await?;
        }
        self.times.client_lines += lines_lap.elapsed();
        if !clients.is_empty() {
            owners.find(lines.unnamed_switches.keys(), callers).await?;
        }
        let unnamed_by_owner = lines.unnamed_by_owner(owners);
        let judged_from: HashMap<&str, i64> = (clients.iter())
            .filter_map(|client_id| Some((client_id.as_str(), client_cache.late().judged_from(client_id)?)))
            .collect();
        let mut held = client_cache.held_mut(&clients.iter().map(String::as_str).collect());
        let mut work = Vec::with_capacity(clients.len());
        for client_id in clients {
            let spans = match (not_held.get(client_id.as_str()), held.remove(client_id.as_str())) {
                (Some(spans), _) => Spans::Read(spans.iter().collect()),
                (None, Some(held)) => Spans::Held(held),
                (None, None) => Spans::Read(Vec::new()),
            };
            let probing = Instant::now();
            let probes = client_probes(self.store, &spans, client_id).await?;
            self.times.client_probes += probing.elapsed();
            // The client's own lines (a client that logs its switches is judged by them).
            let log_events = lines.of_client(client_id, &unnamed_by_owner);
            let judged_from = judged_from.get(client_id.as_str()).copied();
            work.push(ClientWork { client_id, spans, probes, log_events, judged_from });
        }
        self.times.client_reads += reads_started.elapsed();
        let lap = Instant::now();
        let (horizon, settle_after) = (self.config.analyzer.stream.horizon(), settling.after());
        let config = self.config;
        let found_of_clients = on_threads(
            work,
            self.threads,
            |work| work.spans.len(),
            |work| client_analysis(work, horizon, settle_after, config),
        );
        let mut address_callers = Vec::new();
        for (client_id, found) in clients.iter().zip(found_of_clients) {
            client_cache.settled(client_id, found.let_go);
            self.findings.anomalies.extend(found.anomalies);
            address_callers.extend(found.address_callers);
        }
        let shared = self.shared.map(|(coordinator, _)| coordinator);
        callers.record(address_callers, shared, self.callers_window, Instant::now()).await?;
        drop(not_held);
        self.times.client_analysis += lap.elapsed();
        Ok(())
    }

    /// One chunk of the pass's scopes: their samples (`samples`, when read already), then their
    /// spans from the scope cache brought up to date after the samples, then their analyses on
    /// the pass's threads.
    async fn analyse_scopes(
        &mut self,
        kept: &mut Kept,
        chunk: &[ScopeKey],
        samples: Option<Vec<lagscope_analyzer::IndexedSamples>>,
        feed_read: &mut FeedRead,
    ) -> Result<(), lagscope_store::StoreError> {
        let limit = self.config.live.max_spans_per_scope;
        let mut lap = Instant::now();
        let samples = match samples {
            Some(samples) => samples,
            None => self.read_samples(&mut kept.samples, chunk).await?,
        };
        self.times.scope_samples += lap.elapsed();
        let Kept { lines, scope_spans: cache, samples: sample_cache, settling, .. } = kept;
        // From the scope cache, brought up to date after the samples: to the id the clients'
        // catch-up read for the first chunk, to a newer one for the others.
        let now = Instant::now();
        if let Some(feed) = self.store.span_feed() {
            let latest = match feed_read.latest.take() {
                Some(latest) => latest,
                None => feed.latest_span_id().await?,
            };
            let committed = feed_read.committed.take();
            cache.catch_up(feed, latest, limit, self.kept_from, now, committed.as_ref()).await?;
            take_late(cache.late(), &self.metrics.analysis_scope_late_spans, settling, self.metrics);
            self.times.scope_catch_up += now.elapsed();
        }
        let not_held = load_scopes(self.store, cache, chunk, (limit, self.kept_from), now, self.metrics).await?;
        let judged_from: Vec<Option<i64>> = chunk.iter().map(|scope| cache.late().judged_from(scope)).collect();
        let mut held = cache.held_mut(chunk);
        let work: Vec<ScopeWork> = (chunk.iter().zip(samples).zip(judged_from))
            .map(|((scope, samples), judged_from)| {
                let spans = match (not_held.get(scope), held.remove(scope)) {
                    (Some(spans), _) => Spans::Read(spans.iter().collect()),
                    (None, Some(held)) => Spans::Held(held),
                    (None, None) => Spans::Read(Vec::new()),
                };
                ScopeWork { spans, samples, log_events: lines.of_scope(scope), judged_from }
            })
            .collect();
        self.times.scope_reads += lap.elapsed();
        lap = Instant::now();
        // (Widened, perhaps, by the scope cache's catch-up.)
        let (settle_after, config) = (settling.after(), self.config);
        let found_of_scopes = on_threads(
            work,
            self.threads,
            |work| work.spans.len(),
            |work| scope_analysis(work, limit, settle_after, config),
        );
        self.times.scope_analysis += lap.elapsed();
        for (scope, found_of_scope) in chunk.iter().zip(found_of_scopes) {
            found_of_scope.took.log_if_slow("scope", || {
                format!("{}/{}", scope.0.as_deref().unwrap_or("-"), scope.1.as_deref().unwrap_or("-"))
            });
            sample_cache.give_back(scope, found_of_scope.samples);
            cache.settled(scope, found_of_scope.let_go);
            self.times.scope_timelines += found_of_scope.timelines;
            self.findings.anomalies.extend(found_of_scope.anomalies.into_iter().map(Arc::new));
            self.findings.rollups.push((scope.clone(), found_of_scope.rollups));
        }
        Ok(())
    }

    /// The samples of `chunk`'s scopes, read at once (the store reads them on several
    /// connections; SQLite: a thread each); held scopes read only what was committed to them
    /// since (the sample cache).
    async fn read_samples(
        &self,
        sample_cache: &mut SampleCache,
        chunk: &[ScopeKey],
    ) -> Result<Vec<lagscope_analyzer::IndexedSamples>, lagscope_store::StoreError> {
        let window = self.config.live.scope_window_seconds * 1_000_000_000;
        let now = Instant::now();
        let reads = chunk.iter().map(|scope| {
            let from = sample_cache.read_from(scope, now);
            let (cluster, namespace) = scope;
            async move {
                match from {
                    Some(from) => (self.store)
                        .scope_samples_from(cluster.as_deref(), namespace.as_deref(), window, from)
                        .await
                        .map(Some),
                    None => Ok(None),
                }
            }
        });
        let reads = futures::future::try_join_all(reads.collect::<Vec<_>>()).await?;
        Ok(chunk
            .iter()
            .zip(reads)
            .map(|(scope, read)| sample_cache.take(scope, read, window, self.samples_kept_from, now))
            .collect())
    }
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

impl PassTimes {
    /// The pass's debug line (`LAGSCOPE_LOG=lagscope::live=debug`).
    fn log(&self, clients: usize, scopes: usize, kept: &Kept, threads: usize) {
        tracing::debug!(
            clients,
            scopes,
            scope_spans_held = kept.scope_spans.held(),
            client_spans_held = kept.client_spans.held(),
            logs_and_traces_ms = self.logs_and_traces.as_millis(),
            client_reads_ms = self.client_reads.as_millis(),
            client_catch_up_ms = self.client_catch_up.as_millis(),
            client_probes_ms = self.client_probes.as_millis(),
            client_lines_ms = self.client_lines.as_millis(),
            client_analysis_ms = self.client_analysis.as_millis(),
            scope_samples_ms = self.scope_samples.as_millis(),
            scope_spans_ms = self.scope_reads.saturating_sub(self.scope_samples).as_millis(),
            scope_catch_up_ms = self.scope_catch_up.as_millis(),
            scope_analysis_ms = self.scope_analysis.as_millis(),
            scope_timelines_ms = self.scope_timelines.as_millis(),
            clusters_ms = self.clusters.as_millis(),
            threads,
            "analysis pass"
        );
    }
}
