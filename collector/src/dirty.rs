//! The set of clients whose timelines changed since the live analyzer last looked.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use lagscope_model::{LogRecord, Sample, Span};
use lagscope_store::Mark;
use tokio::sync::Notify;

/// Trace ids kept for resolution at most; beyond this the oldest marks are dropped (and
/// counted), so a stalled analyzer cannot make ingest grow memory without bound.
const MAX_PENDING_TRACES: usize = 100_000;

/// Receivers mark what they committed; the live analyzer takes the marks in batches.
/// Marks coalesce: a client ingested a thousand times before the analyzer wakes is analyzed
/// once.
#[derive(Debug, Default)]
pub struct DirtyClients {
    pending: Mutex<Pending>,
    notify: Notify,
    dropped_traces: AtomicU64,
    batches: AtomicU64,
    taken_through: AtomicU64,
}

/// What the analyzer should look at next.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pending {
    /// Client ids that had spans ingested.
    pub clients: BTreeSet<String>,
    /// Traces that had spans ingested without a client id (router and server hops); their
    /// clients are looked up in the store.
    pub traces: BTreeSet<String>,
    /// (cluster, namespace) scopes that had spans or metric samples ingested: their node- and
    /// namespace-level detectors run again.
    pub scopes: BTreeSet<(Option<String>, Option<String>)>,
    /// Clusters that had log records ingested.
    pub log_clusters: BTreeSet<Option<String>>,
    /// The oldest time of the metric samples committed, per (cluster, namespace) of their
    /// series' labels, every sample counted (those naming no cluster too): what a reader
    /// holding a scope's earlier samples reads again (the live analyzer's sample cache).
    pub sample_times: BTreeMap<(Option<String>, Option<String>), i64>,
    /// How many batches had been marked when these marks were taken: once they are analyzed,
    /// every batch up to this one is.
    pub through_batch: u64,
    /// When the first of these marks' batches was queued for its commit (marked, for a batch
    /// marked without a queue): how long its telemetry has waited for the analyzer. None for
    /// marks read back from a database.
    pub first_queued: Option<Instant>,
}

impl DirtyClients {
    /// Marks the clients (or, for spans naming none, the traces) of committed spans.
    /// Every committed batch is marked, even one without spans, so that `through_batch`
    /// counts batches.
    pub fn mark(&self, spans: &[Span]) {
        self.mark_batch(spans, &[]);
    }

    /// Marks a committed batch of spans, metric samples and log records.
    pub fn mark_batch(&self, spans: &[Span], samples: &[Sample]) {
        self.mark_all(spans, samples, &[]);
    }

    /// Marks a committed batch of spans, metric samples and log records: the clusters of log
    /// records are looked at again (their recognised lines name the namespaces).
    pub fn mark_all(&self, spans: &[Span], samples: &[Sample], logs: &[LogRecord]) {
        self.mark_queued(spans, samples, logs, Instant::now());
    }

    /// [`DirtyClients::mark_all`] for a batch queued for its commit at `queued`.
    pub fn mark_queued(&self, spans: &[Span], samples: &[Sample], logs: &[LogRecord], queued: Instant) {
        let marks = Mark::of_batch(spans, samples, logs);
        // A batch's samples mostly share a few scopes: the oldest time of each, then merged.
        let sample_times = Mark::sample_times(samples);
        {
            let mut pending = self.pending.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            self.batches.fetch_add(1, Ordering::Relaxed);
            pending.through_batch = self.batches.load(Ordering::Relaxed);
            let first = pending.first_queued.get_or_insert(queued);
            *first = (*first).min(queued);
            for mark in marks {
                match mark {
                    Mark::Client(client_id) => pending.clients.insert(client_id),
                    Mark::Trace(trace_id) => pending.traces.insert(trace_id),
                    Mark::Scope(cluster, namespace) => pending.scopes.insert((cluster, namespace)),
                    Mark::LogCluster(cluster) => pending.log_clusters.insert(cluster),
                };
            }
            for ((cluster, namespace), time) in sample_times {
                let scope = (cluster.map(str::to_string), namespace.map(str::to_string));
                let oldest = pending.sample_times.entry(scope).or_insert(time);
                *oldest = (*oldest).min(time);
            }
            while pending.traces.len() > MAX_PENDING_TRACES {
                pending.traces.pop_first();
                self.dropped_traces.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.notify.notify_one();
    }

    /// Waits until something is marked, then takes every mark.
    pub async fn take(&self) -> Pending {
        loop {
            let notified = self.notify.notified();
            {
                let mut pending = self.pending.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                if pending.through_batch > self.taken_through.load(Ordering::Relaxed) {
                    self.taken_through.store(pending.through_batch, Ordering::Relaxed);
                    let through_batch = pending.through_batch;
                    let taken = std::mem::take(&mut *pending);
                    pending.through_batch = through_batch;
                    return taken;
                }
            }
            notified.await;
        }
    }

    /// Trace marks dropped because the analyzer fell behind.
    pub fn dropped_traces(&self) -> u64 {
        self.dropped_traces.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use lagscope_model::conventions::{CLUSTER, NAMESPACE};
    use lagscope_model::{MetricKind, PointValue, SeriesKey, SeriesMeta};

    use super::*;

    fn sample(labels: &[(&str, &str)], time: i64) -> Sample {
        Sample {
            series: SeriesKey {
                name: "lagscope.server.applied_state".to_string(),
                labels: labels.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect(),
            }
            .into(),
            meta: SeriesMeta { kind: MetricKind::Gauge, unit: None, description: None }.into(),
            time_unix_nano: time,
            start_time_unix_nano: None,
            value: PointValue::Number(1.0),
        }
    }

    /// The oldest sample time per (cluster, namespace) of the batches marked since the last
    /// take, samples naming no cluster or no namespace included; a take starts afresh.
    #[tokio::test]
    async fn sample_times_are_the_oldest_committed_per_scope_since_the_last_take() {
        let dirty = DirtyClients::default();
        let ns1 = [(CLUSTER, "prod"), (NAMESPACE, "ns1")];
        dirty.mark_all(&[], &[sample(&ns1, 500), sample(&ns1, 300), sample(&[(CLUSTER, "prod")], 700)], &[]);
        dirty.mark_all(&[], &[sample(&ns1, 400), sample(&[(NAMESPACE, "ns1")], 900), sample(&ns1, 200)], &[]);
        let scope = |cluster: Option<&str>, namespace: Option<&str>| {
            (cluster.map(str::to_string), namespace.map(str::to_string))
        };
        let expected = BTreeMap::from([
            (scope(None, Some("ns1")), 900),
            (scope(Some("prod"), None), 700),
            (scope(Some("prod"), Some("ns1")), 200),
        ]);
        assert_eq!(dirty.take().await.sample_times, expected);
        dirty.mark_all(&[], &[sample(&ns1, 800)], &[]);
        assert_eq!(dirty.take().await.sample_times, BTreeMap::from([(scope(Some("prod"), Some("ns1")), 800)]));
    }

    #[tokio::test]
    async fn first_queued_is_the_earliest_queue_time_since_the_last_take() {
        let dirty = DirtyClients::default();
        let before = Instant::now();
        dirty.mark(&[]);
        std::thread::sleep(std::time::Duration::from_millis(2));
        let between = Instant::now();
        dirty.mark(&[]);
        let first = dirty.take().await.first_queued.expect("marked");
        assert!(before <= first && first < between);
        // A batch queued earlier than one marked before it (commit groups finish out of order).
        let after = Instant::now();
        dirty.mark(&[]);
        dirty.mark_queued(&[], &[], &[], before);
        assert_eq!(dirty.take().await.first_queued, Some(before));
        dirty.mark(&[]);
        assert!(dirty.take().await.first_queued.expect("marked") >= after);
    }
}
