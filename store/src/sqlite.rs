//! The embedded backend: one SQLite file in WAL mode.
//!
//! Writes go through a pool of exactly one connection, so that transactions never race for
//! SQLite's single writer lock (which `busy_timeout` cannot resolve for lock upgrades); reads
//! use their own pool and proceed concurrently with writes, as WAL allows.

mod anomalies;
mod logs;
mod retention;
mod samples;
mod spans;

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use lagscope_model::{Anomaly, LogRecord, ReadRollup, Sample, Span, UnixNanos};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};

use crate::anomaly_query::Dialect;
use crate::rows::{AnomalyRow, RollupRow};
use crate::{
    AlertCursor, AlertIncident, AlertMessage, AnomalyCount, AnomalyFilter, DeliveryOutcome, IngestBatch, IngestReceipt,
    NewAlertMessage, Reduce, Result, RetentionCutoffs, RetentionReport, Scope, SeriesSamples, SpanFeed, Store,
    StoreError, StoreStats, StoredAnomaly, TimeRange, UpsertOutcome,
};
use crate::{seen_at_once, seen_each};

static MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");

/// Page cache of the writing connection, KiB (SQLite's default is 2 000). Every ingest
/// updates the spans' and samples' indexes at keys spread over the whole file (trace and
/// span ids, series): with the default cache each of those updates read its pages again from
/// the operating system's cache, a system call and a copy each.
const WRITER_CACHE_KIB: u32 = 65_536;

/// The file name of the database inside a data directory.
pub const DATABASE_FILE: &str = "lagscope.sqlite";

#[derive(Debug, Clone)]
pub struct SqliteStore {
    writer: SqlitePool,
    reader: SqlitePool,
}

impl SqliteStore {
    /// Opens (creating if needed) `lagscope.sqlite` in `data_dir` and applies migrations.
    pub async fn open_dir(data_dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(data_dir).map_err(|error| StoreError::Open {
            path: data_dir.display().to_string(),
            source: sqlx::Error::Io(error),
        })?;
        Self::open_file(&data_dir.join(DATABASE_FILE)).await
    }

    /// Opens (creating if needed) the database file at `path` and applies migrations.
    pub async fn open_file(path: &Path) -> Result<Self> {
        let open_error = |source| StoreError::Open { path: path.display().to_string(), source };
        let options = SqliteConnectOptions::from_str("sqlite://")
            .map_err(open_error)?
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // FULL: a transaction is on disk when COMMIT returns, even across power loss;
            // receivers acknowledge data only then.
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone().pragma("cache_size", format!("-{WRITER_CACHE_KIB}")))
            .await
            .map_err(open_error)?;
        MIGRATIONS.run(&writer).await?;
        let (identified, removed) = logs::identify_old_rows(&writer).await?;
        if identified + removed > 0 {
            tracing::info!(
                identified,
                removed,
                "log records stored before migration 0013 now have their identity; copies of one removed"
            );
        }
        let reader = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options.read_only(true))
            .await
            .map_err(open_error)?;
        Ok(Self { writer, reader })
    }

    /// The schema migrations and which of them the database file at `path` has, without
    /// changing it (a missing file has none).
    pub async fn migration_status(path: &Path) -> Result<Vec<crate::MigrationState>> {
        if !path.exists() {
            return Ok(crate::migration_states(&MIGRATIONS, &[]));
        }
        let open_error = |source| StoreError::Open { path: path.display().to_string(), source };
        let options = SqliteConnectOptions::from_str("sqlite://").map_err(open_error)?.filename(path).read_only(true);
        let pool = SqlitePoolOptions::new().max_connections(1).connect_with(options).await.map_err(open_error)?;
        let applied = applied_migrations(&pool).await;
        pool.close().await;
        Ok(crate::migration_states(&MIGRATIONS, &applied?))
    }

    /// Closes both pools, checkpointing the WAL.
    pub async fn close(&self) {
        self.reader.close().await;
        self.writer.close().await;
    }
}

/// The `_sqlx_migrations` rows (none when the table does not exist yet).
async fn applied_migrations(pool: &SqlitePool) -> Result<Vec<(i64, bool, Vec<u8>)>> {
    let (exists,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'")
            .fetch_one(pool)
            .await?;
    if exists == 0 {
        return Ok(Vec::new());
    }
    Ok(sqlx::query_as("SELECT version, success, checksum FROM _sqlx_migrations").fetch_all(pool).await?)
}

#[async_trait]
impl Store for SqliteStore {
    async fn ingest(&self, batch: &IngestBatch) -> Result<IngestReceipt> {
        if batch.is_empty() {
            return Ok(IngestReceipt::default());
        }
        let mut transaction = self.writer.begin().await?;
        let spans_written = spans::insert(&mut transaction, &batch.spans).await?;
        let samples_written = samples::insert(&mut transaction, &batch.samples).await?;
        let logs_written = logs::insert(&mut transaction, &batch.logs).await?;
        transaction.commit().await?;
        Ok(IngestReceipt { spans_written, samples_written, logs_written })
    }

    async fn client_spans(&self, client_id: &str, range: TimeRange, limit: u32) -> Result<Vec<Span>> {
        spans::for_client(&self.reader, client_id, range, limit).await
    }

    async fn scope_spans(
        &self,
        cluster: Option<&str>,
        namespace: Option<&str>,
        range: TimeRange,
        limit: u32,
    ) -> Result<Vec<Span>> {
        spans::for_scope(&self.reader, cluster, namespace, range, limit, i64::MAX).await
    }

    async fn scope_samples_from(
        &self,
        cluster: Option<&str>,
        namespace: Option<&str>,
        window: i64,
        from: i64,
    ) -> Result<Vec<(i64, Sample)>> {
        samples::for_scope(&self.reader, cluster, crate::Namespaces::One(namespace), window, from).await
    }

    async fn cluster_samples(&self, cluster: Option<&str>, names: &[&str], window: i64) -> Result<Vec<Sample>> {
        let samples =
            samples::for_scope(&self.reader, cluster, crate::Namespaces::Every(names), window, i64::MIN).await?;
        Ok(samples.into_iter().map(|(_, sample)| sample).collect())
    }

    async fn spans_in_range(
        &self,
        cluster: Option<&str>,
        namespace: Option<&str>,
        range: TimeRange,
        limit: u32,
    ) -> Result<Vec<Span>> {
        spans::in_range(&self.reader, cluster, namespace, range, limit).await
    }

    async fn samples_in_range(
        &self,
        cluster: Option<&str>,
        namespace: Option<&str>,
        range: TimeRange,
        limit: u32,
    ) -> Result<Vec<Sample>> {
        samples::in_range(&self.reader, cluster, namespace, range, limit).await
    }

    async fn named_samples_in_range(&self, names: &[&str], range: TimeRange, limit: u32) -> Result<Vec<Sample>> {
        samples::named_in_range(&self.reader, names, range, limit).await
    }

    async fn committed_on_spans(&self, range: TimeRange, limit: u32) -> Result<Vec<crate::CommittedOnSpan>> {
        Ok(sqlx::query_as(
            "SELECT cluster, namespace, end_unix_nano, state_committed FROM spans
             WHERE start_unix_nano >= ?1 AND start_unix_nano < ?2 AND state_committed IS NOT NULL
             ORDER BY start_unix_nano, id LIMIT ?3",
        )
        .bind(range.from)
        .bind(range.to)
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await?)
    }

    async fn clients_of_traces(&self, trace_ids: &[String]) -> Result<Vec<String>> {
        spans::clients_of_traces(&self.reader, trace_ids).await
    }

    async fn upsert_anomalies(&self, anomalies: &[Anomaly], seen_at: UnixNanos) -> Result<UpsertOutcome> {
        let mut transaction = self.writer.begin().await?;
        let outcome = anomalies::upsert(&mut transaction, &seen_at_once(anomalies, seen_at)).await?;
        transaction.commit().await?;
        Ok(outcome)
    }

    async fn upsert_anomalies_seen_at(&self, anomalies: &[(Anomaly, UnixNanos)]) -> Result<UpsertOutcome> {
        let mut transaction = self.writer.begin().await?;
        let outcome = anomalies::upsert(&mut transaction, &seen_each(anomalies)).await?;
        transaction.commit().await?;
        Ok(outcome)
    }

    async fn anomalies(&self, filter: &AnomalyFilter) -> Result<Vec<StoredAnomaly>> {
        anomalies::list(&self.reader, filter).await
    }

    async fn newest_of_kind(
        &self,
        kind: lagscope_model::AnomalyKind,
        range: TimeRange,
        limit: u32,
    ) -> Result<Vec<StoredAnomaly>> {
        crate::anomaly_query::newest_of_kind_in(limit, |part, limit| async move {
            let rows: Vec<AnomalyRow> = crate::anomaly_query::newest_of_kind(kind, range, part, limit)
                .build_query_as()
                .fetch_all(&self.reader)
                .await?;
            rows.into_iter().map(AnomalyRow::into_stored).collect()
        })
        .await
    }

    async fn anomaly(&self, id: i64) -> Result<Option<StoredAnomaly>> {
        anomalies::get(&self.reader, id).await
    }

    async fn series_samples(
        &self,
        name: &str,
        matchers: &[(String, String)],
        range: TimeRange,
    ) -> Result<Vec<SeriesSamples>> {
        samples::series_range(&self.reader, name, matchers, range).await
    }

    async fn series_buckets(
        &self,
        name: &str,
        matchers: &[(String, String)],
        range: TimeRange,
        buckets: u32,
        reduce: Reduce,
    ) -> Result<Vec<SeriesSamples>> {
        samples::series_buckets(&self.reader, name, matchers, range, buckets, reduce).await
    }

    async fn upsert_read_rollups(&self, rollups: &[ReadRollup]) -> Result<()> {
        if rollups.is_empty() {
            return Ok(());
        }
        let mut transaction = self.writer.begin().await?;
        upsert_rollups(&mut transaction, rollups).await?;
        transaction.commit().await?;
        Ok(())
    }

    async fn upsert_findings(
        &self,
        anomalies: &[Anomaly],
        rollups: &[ReadRollup],
        seen_at: UnixNanos,
    ) -> Result<UpsertOutcome> {
        if anomalies.is_empty() && rollups.is_empty() {
            return Ok(UpsertOutcome::default());
        }
        let mut transaction = self.writer.begin().await?;
        let outcome = anomalies::upsert(&mut transaction, &seen_at_once(anomalies, seen_at)).await?;
        upsert_rollups(&mut transaction, rollups).await?;
        transaction.commit().await?;
        Ok(outcome)
    }

    async fn read_rollups(&self, range: TimeRange, limit: u32) -> Result<Vec<ReadRollup>> {
        let rows: Vec<RollupRow> = sqlx::query_as(
            "SELECT * FROM read_rollups WHERE minute_unix_nano >= ?1 AND minute_unix_nano < ?2
             ORDER BY minute_unix_nano, cluster, namespace, node_id LIMIT ?3",
        )
        .bind(range.from)
        .bind(range.to)
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await?;
        rows.into_iter().map(RollupRow::into_rollup).collect()
    }

    async fn anomaly_changes(&self, after: AlertCursor, limit: u32) -> Result<Vec<StoredAnomaly>> {
        let rows: Vec<AnomalyRow> = sqlx::query_as(
            "SELECT * FROM anomalies
             WHERE (last_seen_unix_nano, id) > (?1, ?2)
             ORDER BY last_seen_unix_nano, id LIMIT ?3",
        )
        .bind(after.last_seen_unix_nano)
        .bind(after.anomaly_id)
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await?;
        rows.into_iter().map(AnomalyRow::into_stored).collect()
    }

    async fn anomaly_change_keys(
        &self,
        after: AlertCursor,
        through: AlertCursor,
        limit: u32,
    ) -> Result<Vec<AlertCursor>> {
        // One text row (`last_seen id,...`) from the (last_seen, id) index: the window can hold
        // thousands of keys, and sqlx's SQLite driver costs microseconds a row.
        let (keys,): (Option<String>,) = sqlx::query_as(
            "SELECT group_concat(last_seen_unix_nano || ' ' || id, ',') FROM (
                 SELECT last_seen_unix_nano, id FROM anomalies
                 WHERE (last_seen_unix_nano, id) > (?1, ?2) AND (last_seen_unix_nano, id) <= (?3, ?4)
                 ORDER BY last_seen_unix_nano, id LIMIT ?5
             )",
        )
        .bind(after.last_seen_unix_nano)
        .bind(after.anomaly_id)
        .bind(through.last_seen_unix_nano)
        .bind(through.anomaly_id)
        .bind(i64::from(limit))
        .fetch_one(&self.reader)
        .await?;
        let keys = crate::rows::number_pairs(keys.as_deref().unwrap_or_default(), "anomaly change keys")?;
        Ok(keys
            .into_iter()
            .map(|(last_seen_unix_nano, anomaly_id)| AlertCursor { last_seen_unix_nano, anomaly_id })
            .collect())
    }

    async fn alert_state(&self, since: UnixNanos) -> Result<(Option<AlertCursor>, Vec<AlertIncident>)> {
        let cursor: Option<AlertCursor> =
            sqlx::query_as("SELECT last_seen_unix_nano, anomaly_id FROM alert_cursor WHERE id = 1")
                .fetch_optional(&self.reader)
                .await?;
        let incidents: Vec<AlertIncident> = sqlx::query_as(
            "SELECT * FROM alert_incidents WHERE firing = 1 OR last_sent_unix_nano >= ?1
                 ORDER BY receiver, incident",
        )
        .bind(since)
        .fetch_all(&self.reader)
        .await?;
        Ok((cursor, incidents))
    }

    async fn commit_alerts(
        &self,
        cursor: Option<AlertCursor>,
        incidents: &[AlertIncident],
        messages: &[NewAlertMessage],
    ) -> Result<()> {
        let mut transaction = self.writer.begin().await?;
        if let Some(cursor) = cursor {
            sqlx::query(
                "INSERT INTO alert_cursor (id, last_seen_unix_nano, anomaly_id) VALUES (1, ?1, ?2)
                 ON CONFLICT (id) DO UPDATE SET
                     last_seen_unix_nano = excluded.last_seen_unix_nano, anomaly_id = excluded.anomaly_id",
            )
            .bind(cursor.last_seen_unix_nano)
            .bind(cursor.anomaly_id)
            .execute(&mut *transaction)
            .await?;
        }
        for incident in incidents {
            sqlx::query(
                "INSERT INTO alert_incidents (receiver, incident, dedup_key, firing, alert, latest_anomaly_id,
                     members, last_member_unix_nano, last_sent_unix_nano)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
                 ON CONFLICT (receiver, incident) DO UPDATE SET
                     dedup_key = excluded.dedup_key, firing = excluded.firing, alert = excluded.alert,
                     latest_anomaly_id = excluded.latest_anomaly_id, members = excluded.members,
                     last_member_unix_nano = excluded.last_member_unix_nano,
                     last_sent_unix_nano = excluded.last_sent_unix_nano",
            )
            .bind(&incident.receiver)
            .bind(&incident.incident)
            .bind(&incident.dedup_key)
            .bind(incident.firing)
            .bind(&incident.alert)
            .bind(incident.latest_anomaly_id)
            .bind(incident.members)
            .bind(incident.last_member_unix_nano)
            .bind(incident.last_sent_unix_nano)
            .execute(&mut *transaction)
            .await?;
        }
        for message in messages {
            sqlx::query(
                "INSERT INTO alert_outbox (receiver, dedup_key, event, body, created_unix_nano, next_attempt_unix_nano)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?5)",
            )
            .bind(&message.receiver)
            .bind(&message.dedup_key)
            .bind(&message.event)
            .bind(&message.body)
            .bind(message.created_unix_nano)
            .execute(&mut *transaction)
            .await?;
        }
        transaction.commit().await?;
        Ok(())
    }

    async fn pending_alert_messages(&self, limit: u32) -> Result<Vec<AlertMessage>> {
        Ok(sqlx::query_as("SELECT * FROM alert_outbox WHERE state = 'pending' ORDER BY id LIMIT ?1")
            .bind(i64::from(limit))
            .fetch_all(&self.reader)
            .await?)
    }

    async fn alert_message_attempted(&self, id: i64, now: UnixNanos, outcome: &DeliveryOutcome) -> Result<()> {
        let (state, next, finished, error) = match outcome {
            DeliveryOutcome::Delivered => ("delivered", None, Some(now), None),
            DeliveryOutcome::Retry { next_attempt_unix_nano, error } => {
                ("pending", Some(*next_attempt_unix_nano), None, Some(error.as_str()))
            }
            DeliveryOutcome::Failed { error } => ("failed", None, Some(now), Some(error.as_str())),
        };
        sqlx::query(
            "UPDATE alert_outbox SET attempts = attempts + 1, state = ?2,
                 next_attempt_unix_nano = coalesce(?3, next_attempt_unix_nano),
                 finished_unix_nano = ?4, last_error = coalesce(?5, last_error)
             WHERE id = ?1",
        )
        .bind(id)
        .bind(state)
        .bind(next)
        .bind(finished)
        .bind(error)
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    async fn alert_messages(&self, before_id: Option<i64>, limit: u32) -> Result<Vec<AlertMessage>> {
        Ok(sqlx::query_as("SELECT * FROM alert_outbox WHERE id < ?1 ORDER BY id DESC LIMIT ?2")
            .bind(before_id.unwrap_or(i64::MAX))
            .bind(i64::from(limit))
            .fetch_all(&self.reader)
            .await?)
    }

    async fn logs(&self, range: TimeRange, limit: u32) -> Result<Vec<LogRecord>> {
        logs::range(&self.reader, range, limit).await
    }

    async fn recognised_logs(&self, cluster: Option<&str>, window: i64, limit: u32) -> Result<Vec<LogRecord>> {
        logs::recognised_for_cluster(&self.reader, cluster, window, limit).await
    }

    async fn enforce_retention(&self, cutoffs: &RetentionCutoffs) -> Result<RetentionReport> {
        retention::enforce(&self.writer, cutoffs).await
    }

    /// One writer commits at a time, so ids grow in commit order; retention keeps the newest.
    fn span_feed(&self) -> Option<&dyn SpanFeed> {
        Some(self)
    }

    async fn anomaly_counts(&self, filter: &AnomalyFilter) -> Result<Vec<AnomalyCount>> {
        Ok(crate::anomaly_query::counts(Dialect::Sqlite, filter).build_query_as().fetch_all(&self.reader).await?)
    }

    async fn scopes(&self) -> Result<Vec<Scope>> {
        Ok(sqlx::query_as(
            "SELECT DISTINCT cluster, namespace, node_id FROM series ORDER BY cluster, namespace, node_id",
        )
        .fetch_all(&self.reader)
        .await?)
    }

    async fn clients(&self, after: Option<&str>, limit: u32) -> Result<Vec<String>> {
        // A loose index scan over spans_by_client_time: each step seeks the next client id.
        let rows: Vec<(String,)> = sqlx::query_as(
            "WITH RECURSIVE next_client(id) AS ( \
               SELECT (SELECT min(client_id) FROM spans WHERE client_id > ?) \
               UNION ALL \
               SELECT (SELECT min(client_id) FROM spans WHERE client_id > next_client.id) \
               FROM next_client WHERE next_client.id IS NOT NULL) \
             SELECT id FROM next_client WHERE id IS NOT NULL LIMIT ?",
        )
        .bind(after.unwrap_or(""))
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }

    async fn latest_time(&self) -> Result<Option<UnixNanos>> {
        let (spans, samples): (Option<i64>, Option<i64>) = sqlx::query_as(
            "SELECT (SELECT max(start_unix_nano) FROM spans), (SELECT max(time_unix_nano) FROM samples)",
        )
        .fetch_one(&self.reader)
        .await?;
        Ok(spans.max(samples))
    }

    async fn cluster_latest_time(&self, cluster: Option<&str>) -> Result<Option<UnixNanos>> {
        let (latest,): (Option<i64>,) =
            crate::cluster_latest::query(cluster).build_query_as().fetch_one(&self.reader).await?;
        Ok(latest)
    }

    async fn stats(&self) -> Result<StoreStats> {
        let (spans, series, samples, logs, anomalies): (i64, i64, i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM spans), (SELECT count(*) FROM series), \
             (SELECT count(*) FROM samples), (SELECT count(*) FROM logs), (SELECT count(*) FROM anomalies)",
        )
        .fetch_one(&self.reader)
        .await?;
        Ok(StoreStats {
            spans: spans as u64,
            series: series as u64,
            samples: samples as u64,
            logs: logs as u64,
            anomalies: anomalies as u64,
        })
    }
}

#[async_trait]
impl SpanFeed for SqliteStore {
    async fn latest_span_id(&self) -> Result<i64> {
        spans::latest_id(&self.reader).await
    }

    async fn scope_spans_through(
        &self,
        cluster: Option<&str>,
        namespace: Option<&str>,
        through: i64,
        limit: u32,
    ) -> Result<Vec<Span>> {
        spans::for_scope(&self.reader, cluster, namespace, TimeRange::ALL, limit, through).await
    }

    async fn spans_between(&self, after: i64, through: i64, limit: u32) -> Result<Vec<(i64, Span)>> {
        spans::between(&self.reader, after, through, limit).await
    }

    async fn client_spans_through(&self, client_id: &str, through: i64, limit: u32) -> Result<Vec<(i64, Span)>> {
        spans::for_client_through(&self.reader, client_id, through, limit).await
    }

    async fn trace_spans_through(&self, trace_ids: &[&str], through: i64) -> Result<Vec<(i64, Span)>> {
        spans::of_traces_through(&self.reader, trace_ids, through).await
    }

    async fn scope_spans_between(
        &self,
        scopes: &[(Option<String>, Option<String>)],
        after: i64,
        through: i64,
        limit: u32,
    ) -> Result<Vec<Span>> {
        spans::of_scopes_between(&self.reader, scopes, after, through, limit).await
    }

    async fn recognised_logs_after(
        &self,
        cluster: Option<&str>,
        window: i64,
        after: i64,
        limit: u32,
    ) -> Result<(Vec<(i64, LogRecord)>, Option<i64>)> {
        logs::recognised_for_cluster_after(&self.reader, cluster, window, after, limit).await
    }

    async fn recognised_logs_after_each(
        &self,
        asked: &[(Option<&str>, i64)],
        window: i64,
        limit: u32,
    ) -> Result<Vec<crate::RecognisedRead>> {
        // One writer: every committed line is visible to each read, in id order.
        let mut answers = Vec::with_capacity(asked.len());
        for (cluster, after) in asked {
            answers.push(logs::recognised_for_cluster_after(&self.reader, *cluster, window, *after, limit).await?);
        }
        Ok(answers)
    }
}

/// Rows per multi-row INSERT: one statement per chunk instead of one per row (each statement
/// is a round trip to sqlx's SQLite worker thread), well under SQLite's 32 766 bound
/// parameters for the widest rows (spans, 42 columns).
const ROWS_PER_STATEMENT: usize = 200;

/// Inserts `rows`, [`ROWS_PER_STATEMENT`] to a statement: `head` (the INSERT and its columns),
/// each row's values as `bind` pushes them, then `conflict`. Returns how many rows were new.
pub(super) async fn insert_rows<T: Sync>(
    transaction: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    head: &str,
    conflict: &str,
    rows: &[T],
    mut bind: impl FnMut(sqlx::query_builder::Separated<'_, sqlx::Sqlite, &'static str>, &T) + Send,
) -> Result<u64> {
    let mut written = 0;
    for chunk in rows.chunks(ROWS_PER_STATEMENT) {
        let mut builder = sqlx::QueryBuilder::<sqlx::Sqlite>::new(head);
        builder.push_values(chunk, &mut bind);
        builder.push(conflict);
        written += builder.build().execute(&mut **transaction).await?.rows_affected();
    }
    Ok(written)
}

/// Each rollup replaces the stored one of its minute and scope.
async fn upsert_rollups(transaction: &mut sqlx::Transaction<'_, sqlx::Sqlite>, rollups: &[ReadRollup]) -> Result<()> {
    for rollup in rollups {
        let row = RollupRow::from_rollup(rollup);
        sqlx::query(
            "INSERT INTO read_rollups (minute_unix_nano, cluster, namespace, node_id, reads, compared,
                     behind_reads, behind_states, behind_millis, max_behind_states, max_behind_seconds)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
                 ON CONFLICT (minute_unix_nano, cluster, namespace, node_id) DO UPDATE SET
                     reads = excluded.reads, compared = excluded.compared, behind_reads = excluded.behind_reads,
                     behind_states = excluded.behind_states, behind_millis = excluded.behind_millis,
                     max_behind_states = excluded.max_behind_states,
                     max_behind_seconds = excluded.max_behind_seconds",
        )
        .bind(row.minute_unix_nano)
        .bind(row.cluster)
        .bind(row.namespace)
        .bind(row.node_id)
        .bind(row.reads)
        .bind(row.compared)
        .bind(row.behind_reads)
        .bind(row.behind_states)
        .bind(row.behind_millis)
        .bind(row.max_behind_states)
        .bind(row.max_behind_seconds)
        .execute(&mut **transaction)
        .await?;
    }
    Ok(())
}
