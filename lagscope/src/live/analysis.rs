//! A pass's analyses: clients' and scopes' work, run on both cores, timed; which kinds each
//! part of a pass finds.

use super::*;

/// Scopes whose samples and spans a pass gathers before analysing them together (at least
/// one per thread): enough to keep the threads busy, few enough that the scopes' samples and
/// timelines are not all in memory at once.
pub(super) const SCOPES_AT_ONCE: usize = 8;

/// What one client's analysis reads.
pub(super) struct ClientWork<'a> {
    pub(super) client_id: &'a str,
    pub(super) spans: Spans<'a>,
    pub(super) probes: Vec<lagscope_model::Sample>,
    pub(super) log_events: Vec<Arc<LogEvent>>,
    /// Read anew for spans too late for what was held: what ended before this was reported
    /// by earlier passes ([`crate::held::LateSpans::judged_from`]).
    pub(super) judged_from: Option<i64>,
}

/// What one scope's analysis reads.
pub(super) struct ScopeWork<'a> {
    pub(super) spans: Spans<'a>,
    pub(super) samples: lagscope_analyzer::IndexedSamples,
    pub(super) log_events: Vec<Arc<LogEvent>>,
    /// As [`ClientWork::judged_from`].
    pub(super) judged_from: Option<i64>,
}

/// A client's or scope's spans: held with their timelines between passes, or read for this
/// pass alone.
pub(super) enum Spans<'a> {
    Held(&'a mut HeldTimelines),
    Read(Vec<&'a lagscope_model::Span>),
}

impl Spans<'_> {
    pub(super) fn len(&self) -> usize {
        match self {
            Self::Held(held) => held.len(),
            Self::Read(spans) => spans.len(),
        }
    }

    /// The analysis input of these spans: held ones joined again where they changed since the
    /// last pass (their timelines lent to the analysis, to be given back), read ones joined now.
    pub(super) fn input(
        &mut self,
        samples: impl Into<lagscope_analyzer::IndexedSamples>,
        horizon: UnixNanos,
    ) -> AnalysisInput {
        match self {
            Self::Held(held) => {
                held.refresh();
                AnalysisInput::from_held(held, samples)
            }
            Self::Read(spans) => AnalysisInput::from_span_refs(spans, samples, horizon),
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
    pub(super) fn reports(&self, anomaly: &lagscope_model::Anomaly, judged_from: Option<i64>) -> bool {
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

/// What one client's analysis found.
pub(super) struct ClientFound {
    pub(super) anomalies: Vec<Arc<lagscope_model::Anomaly>>,
    /// The spans its settling let go of ([`settle`]).
    pub(super) let_go: Vec<(SpanKey, lagscope_model::Span)>,
    /// (cluster, node, client) of each cluster URL the client called from a process: whose
    /// that process's unnamed switch lines are ([`AddressCallers`]).
    pub(super) address_callers: Vec<(Option<String>, String, String)>,
}

/// What one scope's analysis found, and what building its timelines took.
pub(super) struct ScopeFound {
    pub(super) anomalies: Vec<lagscope_model::Anomaly>,
    pub(super) rollups: Vec<ReadRollup>,
    pub(super) timelines: Duration,
    /// The scope's samples, to give back to the sample cache.
    pub(super) samples: lagscope_analyzer::IndexedSamples,
    /// The spans its settling let go of ([`settle`]).
    pub(super) let_go: Vec<(SpanKey, lagscope_model::Span)>,
    pub(super) took: Took,
}

/// Settles a held window ([`HeldTimelines::settle`]) `after` its newest span ([`Settling`])
/// after its pass, with the anomalies the pass found holding what they may still grow over: at
/// most once per half of that time of telemetry. Returns the spans let go, for the cache's
/// count.
pub(super) fn settle<A: Borrow<lagscope_model::Anomaly>>(
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

/// The client kinds over a client's spans (and the probes of the clusters it calls, its log
/// lines): the anomalies about this client alone, from its own, complete timeline.
pub(super) fn client_analysis(
    work: ClientWork<'_>,
    horizon: UnixNanos,
    settle_after: UnixNanos,
    config: &Config,
) -> ClientFound {
    let started = Instant::now();
    let mut spans = work.spans;
    let span_count = spans.len();
    let mut input = spans.input(work.probes, horizon);
    if let Spans::Held(held) = &mut spans {
        // Calls judged by an earlier pass and unchanged since are not judged again.
        input.verdicts = held.take_verdicts();
    }
    input.log_events = work.log_events;
    // Spans of shared traces bring in fragments of other clients' timelines: each client's
    // anomalies come from its own, complete pass.
    // (Kinds that name no client would be dropped below: they are not run.)
    let anomalies = analyze_held_kinds(&mut input, &config.analyzer, is_client_pass_kind)
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
        let_go = settle(held, &anomalies, settle_after, config);
    }
    let took = Took::since(started, analysed, span_count, let_go.len());
    took.log_if_slow("client", || work.client_id.to_string());
    ClientFound { anomalies, let_go, address_callers }
}

/// The scope kinds over a scope's spans and samples, and the staleness of its reads per node
/// and minute (for the pages).
pub(super) fn scope_analysis(work: ScopeWork<'_>, limit: u32, settle_after: UnixNanos, config: &Config) -> ScopeFound {
    let started = Instant::now();
    let mut spans = work.spans;
    let span_count = spans.len();
    let mut input = spans.input(work.samples, config.analyzer.stream.horizon());
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
pub(super) const SLOW_ANALYSIS: Duration = Duration::from_millis(100);

/// What one client's or scope's analysis took: the analysis, then the settling.
#[derive(Debug)]
pub(super) struct Took {
    pub(super) analysed: Duration,
    pub(super) settled: Duration,
    /// The spans it analysed, and those its settling let go of.
    pub(super) spans: usize,
    pub(super) let_go: usize,
}

impl Took {
    /// An analysis that began at `started` and took `analysed`, settled since.
    pub(super) fn since(started: Instant, analysed: Duration, spans: usize, let_go: usize) -> Self {
        Self { analysed, settled: started.elapsed().saturating_sub(analysed), spans, let_go }
    }

    /// Took [`SLOW_ANALYSIS`] or longer, its settling included.
    pub(super) fn is_slow(&self) -> bool {
        self.analysed + self.settled >= SLOW_ANALYSIS
    }

    /// A debug line naming the client or scope when it took [`SLOW_ANALYSIS`] or longer: the
    /// longest passes under load are often one such, and the pass's line does not say which.
    pub(super) fn log_if_slow(&self, what: &str, name: impl FnOnce() -> String) {
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
pub(super) fn on_threads<T: Send, R: Send>(
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
pub(super) fn is_client_pass_kind(kind: AnomalyKind) -> bool {
    kind.names_client() && kind != AnomalyKind::UntrustedState
}

pub(super) fn is_scope_kind(kind: AnomalyKind) -> bool {
    (kind.is_window() && !is_cluster_kind(kind)) || kind == AnomalyKind::PinnedRetry
}

/// Window kinds found from one client's own history alone (the cluster URLs its calls went
/// to, its probes' verdicts, the switches it logged). A client with calls is judged by its
/// client pass, which reads all of that, so that no pass with less of it writes another
/// verdict over its; a scope pass keeps only those of clients it has no calls of (known from
/// their log lines alone).
pub(super) fn is_client_kind(kind: AnomalyKind) -> bool {
    matches!(kind, AnomalyKind::BlindFailoverProbe | AnomalyKind::FailoverFlapping)
}

/// The client's probe verdicts (`lagscope.probe.up` of its clusters, naming it or no client)
/// over the time its calls cover, when they name the cluster URL they went to (the only calls
/// whose detectors read them): none otherwise, at no cost. Over all of that time, since the
/// pass judges all of those calls again: a verdict it lacked would change what it says of them.
pub(super) async fn client_probes(
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
pub(super) const CLUSTER_METRICS: &[&str] = &[
    lagscope_model::conventions::METRIC_SHARD_INFLIGHT_BYTES,
    lagscope_model::conventions::METRIC_SHARD_LIMIT_BYTES,
    lagscope_model::conventions::METRIC_SHARD_REJECTIONS,
];

/// The cluster kinds over a cluster's shard metrics of the scope window (every namespace's:
/// they compare a node's shards with each other).
pub(super) async fn cluster_analysis(
    store: &dyn Store,
    cluster: Option<&str>,
    config: &Config,
) -> Result<Vec<lagscope_model::Anomaly>, lagscope_store::StoreError> {
    let window = config.live.scope_window_seconds * 1_000_000_000;
    let samples = store.cluster_samples(cluster, CLUSTER_METRICS, window).await?;
    if samples.is_empty() {
        return Ok(Vec::new());
    }
    let input = AnalysisInput::from_telemetry(&[], samples, config.analyzer.stream.horizon());
    Ok(analyze_kinds(&input, &config.analyzer, is_cluster_kind))
}

/// Kinds found once per cluster from the metrics of all its namespaces.
pub(super) fn is_cluster_kind(kind: AnomalyKind) -> bool {
    kind == AnomalyKind::UnfairRejection
}
