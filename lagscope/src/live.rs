//! The live analyzer: re-analyzes each client whose spans were just committed and stores
//! what it finds. Same detectors as `lagscope analyze`, over the store instead of a file.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use lagscope_analyzer::log_events::{LogEvent, classify};
use lagscope_analyzer::{AnalysisInput, analyze, analyze_kinds};
use lagscope_collector::DirtyClients;
use lagscope_model::AnomalyKind;
use lagscope_selfmetrics::SelfMetrics;
use lagscope_store::{Store, TimeRange};
use tokio::sync::watch;

use crate::Config;

pub async fn run_live_analyzer(
    store: Arc<dyn Store>,
    dirty: Arc<DirtyClients>,
    metrics: Arc<SelfMetrics>,
    config: Config,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    loop {
        let pending = tokio::select! {
            pending = dirty.take() => pending,
            _ = shutdown.wait_for(|stop| *stop) => return Ok(()),
        };
        let started = Instant::now();
        let through_batch = pending.through_batch;
        match analysis_pass(store.as_ref(), &metrics, &config, pending).await {
            Ok(()) => metrics.analysis_passes.add(1),
            Err(error) => {
                // The data is committed; the next pass for these clients will find it again.
                metrics.analysis_errors.add(1);
                tracing::error!(%error, "live analysis pass failed");
            }
        }
        metrics.analysis_latency.observe(started.elapsed());
        metrics.batches_analyzed.raise_to(through_batch);
    }
}

async fn analysis_pass(
    store: &dyn Store,
    metrics: &SelfMetrics,
    config: &Config,
    pending: lagscope_collector::Pending,
) -> Result<(), lagscope_store::StoreError> {
    let mut scopes = pending.scopes;
    // The recognised lines of each cluster with new log records: they name the scopes to look
    // at again, and every pass of the cluster sees them. (Passes of clusters without new logs
    // read none: what log lines found stays stored, and reading a busy cluster's logs on every
    // batch of spans would cost more than the spans.)
    let mut events_by_cluster: BTreeMap<Option<String>, Vec<LogEvent>> = BTreeMap::new();
    for cluster in &pending.log_clusters {
        let window = config.live.scope_window_seconds * 1_000_000_000;
        // Only candidate lines (an index finds them) leave the store; classify decides.
        let logs = store.recognised_logs(cluster.as_deref(), window, config.live.max_logs_per_cluster).await?;
        let events: Vec<LogEvent> = logs.iter().filter_map(classify).collect();
        scopes.extend(events.iter().map(|event| (cluster.clone(), event.namespace.clone())));
        events_by_cluster.insert(cluster.clone(), events);
    }
    let mut clients: BTreeSet<String> = pending.clients;
    let traces: Vec<String> = pending.traces.into_iter().collect();
    clients.extend(store.clients_of_traces(&traces).await?);
    for client_id in clients {
        let spans = store.client_spans(&client_id, TimeRange::ALL, config.live.max_spans_per_client).await?;
        let mut input = AnalysisInput::from_telemetry(&spans, Vec::new());
        // The client's own lines (a client that logs its switches is judged by them).
        input.log_events = events_by_cluster
            .values()
            .flatten()
            .filter(|event| event.client_id.as_deref() == Some(client_id.as_str()))
            .cloned()
            .collect();
        // Spans of shared traces bring in fragments of other clients' timelines: each
        // client's anomalies come from its own, complete pass.
        let anomalies: Vec<_> = analyze(&input, &config.analyzer)
            .into_iter()
            .filter(|anomaly| anomaly.client_id.as_deref() == Some(client_id.as_str()))
            .collect();
        record(store, metrics, &anomalies).await?;
    }
    // Node- and namespace-level detectors (lags, storms, windows, pressure) need every
    // client's spans and the metrics of the scope: one pass per touched scope.
    for (cluster, namespace) in scopes {
        let spans = store
            .scope_spans(cluster.as_deref(), namespace.as_deref(), TimeRange::ALL, config.live.max_spans_per_scope)
            .await?;
        let samples = store
            .scope_samples(cluster.as_deref(), namespace.as_deref(), config.live.scope_window_seconds * 1_000_000_000)
            .await?;
        let mut input = AnalysisInput::from_telemetry(&spans, samples);
        input.log_events = events_by_cluster
            .get(&cluster)
            .map(|events| {
                // The namespace's lines, and every evidence line of the cluster (matched to
                // anomalies by node and shard when attached).
                events
                    .iter()
                    .filter(|event| event.namespace == namespace || event.kind.is_evidence())
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        // Only the window kinds: the per-attempt ones were found by the client passes.
        let anomalies = analyze_kinds(&input, &config.analyzer, AnomalyKind::is_window);
        record(store, metrics, &anomalies).await?;
    }
    Ok(())
}

async fn record(
    store: &dyn Store,
    metrics: &SelfMetrics,
    anomalies: &[lagscope_model::Anomaly],
) -> Result<(), lagscope_store::StoreError> {
    if anomalies.is_empty() {
        return Ok(());
    }
    let outcome = store.upsert_anomalies(anomalies, now_unix_nano()).await?;
    metrics.anomalies_new.add(outcome.inserted.len() as u64);
    for id in &outcome.inserted {
        tracing::info!(anomaly_id = id, "new anomaly");
    }
    Ok(())
}

/// The wall clock in Unix nanoseconds.
pub(crate) fn now_unix_nano() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_nanos() as i64)
}
