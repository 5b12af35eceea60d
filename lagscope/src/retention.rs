//! The retention task: every `retention.interval_seconds`, removes what each signal's
//! retention no longer covers (`Store::enforce_retention`: SQLite deletes in small batches,
//! PostgreSQL drops whole daily partitions), counting what it did in `/metrics`.

use std::sync::Arc;
use std::time::Duration;

use lagscope_selfmetrics::SelfMetrics;
use lagscope_store::{RetentionCutoffs, Store};
use tokio::sync::watch;

use crate::config::RetentionConfig;

/// Runs until shutdown. A failed pass is logged and counted; the next one tries again.
pub async fn run_retention(
    store: Arc<dyn Store>,
    metrics: Arc<SelfMetrics>,
    config: RetentionConfig,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let [spans, samples, logs, anomalies] = config.durations().map_err(|problem| anyhow::anyhow!(problem))?;
    let mut ticks = tokio::time::interval(Duration::from_secs(config.interval_seconds.max(1)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = shutdown.changed() => return Ok(()),
        }
        let now = crate::live::now_unix_nano();
        let cutoff = |keep: Option<i64>| keep.map(|keep| now.saturating_sub(keep));
        let cutoffs = RetentionCutoffs {
            spans: cutoff(spans),
            samples: cutoff(samples),
            logs: cutoff(logs),
            anomalies: cutoff(anomalies),
        };
        match store.enforce_retention(&cutoffs).await {
            Ok(report) => {
                let rows = report.spans + report.samples + report.logs + report.anomalies;
                metrics.retention_rows_deleted.add(rows);
                metrics.retention_partitions_dropped.add(report.partitions_dropped.len() as u64);
                if rows > 0 || !report.partitions_dropped.is_empty() {
                    tracing::info!(
                        spans = report.spans,
                        samples = report.samples,
                        logs = report.logs,
                        anomalies = report.anomalies,
                        partitions_dropped = ?report.partitions_dropped,
                        "retention removed old data"
                    );
                }
            }
            Err(error) => {
                metrics.retention_failures.add(1);
                tracing::warn!(%error, "retention pass failed; retrying at the next interval");
            }
        }
    }
}
