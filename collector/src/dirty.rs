//! The set of clients whose timelines changed since the live analyzer last looked.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

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
    /// How many batches had been marked when these marks were taken: once they are analyzed,
    /// every batch up to this one is.
    pub through_batch: u64,
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
        let marks = Mark::of_batch(spans, samples, logs);
        {
            let mut pending = self.pending.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            self.batches.fetch_add(1, Ordering::Relaxed);
            pending.through_batch = self.batches.load(Ordering::Relaxed);
            for mark in marks {
                match mark {
                    Mark::Client(client_id) => pending.clients.insert(client_id),
                    Mark::Trace(trace_id) => pending.traces.insert(trace_id),
                    Mark::Scope(cluster, namespace) => pending.scopes.insert((cluster, namespace)),
                    Mark::LogCluster(cluster) => pending.log_clusters.insert(cluster),
                };
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
