//! Retention on SQLite: old rows deleted in batches of [`RETENTION_BATCH_ROWS`], each its own
//! short transaction on the writer, so ingest commits interleave with a long pass. Freed pages
//! are reused by later inserts: under constant load the file stops growing once the
//! retention is reached.

use sqlx::SqlitePool;

use crate::{RETENTION_BATCH_ROWS, Result, RetentionCutoffs, RetentionReport};

/// (table, the batch's DELETE) per signal; `?1` is the cut-off, `?2` the batch size.
///
/// The newest span stays, whatever its start: SQLite gives a new row the largest id plus one,
/// so deleting the largest would hand its id out again, and the span feed
/// ([`crate::SpanFeed`]) relies on span ids never coming back. It goes once a span follows it.
const SPANS: &str = "DELETE FROM spans WHERE id IN (
    SELECT id FROM spans WHERE start_unix_nano < ?1 AND id < (SELECT max(id) FROM spans) LIMIT ?2)";
const SAMPLES: &str = "DELETE FROM samples WHERE (series_id, time_unix_nano) IN (
    SELECT series_id, time_unix_nano FROM samples WHERE time_unix_nano < ?1 LIMIT ?2)";
/// The newest log line stays likewise: the log feed relies on log ids never coming back.
const LOGS: &str = "DELETE FROM logs WHERE id IN (
    SELECT id FROM logs WHERE time_unix_nano < ?1 AND id < (SELECT max(id) FROM logs) LIMIT ?2)";
const ANOMALIES: &str =
    "DELETE FROM anomalies WHERE id IN (SELECT id FROM anomalies WHERE open = 0 AND end_unix_nano < ?1 LIMIT ?2)";
/// Rollups summarise spans: they go with the spans' cut-off.
const ROLLUPS: &str = "DELETE FROM read_rollups WHERE (minute_unix_nano, cluster, namespace, node_id) IN (
    SELECT minute_unix_nano, cluster, namespace, node_id FROM read_rollups WHERE minute_unix_nano < ?1 LIMIT ?2)";
/// Alerts go with the anomalies' cut-off: finished messages, then resolved incidents.
const ALERT_MESSAGES: &str = "DELETE FROM alert_outbox WHERE id IN (
    SELECT id FROM alert_outbox WHERE state != 'pending' AND finished_unix_nano < ?1 LIMIT ?2)";
const ALERT_INCIDENTS: &str = "DELETE FROM alert_incidents WHERE (receiver, incident) IN (
    SELECT receiver, incident FROM alert_incidents WHERE firing = 0 AND last_sent_unix_nano < ?1 LIMIT ?2)";

pub(super) async fn enforce(writer: &SqlitePool, cutoffs: &RetentionCutoffs) -> Result<RetentionReport> {
    Ok(RetentionReport {
        spans: delete_batches(writer, SPANS, cutoffs.spans).await?,
        samples: delete_batches(writer, SAMPLES, cutoffs.samples).await?,
        logs: delete_batches(writer, LOGS, cutoffs.logs).await?,
        anomalies: delete_batches(writer, ANOMALIES, cutoffs.anomalies).await?,
        rollups: delete_batches(writer, ROLLUPS, cutoffs.spans).await?,
        alerts: delete_batches(writer, ALERT_MESSAGES, cutoffs.anomalies).await?
            + delete_batches(writer, ALERT_INCIDENTS, cutoffs.anomalies).await?,
        partitions_dropped: Vec::new(),
    })
}

async fn delete_batches(writer: &SqlitePool, statement: &'static str, cutoff: Option<i64>) -> Result<u64> {
    let Some(cutoff) = cutoff else { return Ok(0) };
    let mut deleted = 0;
    loop {
        let result = sqlx::query(statement).bind(cutoff).bind(RETENTION_BATCH_ROWS).execute(writer).await?;
        deleted += result.rows_affected();
        if result.rows_affected() < RETENTION_BATCH_ROWS as u64 {
            return Ok(deleted);
        }
        // Each batch acquires the writer anew: a waiting ingest commit goes in between.
    }
}
