//! The service's own metrics: what it received, rejected and stored, how long the store
//! took, what the analyzer found. Rendered in the Prometheus text exposition format for
//! `GET /metrics`.
//!
//! Updating a metric is a few atomic operations and never blocks ingest; this crate does no
//! I/O.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A monotonically increasing count.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn add(&self, amount: u64) {
        self.0.fetch_add(amount, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that only moves up (the highest mark a worker has reached).
#[derive(Debug, Default)]
pub struct HighWaterMark(AtomicU64);

impl HighWaterMark {
    pub fn raise_to(&self, value: u64) {
        self.0.fetch_max(value, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down (bytes in a queue).
#[derive(Debug, Default)]
pub struct Gauge(AtomicU64);

impl Gauge {
    pub fn set(&self, value: u64) {
        self.0.store(value, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// How one scrape target is doing.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct TargetStatus {
    pub url: String,
    pub kind: String,
    /// Whether the last scrape succeeded (fetched, parsed, committed).
    pub up: bool,
    pub last_scrape_unix_nano: Option<i64>,
    pub last_success_unix_nano: Option<i64>,
    /// How long the last scrape took, fetch to commit.
    pub duration_seconds: f64,
    /// Samples the last successful scrape committed.
    pub samples: u64,
    pub last_error: Option<String>,
    pub scrapes: u64,
    pub failures: u64,
}

/// Every scrape target's status, by target name.
#[derive(Debug, Default)]
pub struct ScrapeStatus(Mutex<BTreeMap<String, TargetStatus>>);

impl ScrapeStatus {
    /// Updates one target's status.
    pub fn update(&self, target: &str, update: impl FnOnce(&mut TargetStatus)) {
        let mut targets = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        update(targets.entry(target.to_string()).or_default());
    }

    pub fn snapshot(&self) -> BTreeMap<String, TargetStatus> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    fn render(&self, out: &mut String) {
        let targets = self.snapshot();
        if targets.is_empty() {
            return;
        }
        type Field = fn(&TargetStatus) -> f64;
        let families: [(&str, &str, &str, Field); 4] = [
            ("lagscope_scrape_up", "gauge", "1 if the target's last scrape succeeded.", |status| {
                f64::from(u8::from(status.up))
            }),
            ("lagscope_scrape_duration_seconds", "gauge", "Duration of the target's last scrape.", |status| {
                status.duration_seconds
            }),
            (
                "lagscope_scrape_samples",
                "gauge",
                "Samples committed by the target's last successful scrape.",
                |status| status.samples as f64,
            ),
            ("lagscope_scrape_failures_total", "counter", "Failed scrapes of the target.", |status| {
                status.failures as f64
            }),
        ];
        for (name, kind, help, field) in families {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (target, status) in &targets {
                let _ = writeln!(
                    out,
                    "{name}{{target=\"{}\",kind=\"{}\"}} {}",
                    escape_label(target),
                    escape_label(&status.kind),
                    field(status)
                );
            }
        }
    }
}

/// A Prometheus label value: backslash, quote and newline escaped.
pub fn escape_label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Upper bounds (seconds) of the latency histograms' buckets.
const LATENCY_BOUNDS: [f64; 12] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];

/// A latency histogram with fixed buckets.
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    buckets: [AtomicU64; LATENCY_BOUNDS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl LatencyHistogram {
    pub fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        for (bound, bucket) in LATENCY_BOUNDS.iter().zip(&self.buckets) {
            if seconds <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let separator = if labels.is_empty() { "" } else { "," };
        for (bound, bucket) in LATENCY_BOUNDS.iter().zip(&self.buckets) {
            let _ =
                writeln!(out, "{name}_bucket{{{labels}{separator}le=\"{bound}\"}} {}", bucket.load(Ordering::Relaxed));
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{separator}le=\"+Inf\"}} {count}");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let braces = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
        let _ = writeln!(out, "{name}_sum{braces} {sum}");
        let _ = writeln!(out, "{name}_count{braces} {count}");
    }
}

/// Everything the service counts about itself.
#[derive(Debug, Default)]
pub struct SelfMetrics {
    pub spans_received: Counter,
    pub spans_rejected: Counter,
    pub spans_stored: Counter,
    pub samples_received: Counter,
    pub samples_rejected: Counter,
    pub samples_stored: Counter,
    pub logs_received: Counter,
    pub logs_rejected: Counter,
    pub logs_stored: Counter,
    /// Ingest commits (one transaction per group of requests).
    pub store_ingest_latency: LatencyHistogram,
    /// Store transactions committed by the ingest queue.
    pub ingest_commits: Counter,
    /// Requests those transactions held (requests per commit = group commit's effect).
    pub ingest_committed_requests: Counter,
    /// Requests refused because the ingest queue was full.
    pub ingest_queue_full: Counter,
    /// `/api/v1/lag` requests answered 503 after waiting in vain for a turn.
    pub api_lag_requests_refused: Counter,
    /// Bytes reserved in the ingest queue, and its size.
    pub ingest_queue_bytes: Gauge,
    pub ingest_queue_capacity_bytes: Gauge,
    pub analysis_passes: Counter,
    pub analysis_errors: Counter,
    /// Alert messages enqueued, delivered, retried, refused for good; alerter passes failed.
    pub alerts_enqueued: Counter,
    pub alerts_delivered: Counter,
    pub alert_retries: Counter,
    pub alerts_failed: Counter,
    pub alert_errors: Counter,
    /// From the start of a live pass to its findings stored.
    pub analysis_latency: LatencyHistogram,
    /// From the queueing of the first batch a live pass took (before its commit) to that
    /// pass's findings stored.
    pub analysis_delay: LatencyHistogram,
    pub anomalies_new: Counter,
    /// Anomalies stored before, found again changed and written.
    pub anomalies_changed: Counter,
    /// Anomalies found again exactly as stored, not written.
    pub anomalies_unchanged: Counter,
    /// Stored anomalies replaced by a whole version of the same incident (a window or run
    /// found again starting earlier, once its first telemetry came late).
    pub anomalies_superseded: Counter,
    /// Scope passes that took their scope's spans from the live analyzer's scope cache, and
    /// those that read them from the store in full.
    pub scope_reads_cached: Counter,
    pub scope_reads_full: Counter,
    /// Spans the live analyzer's scope cache holds.
    pub scope_spans_cached: Gauge,
    /// Metric samples the live analyzer's sample cache holds.
    pub scope_samples_cached: Gauge,
    /// Client passes that took their client's spans from the live analyzer's client cache,
    /// and those that read them from the store in full; spans that cache holds.
    pub client_reads_cached: Counter,
    pub client_reads_full: Counter,
    pub client_spans_cached: Gauge,
    /// Spans of a client's live timeline (naming it, or hops of its traces) that reached the
    /// client cache after the timeline had been settled past them (`live.settle_seconds`): the
    /// client was let go and read anew from the store, so that they are judged.
    pub analysis_late_spans: Counter,
    /// The same for the scope cache: spans that reached a held scope after its timelines had
    /// been settled past them; the scope was read anew.
    pub analysis_scope_late_spans: Counter,
    /// How far behind a held client's or scope's newest span the live analyzer settles its
    /// calls now, in seconds (`live.settle_seconds`, widened while spans arrive late).
    pub analysis_settle_seconds: Gauge,
    /// Committed ingest batches handed to the live analyzer.
    pub batches_marked: Counter,
    /// How many of those the live analyzer has finished (all batches up to this one).
    pub batches_analyzed: HighWaterMark,
    /// Receiver responses by signal and HTTP status.
    responses: Mutex<BTreeMap<(&'static str, u16), u64>>,
    /// The scrape targets' health.
    pub scrapes: ScrapeStatus,
    /// Retention: rows deleted, whole partitions dropped, passes that failed.
    pub retention_rows_deleted: Counter,
    pub retention_partitions_dropped: Counter,
    pub retention_failures: Counter,
    /// Several instances on one database: the analysis shards this instance holds a lease
    /// on, the live instances it saw, shards it took over, balancing rounds that failed.
    pub cluster_shards_held: Gauge,
    pub cluster_live_instances: Gauge,
    pub cluster_shards_claimed: Counter,
    pub cluster_lease_failures: Counter,
}

impl SelfMetrics {
    pub fn count_response(&self, signal: &'static str, status: u16) {
        let mut responses = self.responses.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        *responses.entry((signal, status)).or_default() += 1;
    }

    /// The Prometheus text exposition of every metric, followed by `gauges` (name, help,
    /// value) that the caller reads at scrape time.
    pub fn render(&self, gauges: &[(&str, &str, f64)]) -> String {
        let mut out = String::new();
        let counters: [(&str, &str, &Counter); 36] = [
            ("lagscope_spans_received_total", "Spans received by the receivers.", &self.spans_received),
            (
                "lagscope_spans_rejected_total",
                "Spans refused (malformed, or breaking the conventions).",
                &self.spans_rejected,
            ),
            ("lagscope_spans_stored_total", "Spans committed to the store.", &self.spans_stored),
            ("lagscope_samples_received_total", "Metric data points received.", &self.samples_received),
            ("lagscope_samples_rejected_total", "Metric data points refused.", &self.samples_rejected),
            ("lagscope_samples_stored_total", "Metric data points committed to the store.", &self.samples_stored),
            ("lagscope_logs_received_total", "Log records received.", &self.logs_received),
            ("lagscope_logs_rejected_total", "Log records refused.", &self.logs_rejected),
            ("lagscope_logs_stored_total", "Log records committed to the store.", &self.logs_stored),
            ("lagscope_ingest_commits_total", "Store transactions made by the ingest queue.", &self.ingest_commits),
            (
                "lagscope_ingest_committed_requests_total",
                "Receiver requests committed (several share one transaction under load).",
                &self.ingest_committed_requests,
            ),
            (
                "lagscope_ingest_queue_full_total",
                "Requests refused with 429 / RESOURCE_EXHAUSTED because the ingest queue was full.",
                &self.ingest_queue_full,
            ),
            (
                "lagscope_api_lag_requests_refused_total",
                "/api/v1/lag requests answered 503 after waiting in vain for a turn \
                 (server.max_concurrent_lag_requests were being served).",
                &self.api_lag_requests_refused,
            ),
            ("lagscope_analysis_passes_total", "Live analysis passes run.", &self.analysis_passes),
            ("lagscope_analysis_errors_total", "Live analysis passes that failed.", &self.analysis_errors),
            ("lagscope_anomalies_new_total", "Anomalies reported for the first time.", &self.anomalies_new),
            (
                "lagscope_anomalies_changed_total",
                "Anomalies found again changed (a window grew or closed, new evidence) and written.",
                &self.anomalies_changed,
            ),
            (
                "lagscope_anomalies_unchanged_total",
                "Anomalies found again exactly as stored, not written.",
                &self.anomalies_unchanged,
            ),
            (
                "lagscope_anomalies_superseded_total",
                "Stored anomalies replaced by a whole version of the same incident that starts earlier \
                 (its first telemetry came late): closed and no longer listed.",
                &self.anomalies_superseded,
            ),
            (
                "lagscope_analysis_scope_reads_cached_total",
                "Scope passes that took their scope's spans from the live analyzer's scope cache.",
                &self.scope_reads_cached,
            ),
            (
                "lagscope_analysis_scope_reads_full_total",
                "Scope passes that read their scope's spans from the store in full.",
                &self.scope_reads_full,
            ),
            (
                "lagscope_analysis_client_reads_cached_total",
                "Client passes that took their client's spans from the live analyzer's client cache.",
                &self.client_reads_cached,
            ),
            (
                "lagscope_analysis_client_reads_full_total",
                "Client passes that read their client's spans from the store in full.",
                &self.client_reads_full,
            ),
            (
                "lagscope_analysis_late_spans_total",
                "Spans that reached a client's live timeline after it was settled past them \
                 (live.settle_seconds): the client was read anew from the store to judge them.",
                &self.analysis_late_spans,
            ),
            (
                "lagscope_analysis_scope_late_spans_total",
                "Spans that reached a scope's live timelines after they were settled past them \
                 (live.settle_seconds): the scope was read anew from the store to judge them.",
                &self.analysis_scope_late_spans,
            ),
            ("lagscope_alerts_enqueued_total", "Alert messages put in the outbox.", &self.alerts_enqueued),
            ("lagscope_alerts_delivered_total", "Alert messages a receiver took.", &self.alerts_delivered),
            ("lagscope_alert_retries_total", "Alert deliveries not taken, to be retried.", &self.alert_retries),
            ("lagscope_alerts_failed_total", "Alert messages a receiver refused for good.", &self.alerts_failed),
            ("lagscope_alert_errors_total", "Alerter and delivery passes that failed.", &self.alert_errors),
            (
                "lagscope_analysis_batches_marked_total",
                "Committed batches handed to the live analyzer.",
                &self.batches_marked,
            ),
            (
                "lagscope_retention_rows_deleted_total",
                "Rows the retention deleted (spans, samples, logs, anomalies).",
                &self.retention_rows_deleted,
            ),
            (
                "lagscope_retention_partitions_dropped_total",
                "Whole time partitions the retention dropped (PostgreSQL).",
                &self.retention_partitions_dropped,
            ),
            ("lagscope_retention_failures_total", "Retention passes that failed.", &self.retention_failures),
            (
                "lagscope_cluster_shards_claimed_total",
                "Analysis shards this instance took (free, released, or expired with a dead holder).",
                &self.cluster_shards_claimed,
            ),
            (
                "lagscope_cluster_lease_failures_total",
                "Lease balancing rounds that failed (the database did not answer).",
                &self.cluster_lease_failures,
            ),
        ];
        for (name, help, counter) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", counter.get());
        }
        let name = "lagscope_receiver_responses_total";
        let _ = writeln!(out, "# HELP {name} Receiver responses by signal and HTTP status.\n# TYPE {name} counter");
        let responses = self.responses.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        for ((signal, status), count) in responses {
            let _ = writeln!(out, "{name}{{signal=\"{signal}\",code=\"{status}\"}} {count}");
        }
        let histograms = [
            (
                "lagscope_store_ingest_seconds",
                "Time to commit one group of received requests to the store.",
                &self.store_ingest_latency,
            ),
            (
                "lagscope_analysis_seconds",
                "Time of one live analysis pass, from its start to its findings stored.",
                &self.analysis_latency,
            ),
            (
                "lagscope_analysis_delay_seconds",
                "From the queueing for commit of the first batch a live pass took to that pass's findings stored: the longest its telemetry waited to be analysed.",
                &self.analysis_delay,
            ),
        ];
        for (name, help, histogram) in histograms {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            histogram.render(&mut out, name, "");
        }
        let name = "lagscope_analysis_batches_analyzed";
        let _ = writeln!(
            out,
            "# HELP {name} Committed batches the live analyzer has finished.\n# TYPE {name} gauge\n{name} {}",
            self.batches_analyzed.get()
        );
        let own_gauges = [
            (
                "lagscope_ingest_queue_bytes",
                "Bytes reserved in the ingest queue by requests being read, decoded or committed.",
                &self.ingest_queue_bytes,
            ),
            (
                "lagscope_ingest_queue_capacity_bytes",
                "The ingest queue's size in bytes.",
                &self.ingest_queue_capacity_bytes,
            ),
            (
                "lagscope_analysis_scope_spans_cached",
                "Spans the live analyzer's scope cache holds (live.scope_cache_spans at most).",
                &self.scope_spans_cached,
            ),
            (
                "lagscope_analysis_scope_samples_cached",
                "Metric samples the live analyzer's sample cache holds (live.scope_cache_samples at most).",
                &self.scope_samples_cached,
            ),
            (
                "lagscope_analysis_client_spans_cached",
                "Spans the live analyzer's client cache holds (live.client_cache_spans at most).",
                &self.client_spans_cached,
            ),
            (
                "lagscope_analysis_settle_seconds",
                "How far behind a held client's or scope's newest span the live analyzer settles its calls now \
                 (live.settle_seconds, widened up to live.max_settle_seconds while spans arrive late).",
                &self.analysis_settle_seconds,
            ),
            (
                "lagscope_cluster_shards_held",
                "Analysis shards whose lease this instance holds (PostgreSQL).",
                &self.cluster_shards_held,
            ),
            (
                "lagscope_cluster_live_instances",
                "Instances with a live heartbeat on the shared database, this one included.",
                &self.cluster_live_instances,
            ),
        ];
        for (name, help, gauge) in own_gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {}", gauge.get());
        }
        self.scrapes.render(&mut out);
        for (name, help, value) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_histograms_and_gauges() {
        let metrics = SelfMetrics::default();
        metrics.spans_received.add(3);
        metrics.count_response("traces", 200);
        metrics.store_ingest_latency.observe(Duration::from_millis(3));
        let text = metrics.render(&[("lagscope_store_spans", "Spans in the store.", 7.0)]);
        assert!(text.contains("lagscope_spans_received_total 3\n"), "{text}");
        assert!(text.contains("lagscope_receiver_responses_total{signal=\"traces\",code=\"200\"} 1\n"), "{text}");
        assert!(text.contains("lagscope_store_ingest_seconds_bucket{le=\"0.0025\"} 0\n"), "{text}");
        assert!(text.contains("lagscope_store_ingest_seconds_bucket{le=\"0.005\"} 1\n"), "{text}");
        assert!(text.contains("lagscope_store_ingest_seconds_count 1\n"), "{text}");
        assert!(text.contains("lagscope_store_spans 7\n"), "{text}");
    }
}
