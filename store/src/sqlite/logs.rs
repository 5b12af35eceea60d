//! Log record rows.

use lagscope_model::LogRecord;
use sqlx::{Sqlite, SqlitePool, Transaction};

use super::bind_resource;
use crate::rows::{LogRow, to_json_text};
use crate::{Result, TimeRange};

pub(super) async fn insert(transaction: &mut Transaction<'_, Sqlite>, logs: &[LogRecord]) -> Result<u64> {
    let mut written = 0;
    for record in logs {
        let resource = &record.resource;
        let head = sqlx::query(
            "INSERT INTO logs (time_unix_nano, observed_time_unix_nano, severity_number, severity_text, body,
                 event_name, trace_id, span_id, service_name, system, cluster, component, node_id,
                 resource_attributes, scope_name, scope_version, attributes)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(record.time_unix_nano)
        .bind(record.observed_time_unix_nano)
        .bind(record.severity_number)
        .bind(&record.severity_text)
        .bind(to_json_text(&record.body))
        .bind(&record.event_name)
        .bind(&record.trace_id)
        .bind(&record.span_id);
        let result = bind_resource(head, resource)
            .bind(&record.scope_name)
            .bind(&record.scope_version)
            .bind(to_json_text(&record.attributes))
            .execute(&mut **transaction)
            .await?;
        written += result.rows_affected();
    }
    Ok(written)
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

pub(super) async fn recognised_for_cluster(
    pool: &SqlitePool,
    cluster: Option<&str>,
    window: i64,
    limit: u32,
) -> Result<Vec<LogRecord>> {
    // `recognised` is a generated column (migration 0007), indexed with the cluster and time.
    let rows: Vec<LogRow> = sqlx::query_as(
        "SELECT * FROM (
             SELECT * FROM logs
             WHERE cluster IS ?1 AND recognised = 1
               AND time_unix_nano >= (SELECT max(time_unix_nano) FROM logs WHERE cluster IS ?1) - ?2
             ORDER BY time_unix_nano DESC, id DESC LIMIT ?3
         ) ORDER BY time_unix_nano, id",
    )
    .bind(cluster)
    .bind(window)
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await?;
    rows.into_iter().map(LogRow::into_record).collect()
}
