//! Log record rows.

use lagscope_model::LogRecord;
use sqlx::{Sqlite, SqlitePool, Transaction};

use super::insert_rows;
use crate::rows::{LogColumns, LogRow, LogRowWithId};
use crate::{Result, TimeRange};

const INSERT_HEAD: &str = "INSERT INTO logs (
    time_unix_nano, observed_time_unix_nano, severity_number, severity_text, body, event_name, trace_id,
    span_id, service_name, system, cluster, component, node_id, resource_attributes, scope_name,
    scope_version, attributes, identity
) ";

const CONFLICT: &str = " ON CONFLICT (time_unix_nano, identity) DO NOTHING";

/// Inserts log records; returns how many were new (a record identical to a stored one is
/// that record sent again, see [`LogColumns`]).
pub(super) async fn insert(transaction: &mut Transaction<'_, Sqlite>, logs: &[LogRecord]) -> Result<u64> {
    insert_rows(transaction, INSERT_HEAD, CONFLICT, logs, |mut row, record| {
        let resource = &record.resource;
        let columns = LogColumns::of(record);
        row.push_bind(record.time_unix_nano)
            .push_bind(record.observed_time_unix_nano)
            .push_bind(record.severity_number)
            .push_bind(&record.severity_text)
            .push_bind(columns.body)
            .push_bind(&record.event_name)
            .push_bind(&record.trace_id)
            .push_bind(&record.span_id)
            .push_bind(&resource.service_name)
            .push_bind(&resource.system)
            .push_bind(&resource.cluster)
            .push_bind(resource.component.as_ref().map(lagscope_model::Component::as_str))
            .push_bind(&resource.node_id)
            .push_bind(columns.resource_attributes)
            .push_bind(&record.scope_name)
            .push_bind(&record.scope_version)
            .push_bind(columns.attributes)
            .push_bind(columns.identity);
    })
    .await
}

pub(super) async fn range(pool: &SqlitePool, range: TimeRange, limit: u32) -> Result<Vec<LogRecord>> {
    let rows: Vec<LogRow> = sqlx::query_as(
        "SELECT * FROM logs WHERE time_unix_nano >= ?1 AND time_unix_nano < ?2 ORDER BY time_unix_nano, id LIMIT ?3",
    )
    .bind(range.from)
    .bind(range.to)
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await?;
    rows.into_iter().map(LogRow::into_record).collect()
}

/// The cluster's recognised lines of the window: those the feed reads from id 0.
pub(super) async fn recognised_for_cluster(
    pool: &SqlitePool,
    cluster: Option<&str>,
    window: i64,
    limit: u32,
) -> Result<Vec<LogRecord>> {
    let (rows, _) = recognised_for_cluster_after(pool, cluster, window, 0, limit).await?;
    Ok(rows.into_iter().map(|(_, record)| record).collect())
}

/// [`crate::SpanFeed::recognised_logs_after`]: the cluster's recognised lines of the window
/// (from its latest log time back), the newest `limit` of those with ids above `after`, with
/// their ids, and the time the window ends at. In one read transaction, so that the window's
/// end and the rows are of one snapshot.
pub(super) async fn recognised_for_cluster_after(
    pool: &SqlitePool,
    cluster: Option<&str>,
    window: i64,
    after: i64,
    limit: u32,
) -> Result<(Vec<(i64, LogRecord)>, Option<i64>)> {
    let mut transaction = pool.begin().await?;
    let (latest,): (Option<i64>,) = sqlx::query_as("SELECT max(time_unix_nano) FROM logs WHERE cluster IS ?1")
        .bind(cluster)
        .fetch_one(&mut *transaction)
        .await?;
    let Some(latest) = latest else { return Ok((Vec::new(), None)) };
    // `recognised` is a generated column (migration 0007), indexed with the cluster and time:
    // the window's rows are read from the index, those above `after` kept.
    let rows: Vec<LogRowWithId> = sqlx::query_as(
        "SELECT * FROM (
             SELECT * FROM logs
             WHERE cluster IS ?1 AND recognised = 1 AND time_unix_nano >= ?2 AND id > ?3
             ORDER BY time_unix_nano DESC, id DESC LIMIT ?4
         ) ORDER BY time_unix_nano, id",
    )
    .bind(cluster)
    .bind(latest.saturating_sub(window))
    .bind(after)
    .bind(i64::from(limit))
    .fetch_all(&mut *transaction)
    .await?;
    transaction.commit().await?;
    let records = rows.into_iter().map(|row| Ok((row.id, row.row.into_record()?))).collect::<Result<_>>()?;
    Ok((records, Some(latest)))
}

/// Gives each log row stored before log records had an identity (migration 0013) the one its
/// insert would give it now, and removes the rows that turn out to be copies of another (a
/// record sent again, which the store kept twice then): afterwards a stored record is stored
/// once, and a copy of it sent later is recognised. Rows without an identity are found through
/// the partial index of migration 0014, which stays empty once they are done: on a store with
/// none this is one empty index read. Each batch is one transaction, so an interrupted run
/// loses nothing and the next open finishes it. Returns (rows identified, copies removed).
pub(super) async fn identify_old_rows(pool: &SqlitePool) -> Result<(u64, u64)> {
    let (mut identified, mut removed, mut batches) = (0_u64, 0_u64, 0_u64);
    loop {
        let mut transaction = pool.begin().await?;
        let rows: Vec<LogRowWithId> = sqlx::query_as("SELECT * FROM logs WHERE identity IS NULL ORDER BY id LIMIT ?1")
            .bind(IDENTIFY_BATCH)
            .fetch_all(&mut *transaction)
            .await?;
        if rows.is_empty() {
            return Ok((identified, removed));
        }
        for row in &rows {
            let identity = row.identity();
            // In id order, so that of several copies the first stored keeps its row.
            let updated = sqlx::query(
                "UPDATE logs SET identity = ?1 WHERE id = ?2 AND NOT EXISTS
                     (SELECT 1 FROM logs WHERE time_unix_nano = ?3 AND identity = ?1)",
            )
            .bind(identity)
            .bind(row.id)
            .bind(row.row.time_unix_nano)
            .execute(&mut *transaction)
            .await?;
            if updated.rows_affected() == 1 {
                identified += 1;
            } else {
                sqlx::query("DELETE FROM logs WHERE id = ?1").bind(row.id).execute(&mut *transaction).await?;
                removed += 1;
            }
        }
        transaction.commit().await?;
        batches += 1;
        if batches.is_multiple_of(100) {
            tracing::info!(identified, removed, "identifying log records stored before migration 0013");
        }
    }
}

/// Rows identified per transaction.
const IDENTIFY_BATCH: i64 = 1_000;
