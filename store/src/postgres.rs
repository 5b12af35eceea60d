//! The production backend: PostgreSQL, through a connection pool.
//!
//! Spans, samples and logs live in tables partitioned by time (daily ranges, created ahead of
//! time by [`partitions`]; anything outside them lands in each table's DEFAULT partition).
//! Ingest streams rows with `COPY ... FROM STDIN`: spans and logs straight into their
//! partitions under a savepoint (a repeated span or log record makes its batch go through a
//! staging table and `INSERT ... ON CONFLICT DO NOTHING` instead), samples through staging (a
//! re-sent sample replaces the stored one), all in one transaction: a batch is committed whole
//! or not at all, and durable when `ingest` returns (the server's default
//! `synchronous_commit = on`). Every value is bound or sent as COPY data, never spliced into
//! SQL; the only generated SQL text is partition DDL made from integers and statements put
//! together from the program's own table and column names.

mod anomalies;
mod coordination;
mod copy;
mod feed;
mod ingest;
mod partitions;
mod reads;

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use lagscope_model::conventions::{CLUSTER, NAMESPACE, NODE_ID};
use lagscope_model::{Anomaly, LogRecord, Op, Outcome, PointValue, ReadRollup, Sample, SeriesKey, Span, UnixNanos};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{PgConnection, Postgres, Transaction};

use self::copy::CopyRows;
use self::ingest::{identify_old_logs, insert_logs, insert_samples, insert_spans};
use self::reads::{IdentifiedSpanRow, MAX_PARALLEL_TRACE_READS, fetch_identified_span_rows, fetch_span_rows, scoped};
use crate::anomaly_query::Dialect;
use crate::rows::{
    AnomalyRow, BucketRow, LogColumns, LogRow, LogRowWithId, RangeSampleRow, RollupRow, SampleRow, SeriesRow, SpanRow,
    samples_of_series, series_with_buckets, to_json_text,
};
use crate::{
    AlertCursor, AlertIncident, AlertMessage, AnomalyCount, AnomalyFilter, DeliveryOutcome, IngestBatch, IngestReceipt,
    NewAlertMessage, Reduce, Result, RetentionCutoffs, RetentionReport, Scope, SeriesSamples, SpanFeed, Store,
    StoreError, StoreStats, StoredAnomaly, TimeRange, UpsertOutcome, bucket_width,
};
use crate::{seen_at_once, seen_each};

pub use self::partitions::{PARTITIONED_TABLES, day_partition_name};

static MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

/// Span columns in COPY order (every column but the generated id).
const SPAN_COLUMNS: &str = "trace_id, span_id, parent_span_id, name, kind, start_unix_nano, end_unix_nano, \
    status_code, status_message, service_name, system, cluster, component, node_id, resource_attributes, \
    scope_name, scope_version, scope_attributes, client_id, call_id, attempt, namespace, op, rpc_method, \
    target_node, target_role, node_role, consistency, follower_read, state_carried, state_returned, \
    state_served, state_committed, state_router, outcome, error_type, requeues, retry_delay_ms, bytes, \
    attributes, events, links";

const LOG_COLUMNS: &str = "time_unix_nano, observed_time_unix_nano, severity_number, severity_text, body, \
    event_name, trace_id, span_id, service_name, system, cluster, component, node_id, resource_attributes, \
    scope_name, scope_version, attributes, identity";

/// The session of a read-pool connection: bitmap scans rather than plain index scans, with the
/// heap pages prefetched (`effective_io_concurrency`), so that a read of scattered rows waits
/// for its pages together rather than one after another. A server built without
/// posix_fadvise refuses any read-ahead but 0: the scans then run without it rather than
/// failing.
const PREFETCHING_BITMAP_SCANS: &str = "DO $$ BEGIN
         PERFORM set_config('enable_indexscan', 'off', false);
         BEGIN
             PERFORM set_config('effective_io_concurrency', '64', false);
         EXCEPTION WHEN others THEN NULL;
         END;
     END $$";

/// Ingest transactions in flight at once (see `Store::concurrent_ingests`).
const INGEST_TRANSACTIONS: usize = 2;

#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    /// Connections for the scattered reads of a client's timeline (their sessions set up
    /// with [`PREFETCHING_BITMAP_SCANS`]), apart from ingest's.
    reads: PgPool,
    partitions: std::sync::Arc<partitions::Partitions>,
}

impl PgStore {
    /// Connects to `url` (`postgres://user@host:port/database`), applies the migrations
    /// (under PostgreSQL's advisory lock, so instances starting together apply them once) and
    /// creates the partitions around today.
    pub async fn connect(url: &str) -> Result<Self> {
        let redacted = redact(url);
        let open_error = |source| StoreError::Open { path: redacted.clone(), source };
        let options: PgConnectOptions = url.parse().map_err(open_error)?;
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options.clone())
            .await
            .map_err(open_error)?;
        MIGRATIONS.run(&pool).await?;
        let (identified, removed) = identify_old_logs(&pool).await?;
        if identified + removed > 0 {
            tracing::info!(
                identified,
                removed,
                "log records stored before migration 0008 now have their identity; copies of one removed"
            );
        }
        let reads = PgPoolOptions::new()
            .max_connections(u32::try_from(MAX_PARALLEL_TRACE_READS + 1).unwrap_or(u32::MAX))
            .acquire_timeout(Duration::from_secs(10))
            .after_connect(|connection, _| {
                Box::pin(async move {
                    sqlx::query(PREFETCHING_BITMAP_SCANS).execute(connection).await?;
                    Ok(())
                })
            })
            .connect_lazy_with(options);
        let store = Self { pool, reads, partitions: Default::default() };
        store.partitions.ensure_around_now(&store.pool).await?;
        Ok(store)
    }

    /// The schema migrations and which of them the database at `url` has, without changing it.
    pub async fn migration_status(url: &str) -> Result<Vec<crate::MigrationState>> {
        let redacted = redact(url);
        let open_error = |source| StoreError::Open { path: redacted.clone(), source };
        let options: PgConnectOptions = url.parse().map_err(open_error)?;
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await
            .map_err(open_error)?;
        let applied: Result<Vec<(i64, bool, Vec<u8>)>> = async {
            let (exists,): (bool,) =
                sqlx::query_as("SELECT to_regclass('_sqlx_migrations') IS NOT NULL").fetch_one(&pool).await?;
            if !exists {
                return Ok(Vec::new());
            }
            Ok(sqlx::query_as("SELECT version, success, checksum FROM _sqlx_migrations").fetch_all(&pool).await?)
        }
        .await;
        pool.close().await;
        Ok(crate::migration_states(&MIGRATIONS, &applied?))
    }

    /// The pool (for tests and operations commands).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub async fn close(&self) {
        self.reads.close().await;
        self.pool.close().await;
    }
}

/// The URL without its password, for messages.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => match rest[..at].split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***{}", &rest[at..]),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

#[async_trait]
impl Store for PgStore {
    async fn ingest(&self, batch: &IngestBatch) -> Result<IngestReceipt> {
        if batch.is_empty() {
            return Ok(IngestReceipt::default());
        }
        let times = batch
            .spans
            .iter()
            .map(|span| span.start_unix_nano)
            .chain(batch.samples.iter().map(|sample| sample.time_unix_nano))
            .chain(batch.logs.iter().map(|record| record.time_unix_nano));
        self.partitions.ensure_for(&self.pool, times).await;
        let mut transaction = self.pool.begin().await?;
        // Before any id is drawn: the feeds of the tables it writes wait for it ([`feed`]).
        feed::mark_ingest(&mut transaction, !batch.spans.is_empty(), !batch.logs.is_empty()).await?;
        let spans_written = insert_spans(&mut transaction, &batch.spans).await?;
        let samples_written = insert_samples(&mut transaction, &batch.samples).await?;
        let logs_written = insert_logs(&mut transaction, &batch.logs).await?;
        // What the batch asks the live analyzer to look at, committed with it: whichever
        // instance holds the marks' shards analyses them, even if this one dies now.
        let marks = crate::Mark::of_batch(&batch.spans, &batch.samples, &batch.logs);
        let sample_times = crate::Mark::sample_times(&batch.samples);
        coordination::write_marks(&mut transaction, &marks, &sample_times).await?;
        transaction.commit().await?;
        Ok(IngestReceipt { spans_written, samples_written, logs_written })
    }

    async fn client_spans(&self, client_id: &str, range: TimeRange, limit: u32) -> Result<Vec<Span>> {
        let rows = self.client_rows(client_id, range, limit, None).await?;
        rows.into_iter().map(|row| row.span.into_span()).collect()
    }

    async fn scope_spans(
        &self,
        cluster: Option<&str>,
        namespace: Option<&str>,
        range: TimeRange,
        limit: u32,
    ) -> Result<Vec<Span>> {
        self.scope_rows(cluster, namespace, range, limit, None).await
    }

    async fn scope_samples_from(
        &self,
        cluster: Option<&str>,
        namespace: Option<&str>,
        window: i64,
        from: i64,
    ) -> Result<Vec<(i64, Sample)>> {
        self.samples_of_scope(cluster, crate::Namespaces::One(namespace), window, from).await
    }

    async fn cluster_samples(&self, cluster: Option<&str>, names: &[&str], window: i64) -> Result<Vec<Sample>> {
        let samples = self.samples_of_scope(cluster, crate::Namespaces::Every(names), window, i64::MIN).await?;
        Ok(samples.into_iter().map(|(_, sample)| sample).collect())
    }

    async fn spans_in_range(
        &self,
        cluster: Option<&str>,
        namespace: Option<&str>,
        range: TimeRange,
        limit: u32,
    ) -> Result<Vec<Span>> {
        let rows = fetch_span_rows(
            scoped(
                sqlx::query(
                    "SELECT * FROM spans
             WHERE ($1::text IS NULL OR cluster = $1) AND ($2::text IS NULL OR namespace = $2)
               AND start_unix_nano >= $3 AND start_unix_nano < $4
             ORDER BY start_unix_nano, id LIMIT $5",
                ),
                cluster,
                namespace,
                range,
                limit,
            ),
            &self.pool,
        )
        .await?;
        rows.into_iter().map(SpanRow::into_span).collect()
    }

    async fn named_samples_in_range(&self, names: &[&str], range: TimeRange, limit: u32) -> Result<Vec<Sample>> {
        let mut transaction = snapshot(&self.pool).await?;
        let rows: Vec<RangeSampleRow> = sqlx::query_as(concat!(
            range_samples_select!(),
            "WHERE series.name = ANY($1)
               AND samples.time_unix_nano >= $2 AND samples.time_unix_nano < $3
             ORDER BY samples.time_unix_nano, samples.series_id LIMIT $4"
        ))
        .bind(names)
        .bind(range.from)
        .bind(range.to)
        .bind(i64::from(limit))
        .fetch_all(&mut *transaction)
        .await?;
        with_their_series(transaction, rows).await
    }

    async fn committed_on_spans(&self, range: TimeRange, limit: u32) -> Result<Vec<crate::CommittedOnSpan>> {
        Ok(sqlx::query_as(
            "SELECT cluster, namespace, end_unix_nano, state_committed FROM spans
             WHERE start_unix_nano >= $1 AND start_unix_nano < $2 AND state_committed IS NOT NULL
             ORDER BY start_unix_nano, id LIMIT $3",
        )
        .bind(range.from)
        .bind(range.to)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?)
    }

    async fn samples_in_range(
        &self,
        cluster: Option<&str>,
        namespace: Option<&str>,
        range: TimeRange,
        limit: u32,
    ) -> Result<Vec<Sample>> {
        let mut transaction = snapshot(&self.pool).await?;
        let rows: Vec<RangeSampleRow> = scoped(
            sqlx::query_as(concat!(
                range_samples_select!(),
                "WHERE ($1::text IS NULL OR series.cluster = $1)
               AND ($2::text IS NULL OR series.namespace = $2 OR series.namespace IS NULL)
               AND samples.time_unix_nano >= $3 AND samples.time_unix_nano < $4
             ORDER BY samples.time_unix_nano, samples.series_id LIMIT $5"
            )),
            cluster,
            namespace,
            range,
            limit,
        )
        .fetch_all(&mut *transaction)
        .await?;
        with_their_series(transaction, rows).await
    }

    async fn clients_of_traces(&self, trace_ids: &[String]) -> Result<Vec<String>> {
        if trace_ids.is_empty() {
            return Ok(Vec::new());
        }
        let clients: Vec<(String,)> = sqlx::query_as(
            "SELECT DISTINCT client_id FROM spans
             WHERE trace_id = ANY($1) AND span_id IS NOT NULL AND client_id IS NOT NULL",
        )
        .bind(trace_ids)
        .fetch_all(&self.pool)
        .await?;
        Ok(clients.into_iter().map(|(client,)| client).collect())
    }

    async fn upsert_anomalies(&self, anomalies: &[Anomaly], seen_at: UnixNanos) -> Result<UpsertOutcome> {
        let mut transaction = self.pool.begin().await?;
        let outcome = anomalies::upsert(&mut transaction, &seen_at_once(anomalies, seen_at)).await?;
        transaction.commit().await?;
        Ok(outcome)
    }

    async fn upsert_anomalies_seen_at(&self, anomalies: &[(Anomaly, UnixNanos)]) -> Result<UpsertOutcome> {
        let mut transaction = self.pool.begin().await?;
        let outcome = anomalies::upsert(&mut transaction, &seen_each(anomalies)).await?;
        transaction.commit().await?;
        Ok(outcome)
    }

    async fn anomalies(&self, filter: &AnomalyFilter) -> Result<Vec<StoredAnomaly>> {
        let rows: Vec<AnomalyRow> =
            crate::anomaly_query::list(Dialect::Postgres, filter).build_query_as().fetch_all(&self.pool).await?;
        rows.into_iter().map(AnomalyRow::into_stored).collect()
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
                .fetch_all(&self.pool)
                .await?;
            rows.into_iter().map(AnomalyRow::into_stored).collect()
        })
        .await
    }

    async fn anomaly(&self, id: i64) -> Result<Option<StoredAnomaly>> {
        let row: Option<AnomalyRow> =
            sqlx::query_as("SELECT * FROM anomalies WHERE id = $1").bind(id).fetch_optional(&self.pool).await?;
        row.map(AnomalyRow::into_stored).transpose()
    }

    async fn series_samples(
        &self,
        name: &str,
        matchers: &[(String, String)],
        range: TimeRange,
    ) -> Result<Vec<SeriesSamples>> {
        let series_rows = self.matching_series(name, matchers).await?;
        let mut result = Vec::with_capacity(series_rows.len());
        for row in series_rows {
            let samples: Vec<SampleRow> = sqlx::query_as(
                "SELECT time_unix_nano, value, distribution FROM samples
                 WHERE series_id = $1 AND time_unix_nano >= $2 AND time_unix_nano < $3
                 ORDER BY time_unix_nano",
            )
            .bind(row.id)
            .bind(range.from)
            .bind(range.to)
            .fetch_all(&self.pool)
            .await?;
            result.push(row.into_series(samples)?);
        }
        Ok(result)
    }

    async fn series_buckets(
        &self,
        name: &str,
        matchers: &[(String, String)],
        range: TimeRange,
        buckets: u32,
        reduce: Reduce,
    ) -> Result<Vec<SeriesSamples>> {
        let series_rows = self.matching_series(name, matchers).await?;
        let Some(width) = bucket_width(range, buckets) else {
            return series_with_buckets(series_rows, Vec::new());
        };
        let ids: Vec<i64> = series_rows.iter().map(|row| row.id).collect();
        let points: Vec<BucketRow> = match reduce {
            // A slice's last sample is one backward index probe per series and slice: the cost
            // is series times slices, however dense the samples are.
            Reduce::Last => {
                sqlx::query_as(
                    "SELECT ids.id AS series_id, last.time_unix_nano, last.value
                     FROM unnest($1::bigint[]) AS ids(id)
                     CROSS JOIN generate_series(0, ($3 - $2 - 1) / $4) AS slices(i)
                     CROSS JOIN LATERAL (
                         SELECT time_unix_nano, value FROM samples
                         WHERE series_id = ids.id
                           AND time_unix_nano >= $2 + slices.i * $4
                           AND time_unix_nano < least($2 + (slices.i + 1) * $4, $3)
                           AND value IS NOT NULL
                         ORDER BY time_unix_nano DESC LIMIT 1
                     ) AS last",
                )
                .bind(&ids)
                .bind(range.from)
                .bind(range.to)
                .bind(width)
                .fetch_all(&self.pool)
                .await?
            }
            Reduce::Min | Reduce::Max => {
                let value = if reduce == Reduce::Min { "min(value)" } else { "max(value)" };
                // `value` is one of the two fragments above: nothing of the caller reaches the text.
                sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "SELECT series_id, max(time_unix_nano) AS time_unix_nano, {value} AS value FROM samples
                     WHERE series_id = ANY($1) AND time_unix_nano >= $2 AND time_unix_nano < $3 AND value IS NOT NULL
                     GROUP BY series_id, (time_unix_nano - $2) / $4"
                )))
                .bind(&ids)
                .bind(range.from)
                .bind(range.to)
                .bind(width)
                .fetch_all(&self.pool)
                .await?
            }
        };
        series_with_buckets(series_rows, points)
    }

    async fn upsert_read_rollups(&self, rollups: &[ReadRollup]) -> Result<()> {
        if rollups.is_empty() {
            return Ok(());
        }
        let mut transaction = self.pool.begin().await?;
        for rollup in rollups {
            let row = RollupRow::from_rollup(rollup);
            sqlx::query(
                "INSERT INTO read_rollups (minute_unix_nano, cluster, namespace, node_id, reads, compared,
                     behind_reads, behind_states, behind_millis, max_behind_states, max_behind_seconds)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
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
            .execute(&mut *transaction)
            .await?;
        }
        transaction.commit().await?;
        Ok(())
    }

    async fn read_rollups(&self, range: TimeRange, limit: u32) -> Result<Vec<ReadRollup>> {
        let rows: Vec<RollupRow> = sqlx::query_as(
            "SELECT * FROM read_rollups WHERE minute_unix_nano >= $1 AND minute_unix_nano < $2
             ORDER BY minute_unix_nano, cluster, namespace, node_id LIMIT $3",
        )
        .bind(range.from)
        .bind(range.to)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(RollupRow::into_rollup).collect()
    }

    async fn anomaly_changes(&self, after: AlertCursor, limit: u32) -> Result<Vec<StoredAnomaly>> {
        let rows: Vec<AnomalyRow> = sqlx::query_as(
            "SELECT * FROM anomalies
             WHERE (last_seen_unix_nano, id) > ($1, $2)
             ORDER BY last_seen_unix_nano, id LIMIT $3",
        )
        .bind(after.last_seen_unix_nano)
        .bind(after.anomaly_id)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(AnomalyRow::into_stored).collect()
    }

    async fn anomaly_change_keys(
        &self,
        after: AlertCursor,
        through: AlertCursor,
        limit: u32,
    ) -> Result<Vec<AlertCursor>> {
        Ok(sqlx::query_as(
            "SELECT last_seen_unix_nano, id AS anomaly_id FROM anomalies
             WHERE (last_seen_unix_nano, id) > ($1, $2) AND (last_seen_unix_nano, id) <= ($3, $4)
             ORDER BY last_seen_unix_nano, id LIMIT $5",
        )
        .bind(after.last_seen_unix_nano)
        .bind(after.anomaly_id)
        .bind(through.last_seen_unix_nano)
        .bind(through.anomaly_id)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?)
    }

    async fn alert_state(&self, since: UnixNanos) -> Result<(Option<AlertCursor>, Vec<AlertIncident>)> {
        let cursor: Option<AlertCursor> =
            sqlx::query_as("SELECT last_seen_unix_nano, anomaly_id FROM alert_cursor WHERE id = 1")
                .fetch_optional(&self.pool)
                .await?;
        let incidents: Vec<AlertIncident> = sqlx::query_as(
            "SELECT * FROM alert_incidents WHERE firing = true OR last_sent_unix_nano >= $1
                 ORDER BY receiver, incident",
        )
        .bind(since)
        .fetch_all(&self.pool)
        .await?;
        Ok((cursor, incidents))
    }

    async fn commit_alerts(
        &self,
        cursor: Option<AlertCursor>,
        incidents: &[AlertIncident],
        messages: &[NewAlertMessage],
    ) -> Result<()> {
        let mut transaction = self.pool.begin().await?;
        if let Some(cursor) = cursor {
            sqlx::query(
                "INSERT INTO alert_cursor (id, last_seen_unix_nano, anomaly_id) VALUES (1, $1, $2)
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
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
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
                 VALUES ($1, $2, $3, $4, $5, $5)",
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
        Ok(sqlx::query_as("SELECT * FROM alert_outbox WHERE state = 'pending' ORDER BY id LIMIT $1")
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
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
            "UPDATE alert_outbox SET attempts = attempts + 1, state = $2,
                 next_attempt_unix_nano = coalesce($3, next_attempt_unix_nano),
                 finished_unix_nano = $4, last_error = coalesce($5, last_error)
             WHERE id = $1",
        )
        .bind(id)
        .bind(state)
        .bind(next)
        .bind(finished)
        .bind(error)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn alert_messages(&self, before_id: Option<i64>, limit: u32) -> Result<Vec<AlertMessage>> {
        Ok(sqlx::query_as("SELECT * FROM alert_outbox WHERE id < $1 ORDER BY id DESC LIMIT $2")
            .bind(before_id.unwrap_or(i64::MAX))
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?)
    }

    async fn logs(&self, range: TimeRange, limit: u32) -> Result<Vec<LogRecord>> {
        let rows: Vec<LogRow> = sqlx::query_as(
            "SELECT * FROM logs WHERE time_unix_nano >= $1 AND time_unix_nano < $2
             ORDER BY time_unix_nano, id LIMIT $3",
        )
        .bind(range.from)
        .bind(range.to)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(LogRow::into_record).collect()
    }

    async fn recognised_logs(&self, cluster: Option<&str>, window: i64, limit: u32) -> Result<Vec<LogRecord>> {
        let rows: Vec<LogRow> = sqlx::query_as(
            "SELECT * FROM (
                 SELECT * FROM logs
                 WHERE cluster IS NOT DISTINCT FROM $1 AND recognised
                   AND time_unix_nano >= (
                       SELECT max(time_unix_nano) FROM logs WHERE cluster IS NOT DISTINCT FROM $1
                   ) - $2
                 ORDER BY time_unix_nano DESC, id DESC LIMIT $3
             ) AS recent ORDER BY time_unix_nano, id",
        )
        .bind(cluster)
        .bind(window)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(LogRow::into_record).collect()
    }

    async fn enforce_retention(&self, cutoffs: &RetentionCutoffs) -> Result<RetentionReport> {
        let mut report = RetentionReport::default();
        let signals = [(0, cutoffs.spans), (1, cutoffs.samples), (2, cutoffs.logs)];
        for (index, cutoff) in signals {
            let Some(cutoff) = cutoff else { continue };
            let (table, key) = PARTITIONED_TABLES[index];
            let (deleted, dropped) = partitions::drop_before(&self.pool, &self.partitions, table, key, cutoff).await?;
            match index {
                0 => report.spans = deleted,
                1 => report.samples = deleted,
                _ => report.logs = deleted,
            }
            report.partitions_dropped.extend(dropped);
        }
        if let Some(cutoff) = cutoffs.anomalies {
            loop {
                let result = sqlx::query(
                    "DELETE FROM anomalies WHERE id IN (
                         SELECT id FROM anomalies WHERE NOT open AND end_unix_nano < $1 LIMIT $2)",
                )
                .bind(cutoff)
                .bind(crate::RETENTION_BATCH_ROWS)
                .execute(&self.pool)
                .await?;
                report.anomalies += result.rows_affected();
                if result.rows_affected() < crate::RETENTION_BATCH_ROWS as u64 {
                    break;
                }
            }
        }
        // Rollups summarise spans: they go with the spans' cut-off.
        if let Some(cutoff) = cutoffs.spans {
            let result = sqlx::query("DELETE FROM read_rollups WHERE minute_unix_nano < $1")
                .bind(cutoff)
                .execute(&self.pool)
                .await?;
            report.rollups = result.rows_affected();
        }
        // Alerts go with the anomalies' cut-off: finished messages, then resolved incidents.
        if let Some(cutoff) = cutoffs.anomalies {
            for statement in [
                "DELETE FROM alert_outbox WHERE state != 'pending' AND finished_unix_nano < $1",
                "DELETE FROM alert_incidents WHERE NOT firing AND last_sent_unix_nano < $1",
            ] {
                report.alerts += sqlx::query(statement).bind(cutoff).execute(&self.pool).await?.rows_affected();
            }
        }
        Ok(report)
    }

    fn coordinator(&self) -> Option<&dyn crate::Coordinator> {
        Some(self)
    }

    /// Ids settled rather than the newest ([`feed`]): PostgreSQL's commits do not follow them.
    fn span_feed(&self) -> Option<&dyn SpanFeed> {
        Some(self)
    }

    /// Two: one group's COPY runs while the previous one waits for its WAL flush. Shared rows
    /// (series, samples, analysis marks) are locked in key order by every ingest; spans are
    /// new rows, and a span two concurrent batches both repeat waits for the first to commit.
    fn concurrent_ingests(&self) -> usize {
        INGEST_TRANSACTIONS
    }

    async fn anomaly_counts(&self, filter: &AnomalyFilter) -> Result<Vec<AnomalyCount>> {
        Ok(crate::anomaly_query::counts(Dialect::Postgres, filter).build_query_as().fetch_all(&self.pool).await?)
    }

    async fn scopes(&self) -> Result<Vec<Scope>> {
        Ok(sqlx::query_as(
            "SELECT DISTINCT cluster, namespace, node_id FROM series ORDER BY cluster, namespace, node_id",
        )
        .fetch_all(&self.pool)
        .await?)
    }

    async fn clients(&self, after: Option<&str>, limit: u32) -> Result<Vec<String>> {
        // A loose index scan over spans_by_client_time_traces: each step seeks the next client id.
        let rows: Vec<(String,)> = sqlx::query_as(
            "WITH RECURSIVE next_client(id) AS ( \
               SELECT (SELECT min(client_id) FROM spans WHERE client_id > $1) \
               UNION ALL \
               SELECT (SELECT min(client_id) FROM spans WHERE client_id > next_client.id) \
               FROM next_client WHERE next_client.id IS NOT NULL) \
             SELECT id FROM next_client WHERE id IS NOT NULL LIMIT $2",
        )
        .bind(after.unwrap_or(""))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }

    async fn latest_time(&self) -> Result<Option<UnixNanos>> {
        let (spans, samples): (Option<i64>, Option<i64>) = sqlx::query_as(
            "SELECT (SELECT max(start_unix_nano) FROM spans), (SELECT max(time_unix_nano) FROM samples)",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(spans.max(samples))
    }

    async fn cluster_latest_time(&self, cluster: Option<&str>) -> Result<Option<UnixNanos>> {
        let (latest,): (Option<i64>,) =
            crate::cluster_latest::query(cluster).build_query_as().fetch_one(&self.pool).await?;
        Ok(latest)
    }

    async fn stats(&self) -> Result<StoreStats> {
        let (spans, series, samples, logs, anomalies): (i64, i64, i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM spans), (SELECT count(*) FROM series), \
             (SELECT count(*) FROM samples), (SELECT count(*) FROM logs), (SELECT count(*) FROM anomalies)",
        )
        .fetch_one(&self.pool)
        .await?;
        let count = |value: i64| u64::try_from(value).unwrap_or_default();
        Ok(StoreStats {
            spans: count(spans),
            series: count(series),
            samples: count(samples),
            logs: count(logs),
            anomalies: count(anomalies),
        })
    }
}

/// The columns of a [`RangeSampleRow`], of samples joined to their series (whose columns the
/// query may filter on, but does not read).
macro_rules! range_samples_select {
    () => {
        "SELECT samples.series_id, samples.time_unix_nano, samples.start_time_unix_nano, samples.value,
                samples.distribution
         FROM samples JOIN series ON series.id = samples.series_id "
    };
}
use range_samples_select;

/// A read-only transaction whose reads all see one snapshot: a range's samples and then their
/// series, which retention could otherwise remove in between.
async fn snapshot(pool: &PgPool) -> Result<Transaction<'static, Postgres>> {
    let mut transaction = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY").execute(&mut *transaction).await?;
    Ok(transaction)
}

/// The samples of `rows`, each with its series, the series read once each in `transaction`.
async fn with_their_series(
    mut transaction: Transaction<'static, Postgres>,
    rows: Vec<RangeSampleRow>,
) -> Result<Vec<Sample>> {
    let mut ids: Vec<i64> = rows.iter().map(|row| row.series_id).collect();
    ids.sort_unstable();
    ids.dedup();
    let series: Vec<SeriesRow> = if ids.is_empty() {
        Vec::new()
    } else {
        sqlx::query_as("SELECT id, name, labels, kind, unit, description FROM series WHERE id = ANY($1)")
            .bind(&ids)
            .fetch_all(&mut *transaction)
            .await?
    };
    transaction.commit().await?;
    samples_of_series(rows, series)
}
