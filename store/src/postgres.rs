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

mod coordination;
mod copy;
mod feed;
mod partitions;

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use lagscope_model::conventions::{CLUSTER, NAMESPACE, NODE_ID};
use lagscope_model::{Anomaly, LogRecord, Op, Outcome, PointValue, ReadRollup, Sample, SeriesKey, Span, UnixNanos};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{PgConnection, Postgres, Transaction};

use self::copy::CopyRows;
use crate::anomaly_query::Dialect;
use crate::rows::{
    AnomalyRow, BucketRow, LogColumns, LogRow, LogRowWithId, RollupRow, SampleRow, ScopeSampleRow, SeriesRow, SpanRow,
    series_with_buckets, to_json_text,
};
use crate::{
    AlertCursor, AlertIncident, AlertMessage, AnomalyCount, AnomalyFilter, DeliveryOutcome, IngestBatch, IngestReceipt,
    NewAlertMessage, Reduce, Result, RetentionCutoffs, RetentionReport, Scope, SeriesSamples, SpanFeed, Store,
    StoreError, StoreStats, StoredAnomaly, TimeRange, UpsertOutcome, bucket_width,
};

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

/// A span row with its row id (the order ties in start time are broken by).
#[derive(sqlx::FromRow)]
struct IdentifiedSpanRow {
    id: i64,
    #[sqlx(flatten)]
    span: SpanRow,
}

impl IdentifiedSpanRow {
    /// Each row's span with its id, as the span feed hands them out.
    fn with_ids(rows: Vec<Self>) -> Result<Vec<(i64, Span)>> {
        rows.into_iter().map(|row| Ok((row.id, row.span.into_span()?))).collect()
    }
}

/// Two statements made of the same pieces: `$plain` joins them, `$bounded` puts `$bound` (an
/// id bound, `AND id <= $n`) between each two, for the span feed's reads ([`feed`]).
macro_rules! with_id_bound {
    ($(#[$doc:meta])* $plain:ident, $bounded:ident, $bound:literal, $first:literal $(, $rest:literal)* $(,)?) => {
        $(#[$doc])*
        const $plain: &str = concat!($first $(, $rest)*);
        const $bounded: &str = concat!($first $(, $bound, $rest)*);
    };
}

with_id_bound!(
    /// A scope's newest $5 spans starting in $3..$4 (cluster $1 and namespace $2, either may
    /// be NULL), oldest first (`_THROUGH`: among the rows with ids up to $6).
    SCOPE_NEWEST,
    SCOPE_NEWEST_THROUGH,
    " AND id <= $6",
    "SELECT * FROM (
         SELECT * FROM spans
         WHERE cluster IS NOT DISTINCT FROM $1 AND namespace IS NOT DISTINCT FROM $2
           AND start_unix_nano >= $3 AND start_unix_nano < $4",
    "
         ORDER BY start_unix_nano DESC LIMIT $5
     ) AS recent ORDER BY start_unix_nano, id",
);
with_id_bound!(
    /// A client's newest entries ($4 + 1 of them, and those sharing the last one's start) in
    /// $2..$3, from the (client, start) index alone ([`PgStore::client_rows`]); `_THROUGH`:
    /// among the rows with ids up to $5.
    CLIENT_ENTRIES,
    CLIENT_ENTRIES_THROUGH,
    " AND id <= $5",
    "SELECT start_unix_nano, end_unix_nano, trace_id FROM spans
     WHERE client_id = $1 AND start_unix_nano < $3",
    "
       AND start_unix_nano >= COALESCE(
           (SELECT start_unix_nano FROM spans
            WHERE client_id = $1 AND start_unix_nano >= $2 AND start_unix_nano < $3",
    "
            ORDER BY start_unix_nano DESC OFFSET $4 LIMIT 1),
           $2)",
);
with_id_bound!(
    /// The client's rows from $2 on, before $3 (`_THROUGH`: with ids up to $4).
    CLIENT_OWN,
    CLIENT_OWN_THROUGH,
    " AND id <= $4",
    "SELECT * FROM spans WHERE client_id = $1 AND start_unix_nano >= $2 AND start_unix_nano < $3",
    "",
);
with_id_bound!(
    /// The spans with both ids of the traces $1 starting in $2..=$3 (`_THROUGH`: with ids up
    /// to $4).
    TRACE_HOPS,
    TRACE_HOPS_THROUGH,
    " AND id <= $4",
    "SELECT * FROM spans WHERE trace_id = ANY($1) AND start_unix_nano >= $2 AND start_unix_nano <= $3
       AND trace_id IS NOT NULL AND span_id IS NOT NULL",
    "",
);

/// Reads by id range, bounded by what [`feed::settled`] answered.
#[async_trait]
impl SpanFeed for PgStore {
    async fn latest_span_id(&self) -> Result<i64> {
        feed::settled(&self.pool, feed::Fed::Spans).await
    }

    async fn scope_spans_through(
        &self,
        cluster: Option<&str>,
        namespace: Option<&str>,
        through: i64,
        limit: u32,
    ) -> Result<Vec<Span>> {
        self.scope_rows(cluster, namespace, TimeRange::ALL, limit, Some(through)).await
    }

    async fn spans_between(&self, after: i64, through: i64, limit: u32) -> Result<Vec<(i64, Span)>> {
        if after >= through {
            return Ok(Vec::new());
        }
        let rows: Vec<IdentifiedSpanRow> = sqlx::query_as(
            "SELECT * FROM (
                 SELECT * FROM spans WHERE id > $1 AND id <= $2 ORDER BY id LIMIT $3
             ) AS gained ORDER BY start_unix_nano, id",
        )
        .bind(after)
        .bind(through)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        IdentifiedSpanRow::with_ids(rows)
    }

    async fn client_spans_through(&self, client_id: &str, through: i64, limit: u32) -> Result<Vec<(i64, Span)>> {
        IdentifiedSpanRow::with_ids(self.client_rows(client_id, TimeRange::ALL, limit, Some(through)).await?)
    }

    async fn trace_spans_through(&self, trace_ids: &[&str], through: i64) -> Result<Vec<(i64, Span)>> {
        if trace_ids.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<IdentifiedSpanRow> = sqlx::query_as(
            "SELECT * FROM spans
             WHERE trace_id = ANY($1) AND trace_id IS NOT NULL AND span_id IS NOT NULL AND id <= $2
             ORDER BY start_unix_nano, id",
        )
        .bind(trace_ids)
        .bind(through)
        .fetch_all(&self.pool)
        .await?;
        IdentifiedSpanRow::with_ids(rows)
    }

    async fn scope_spans_between(
        &self,
        scopes: &[(Option<String>, Option<String>)],
        after: i64,
        through: i64,
        limit: u32,
    ) -> Result<Vec<Span>> {
        if scopes.is_empty() || after >= through {
            return Ok(Vec::new());
        }
        let (clusters, namespaces): (Vec<Option<&str>>, Vec<Option<&str>>) =
            scopes.iter().map(|(cluster, namespace)| (cluster.as_deref(), namespace.as_deref())).unzip();
        let rows: Vec<SpanRow> = sqlx::query_as(
            "SELECT * FROM (
                 SELECT * FROM spans
                 WHERE id > $1 AND id <= $2
                   AND EXISTS (
                       SELECT 1 FROM unnest($3::text[], $4::text[]) AS scope(cluster, namespace)
                       WHERE scope.cluster IS NOT DISTINCT FROM spans.cluster
                         AND scope.namespace IS NOT DISTINCT FROM spans.namespace
                   )
                 ORDER BY id LIMIT $5
             ) AS gained ORDER BY start_unix_nano, id",
        )
        .bind(after)
        .bind(through)
        .bind(clusters)
        .bind(namespaces)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(SpanRow::into_span).collect()
    }

    async fn recognised_logs_after(
        &self,
        cluster: Option<&str>,
        window: i64,
        after: i64,
        limit: u32,
    ) -> Result<(Vec<(i64, LogRecord)>, Option<i64>)> {
        let through = feed::settled(&self.pool, feed::Fed::Logs).await?;
        // The window's end and its rows from one snapshot.
        let mut transaction = self.pool.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ").execute(&mut *transaction).await?;
        let (latest,): (Option<i64>,) =
            sqlx::query_as("SELECT max(time_unix_nano) FROM logs WHERE cluster IS NOT DISTINCT FROM $1 AND id <= $2")
                .bind(cluster)
                .bind(through)
                .fetch_one(&mut *transaction)
                .await?;
        let Some(latest) = latest else { return Ok((Vec::new(), None)) };
        let rows: Vec<LogRowWithId> = sqlx::query_as(
            "SELECT * FROM (
                 SELECT * FROM logs
                 WHERE cluster IS NOT DISTINCT FROM $1 AND recognised
                   AND time_unix_nano >= $2 AND id > $3 AND id <= $5
                 ORDER BY time_unix_nano DESC, id DESC LIMIT $4
             ) AS recent ORDER BY time_unix_nano, id",
        )
        .bind(cluster)
        .bind(latest.saturating_sub(window))
        .bind(after)
        .bind(i64::from(limit))
        .bind(through)
        .fetch_all(&mut *transaction)
        .await?;
        transaction.commit().await?;
        let records = rows.into_iter().map(|row| Ok((row.id, row.row.into_record()?))).collect::<Result<_>>()?;
        Ok((records, Some(latest)))
    }

    async fn recognised_logs_after_each(
        &self,
        asked: &[(Option<&str>, i64)],
        window: i64,
        limit: u32,
    ) -> Result<Vec<crate::RecognisedRead>> {
        recognised_logs_after_each(self, asked, window, limit).await
    }
}

/// A recognised line read for one of several clusters asked at once: the cluster's place in
/// the question (from 1), and the line.
#[derive(sqlx::FromRow)]
struct AskedLogRow {
    asked: i64,
    #[sqlx(flatten)]
    line: LogRowWithId,
}

/// [`SpanFeed::recognised_logs_after_each`] on PostgreSQL, the named clusters in one
/// transaction: each one's latest time (a lateral read), then each one's new lines of its
/// window (the newest `limit`), all as of one settled id. A cluster is matched with `=`, which
/// the indexes on (cluster, time) serve; the lines of no cluster (`NULL`) are read on their own.
async fn recognised_logs_after_each(
    store: &PgStore,
    asked: &[(Option<&str>, i64)],
    window: i64,
    limit: u32,
) -> Result<Vec<crate::RecognisedRead>> {
    let mut answers: Vec<crate::RecognisedRead> = vec![(Vec::new(), None); asked.len()];
    let mut named: Vec<(usize, String, i64)> = Vec::new();
    for (index, (cluster, after)) in asked.iter().enumerate() {
        match cluster {
            Some(cluster) => named.push((index, copy::text(cluster).into_owned(), *after)),
            None => answers[index] = store.recognised_logs_after(None, window, *after, limit).await?,
        }
    }
    if named.is_empty() {
        return Ok(answers);
    }
    let through = feed::settled(&store.pool, feed::Fed::Logs).await?;
    let clusters: Vec<&str> = named.iter().map(|(_, cluster, _)| cluster.as_str()).collect();
    let afters: Vec<i64> = named.iter().map(|(.., after)| *after).collect();
    // The windows' ends and their rows from one snapshot.
    let mut transaction = store.pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ").execute(&mut *transaction).await?;
    let latest: Vec<(i64, Option<i64>)> = sqlx::query_as(
        "SELECT asked.n, latest.at
         FROM unnest($1::text[]) WITH ORDINALITY AS asked(cluster, n)
         CROSS JOIN LATERAL (
             SELECT max(time_unix_nano) AS at FROM logs WHERE logs.cluster = asked.cluster AND id <= $2
         ) AS latest",
    )
    .bind(&clusters)
    .bind(through)
    .fetch_all(&mut *transaction)
    .await?;
    let mut froms: Vec<Option<i64>> = vec![None; named.len()];
    for (n, at) in latest {
        if let Some(place) = usize::try_from(n - 1).ok().filter(|place| *place < named.len()) {
            froms[place] = at.map(|at| at.saturating_sub(window));
            answers[named[place].0].1 = at;
        }
    }
    let rows: Vec<AskedLogRow> = sqlx::query_as(
        "SELECT asked.n AS asked, recent.*
         FROM unnest($1::text[], $2::bigint[], $3::bigint[]) WITH ORDINALITY AS asked(cluster, after, from_time, n)
         CROSS JOIN LATERAL (
             SELECT * FROM logs
             WHERE logs.cluster = asked.cluster AND recognised
               AND time_unix_nano >= asked.from_time AND id > asked.after AND id <= $4
             ORDER BY time_unix_nano DESC, id DESC LIMIT $5
         ) AS recent
         ORDER BY asked.n, recent.time_unix_nano, recent.id",
    )
    .bind(&clusters)
    .bind(&afters)
    .bind(&froms)
    .bind(through)
    .bind(i64::from(limit))
    .fetch_all(&mut *transaction)
    .await?;
    transaction.commit().await?;
    for row in rows {
        if let Some((index, ..)) = usize::try_from(row.asked - 1).ok().and_then(|place| named.get(place)) {
            answers[*index].0.push((row.line.id, row.line.row.into_record()?));
        }
    }
    Ok(answers)
}

/// `query` with the id bound of a `_THROUGH` statement, when there is one.
fn bound<'q, O>(
    query: sqlx::query::QueryAs<'q, Postgres, O, sqlx::postgres::PgArguments>,
    through: Option<i64>,
) -> sqlx::query::QueryAs<'q, Postgres, O, sqlx::postgres::PgArguments> {
    match through {
        Some(through) => query.bind(through),
        None => query,
    }
}

/// A client's timeline reads its traces' spans in parts of about this many traces, each on
/// its own connection ...
const TRACES_PER_READ: usize = 12;
/// ... at most this many at once, beside the read of the client's own spans (the read pool
/// holds one connection more).
const MAX_PARALLEL_TRACE_READS: usize = 8;

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
    /// The series of a metric whose labels include every matcher (jsonb containment), in id
    /// order.
    async fn matching_series(&self, name: &str, matchers: &[(String, String)]) -> Result<Vec<SeriesRow>> {
        let matcher_object: BTreeMap<&str, &str> =
            matchers.iter().map(|(label, value)| (label.as_str(), value.as_str())).collect();
        Ok(sqlx::query_as(
            "SELECT id, name, labels, kind, unit, description FROM series
             WHERE name = $1 AND labels::jsonb @> $2::jsonb
             ORDER BY id",
        )
        .bind(name)
        .bind(to_json_text(&matcher_object))
        .fetch_all(&self.pool)
        .await?)
    }

    /// [`Store::scope_spans`], among the rows with ids up to `through` when given (the span
    /// feed's reads, [`feed`]).
    async fn scope_rows(
        &self,
        cluster: Option<&str>,
        namespace: Option<&str>,
        range: TimeRange,
        limit: u32,
        through: Option<i64>,
    ) -> Result<Vec<Span>> {
        let sql = if through.is_some() { SCOPE_NEWEST_THROUGH } else { SCOPE_NEWEST };
        let rows: Vec<SpanRow> =
            bound(scoped(sqlx::query_as(sql), cluster, namespace, range, limit), through).fetch_all(&self.pool).await?;
        rows.into_iter().map(SpanRow::into_span).collect()
    }

    /// [`Store::client_spans`]'s rows with their ids, among those with ids up to `through`
    /// when given (the span feed's reads, [`feed`]).
    async fn client_rows(
        &self,
        client_id: &str,
        range: TimeRange,
        limit: u32,
        through: Option<i64>,
    ) -> Result<Vec<IdentifiedSpanRow>> {
        // What a timeline costs once the table is larger than memory is random page reads
        // (BENCHMARKS.md, "A client's timeline from PostgreSQL"): a client's spans lie on as
        // many heap pages as it has spans, and its router and server hops (which name no
        // client) on as many more, behind one trace-index descent per trace. So:
        // 1. the client's newest `limit` entries (and those sharing the last one's start) from
        //    the (client, start) index alone, which carries each span's trace and end: an
        //    index-only scan of adjacent entries once vacuum has marked the pages visible, so
        //    the traces are known before any row is read, and the limit stays bounded
        //    however long the history;
        // 2. at the same time, the client's rows and its traces' spans near them in time, by
        //    bitmap scans (heap pages read in block order and prefetched), the traces split in
        //    time order over several connections so that their index descents, which are
        //    synchronous, wait side by side, each part in the partitions of its time only;
        // 3. the client's rows cut to the limit by (start, row id) through ties, and each
        //    trace's spans kept within its window around the rows kept.
        if limit == 0 {
            return Ok(Vec::new());
        }
        let limit = i64::from(limit);
        // Bounded by `through`, a read needs each row's id, which the index does not carry:
        // only the feed's reads pay for that.
        let (entries_sql, own_sql, traces_sql) = match through {
            None => (CLIENT_ENTRIES, CLIENT_OWN, TRACE_HOPS),
            Some(_) => (CLIENT_ENTRIES_THROUGH, CLIENT_OWN_THROUGH, TRACE_HOPS_THROUGH),
        };
        let entries: Vec<(i64, i64, Option<String>)> =
            bound(sqlx::query_as(entries_sql).bind(client_id).bind(range.from).bind(range.to).bind(limit - 1), through)
                .fetch_all(&self.pool)
                .await?;
        let Some(from) = entries.iter().map(|(start, _, _)| *start).min() else {
            return Ok(Vec::new());
        };
        let windows = trace_windows(entries.iter().map(|(start, end, trace)| (trace.as_deref(), *start, *end)));
        let own =
            bound(sqlx::query_as::<_, IdentifiedSpanRow>(own_sql).bind(client_id).bind(from).bind(range.to), through)
                .fetch_all(&self.reads);
        // Read in time order, a part's traces share a day or two: PostgreSQL prunes the
        // partitions outside the part's window instead of descending the trace index of every
        // day kept. Each part takes a connection only when it starts.
        let mut traces: Vec<(&str, (i64, i64))> = windows.iter().map(|(trace, window)| (*trace, *window)).collect();
        traces.sort_unstable_by_key(|(_, (earliest, _))| *earliest);
        let parts = traces.len().div_ceil(TRACES_PER_READ).clamp(1, MAX_PARALLEL_TRACE_READS);
        let chunk = traces.len().div_ceil(parts).max(1);
        let reads = traces.chunks(chunk).map(|part| {
            let ids: Vec<&str> = part.iter().map(|(trace, _)| *trace).collect();
            let earliest = part.iter().map(|(_, (earliest, _))| *earliest).min().unwrap_or(i64::MIN);
            let latest = part.iter().map(|(_, (_, latest))| *latest).max().unwrap_or(i64::MAX);
            bound(sqlx::query_as::<_, IdentifiedSpanRow>(traces_sql).bind(ids).bind(earliest).bind(latest), through)
                .fetch_all(&self.reads)
        });
        let (mut rows, parts) = futures::future::try_join(own, futures::future::try_join_all(reads)).await?;
        // Spans sharing the cut-off start: the newest `limit` by (start, row id).
        if rows.len() as i64 > limit {
            rows.sort_unstable_by_key(|row| std::cmp::Reverse((row.span.start_unix_nano, row.id)));
            rows.truncate(limit as usize);
        }
        // Each trace's window around the client's rows kept: a trace's spans belong to the
        // timeline when they start within TRACE_WINDOW_NANOS of them.
        let kept = trace_windows(
            rows.iter().map(|row| (row.span.trace_id.as_deref(), row.span.start_unix_nano, row.span.end_unix_nano)),
        );
        let hops: Vec<IdentifiedSpanRow> = parts
            .into_iter()
            .flatten()
            .filter(|hop| {
                hop.span
                    .trace_id
                    .as_deref()
                    .and_then(|trace| kept.get(trace))
                    .is_some_and(|(earliest, latest)| (*earliest..=*latest).contains(&hop.span.start_unix_nano))
            })
            .collect();
        rows.extend(hops);
        // The client's own spans come back with their traces: each stored row once, in
        // (start, row id) order.
        rows.sort_unstable_by_key(|row| (row.span.start_unix_nano, row.id));
        rows.dedup_by_key(|row| row.id);
        Ok(rows)
    }

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

    /// Samples of `cluster`'s series naming the namespace or none (`Namespaces::Every`: the
    /// series of the given names in every namespace), from `window` before the latest on.
    async fn samples_of_scope(
        &self,
        cluster: Option<&str>,
        namespaces: crate::Namespaces<'_>,
        window: i64,
        from: i64,
    ) -> Result<Vec<(i64, Sample)>> {
        let (namespace, names) = namespaces.binds();
        // One row per series, its samples as arrays: each row naming its series again had its
        // labels parsed again for every sample (the live analyzer reads every busy scope's
        // window on each pass). The latest sample series by series, through the primary key
        // (as the SQLite store, where a max over the join read the whole table for a scope
        // without samples).
        let rows: Vec<ScopeSeriesRow> = sqlx::query_as(
            "WITH scope AS (
                 SELECT id, name, labels, kind, unit, description FROM series
                 WHERE cluster IS NOT DISTINCT FROM $1
                   AND CASE WHEN $4::text IS NULL
                            THEN namespace IS NOT DISTINCT FROM $2 OR namespace IS NULL
                            ELSE name IN (SELECT jsonb_array_elements_text($4::jsonb)) END
             ),
             latest AS (
                 SELECT max((SELECT max(time_unix_nano) FROM samples WHERE series_id = scope.id)) AS at FROM scope
             )
             SELECT scope.id, scope.name, scope.labels, scope.kind, scope.unit, scope.description,
                    array_agg(samples.time_unix_nano ORDER BY samples.time_unix_nano) AS times,
                    array_agg(samples.start_time_unix_nano ORDER BY samples.time_unix_nano) AS starts,
                    array_agg(samples.value ORDER BY samples.time_unix_nano) AS numbers,
                    array_agg(samples.distribution ORDER BY samples.time_unix_nano) AS distributions
             FROM samples JOIN scope ON scope.id = samples.series_id, latest
             WHERE samples.time_unix_nano >= GREATEST(latest.at - $3, $5)
             GROUP BY scope.id, scope.name, scope.labels, scope.kind, scope.unit, scope.description
             ORDER BY scope.id",
        )
        .bind(cluster)
        .bind(namespace)
        .bind(window)
        .bind(names)
        .bind(from)
        .fetch_all(&self.pool)
        .await?;
        let mut samples = Vec::new();
        for row in rows {
            let (key, meta) =
                crate::rows::series_identity(row.name, &row.labels, &row.kind, row.unit, row.description)?;
            let points = row.times.into_iter().zip(row.starts).zip(row.numbers).zip(row.distributions);
            for (((time_unix_nano, start_time_unix_nano), number), distribution) in points {
                let sample = Sample {
                    series: key.clone(),
                    meta: meta.clone(),
                    time_unix_nano,
                    start_time_unix_nano,
                    value: crate::rows::point_value(number, distribution.as_deref())?,
                };
                samples.push((row.id, sample));
            }
        }
        // Each series in time order, the series in id order: a stable sort by time orders the
        // samples of one time by series.
        samples.sort_by_key(|(_, sample)| sample.time_unix_nano);
        Ok(samples)
    }
}

/// A series of a scope with its samples of the window, as arrays in time order.
#[derive(sqlx::FromRow)]
struct ScopeSeriesRow {
    id: i64,
    name: String,
    labels: String,
    kind: String,
    unit: Option<String>,
    description: Option<String>,
    times: Vec<i64>,
    starts: Vec<Option<i64>>,
    numbers: Vec<Option<f64>>,
    distributions: Vec<Option<String>>,
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

/// Each trace's window from a client's spans in it, `(trace, start, end)`: from
/// [`crate::TRACE_WINDOW_NANOS`] before the earliest start to as long after the latest end.
fn trace_windows<'a>(spans: impl Iterator<Item = (Option<&'a str>, i64, i64)>) -> BTreeMap<&'a str, (i64, i64)> {
    let mut windows: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
    for (trace, start, end) in spans {
        if let Some(trace) = trace {
            let window = windows.entry(trace).or_insert((i64::MAX, i64::MIN));
            window.0 = window.0.min(start.saturating_sub(crate::TRACE_WINDOW_NANOS));
            window.1 = window.1.max(end.saturating_add(crate::TRACE_WINDOW_NANOS));
        }
    }
    windows
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
        let rows: Vec<SpanRow> = scoped(
            sqlx::query_as(
                "SELECT * FROM spans
             WHERE ($1::text IS NULL OR cluster = $1) AND ($2::text IS NULL OR namespace = $2)
               AND start_unix_nano >= $3 AND start_unix_nano < $4
             ORDER BY start_unix_nano, id LIMIT $5",
            ),
            cluster,
            namespace,
            range,
            limit,
        )
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(SpanRow::into_span).collect()
    }

    async fn samples_in_range(
        &self,
        cluster: Option<&str>,
        namespace: Option<&str>,
        range: TimeRange,
        limit: u32,
    ) -> Result<Vec<Sample>> {
        let rows: Vec<ScopeSampleRow> = scoped(
            sqlx::query_as(
                "SELECT series.name, series.labels, series.kind, series.unit, series.description,
                    samples.time_unix_nano, samples.start_time_unix_nano, samples.value, samples.distribution
             FROM samples JOIN series ON series.id = samples.series_id
             WHERE ($1::text IS NULL OR series.cluster = $1)
               AND ($2::text IS NULL OR series.namespace = $2 OR series.namespace IS NULL)
               AND samples.time_unix_nano >= $3 AND samples.time_unix_nano < $4
             ORDER BY samples.time_unix_nano, samples.series_id LIMIT $5",
            ),
            cluster,
            namespace,
            range,
            limit,
        )
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(ScopeSampleRow::into_sample).collect()
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
        // Rows are locked in fingerprint order, so instances upserting the same anomalies
        // around a lease hand-over never deadlock.
        let mut ordered: Vec<&Anomaly> = anomalies.iter().collect();
        ordered.sort_by(|left, right| left.fingerprint.cmp(&right.fingerprint));
        let mut transaction = self.pool.begin().await?;
        lock_subjects(&mut transaction, &ordered).await?;
        let mut outcome = UpsertOutcome::default();
        for anomaly in ordered {
            // `first_seen = last_seen` only on the row's first insert: that tells new from known.
            // Found again exactly as stored, the row is not written and returns nothing.
            let returned: Option<(i64, i64, i64)> = sqlx::query_as(
                "INSERT INTO anomalies (fingerprint, kind, severity, cluster, namespace, client_id,
                     node_id, start_unix_nano, end_unix_nano, summary, cause, evidence,
                     first_seen_unix_nano, last_seen_unix_nano, open)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $13, $14)
                 ON CONFLICT (fingerprint) DO UPDATE SET
                     severity = excluded.severity,
                     node_id = excluded.node_id,
                     start_unix_nano = least(anomalies.start_unix_nano, excluded.start_unix_nano),
                     end_unix_nano = greatest(anomalies.end_unix_nano, excluded.end_unix_nano),
                     summary = excluded.summary,
                     cause = excluded.cause,
                     evidence = excluded.evidence,
                     open = excluded.open,
                     last_seen_unix_nano = greatest(anomalies.last_seen_unix_nano + 1, excluded.last_seen_unix_nano)
                 WHERE (anomalies.severity IS DISTINCT FROM excluded.severity
                    OR anomalies.node_id IS DISTINCT FROM excluded.node_id
                    OR excluded.start_unix_nano < anomalies.start_unix_nano
                    OR excluded.end_unix_nano > anomalies.end_unix_nano
                    OR anomalies.summary IS DISTINCT FROM excluded.summary
                    OR anomalies.cause IS DISTINCT FROM excluded.cause
                    OR anomalies.open IS DISTINCT FROM excluded.open
                    OR anomalies.evidence IS DISTINCT FROM excluded.evidence)
                   AND anomalies.superseded_by IS NULL
                 RETURNING id, first_seen_unix_nano, last_seen_unix_nano",
            )
            .bind(&anomaly.fingerprint)
            .bind(anomaly.kind.as_str())
            .bind(anomaly.severity.as_str())
            .bind(&anomaly.cluster)
            .bind(&anomaly.namespace)
            .bind(&anomaly.client_id)
            .bind(&anomaly.node_id)
            .bind(anomaly.start_unix_nano)
            .bind(anomaly.end_unix_nano)
            .bind(copy::text(&anomaly.summary))
            .bind(copy::text(&anomaly.cause))
            .bind(copy::text(anomaly.evidence.as_json()))
            .bind(seen_at)
            .bind(anomaly.open)
            .fetch_optional(&mut *transaction)
            .await?;
            match returned {
                Some((id, first_seen, last_seen)) if first_seen == last_seen => {
                    let superseded = supersede(&mut transaction, anomaly, id, seen_at).await?;
                    outcome.superseded += superseded.len() as u64;
                    if !superseded.contains(&id) {
                        outcome.inserted.push(id);
                    }
                }
                Some(_) => outcome.updated += 1,
                None => outcome.unchanged += 1,
            }
        }
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

/// Binds the scope and range parameters `$1`..`$5` of a range read: cluster, namespace, from,
/// to, limit.
fn scoped<'q, O>(
    query: sqlx::query::QueryAs<'q, Postgres, O, sqlx::postgres::PgArguments>,
    cluster: Option<&'q str>,
    namespace: Option<&'q str>,
    range: TimeRange,
    limit: u32,
) -> sqlx::query::QueryAs<'q, Postgres, O, sqlx::postgres::PgArguments> {
    query.bind(cluster).bind(namespace).bind(range.from).bind(range.to).bind(i64::from(limit))
}

/// Streams the spans into their partitions; returns how many were new (a span sent again takes
/// the staging path of [`copy_skipping_repeats`]).
async fn insert_spans(transaction: &mut Transaction<'_, Postgres>, spans: &[Span]) -> Result<u64> {
    if spans.is_empty() {
        return Ok(0);
    }
    let mut rows = CopyRows::default();
    for span in spans {
        let resource = &span.resource;
        let call = &span.call;
        rows.opt_text(span.trace_id.as_deref())
            .opt_text(span.span_id.as_deref())
            .opt_text(span.parent_span_id.as_deref())
            .text(&span.name)
            .int(i64::from(span.kind.to_otlp()))
            .int(span.start_unix_nano)
            .int(span.end_unix_nano)
            .int(i64::from(span.status_code))
            .opt_text(span.status_message.as_deref())
            .opt_text(resource.service_name.as_deref())
            .opt_text(resource.system.as_deref())
            .opt_text(resource.cluster.as_deref())
            .opt_text(resource.component.as_ref().map(lagscope_model::Component::as_str))
            .opt_text(resource.node_id.as_deref())
            .text(&to_json_text(&resource.attributes))
            .opt_text(span.scope_name.as_deref())
            .opt_text(span.scope_version.as_deref())
            .text(&to_json_text(&span.scope_attributes))
            .opt_text(call.client_id.as_deref())
            .opt_text(call.call_id.as_deref())
            .opt_int(call.attempt)
            .opt_text(call.namespace.as_deref())
            .opt_text(call.op.as_ref().map(Op::as_str))
            .opt_text(call.rpc_method.as_deref())
            .opt_text(call.target_node.as_deref())
            .opt_text(call.target_role.as_deref())
            .opt_text(call.node_role.as_deref())
            .opt_text(call.consistency.as_deref())
            .opt_bool(call.follower_read)
            .opt_int(call.state.carried)
            .opt_int(call.state.returned)
            .opt_int(call.state.served)
            .opt_int(call.state.committed)
            .opt_int(call.state.router)
            .opt_text(call.outcome.as_ref().map(Outcome::as_str))
            .opt_text(call.error_type.as_deref())
            .opt_int(call.requeues)
            .opt_int(call.retry_delay_ms)
            .opt_int(call.bytes)
            .text(&to_json_text(&span.attributes))
            .text(&to_json_text(&span.events))
            .text(&to_json_text(&span.links))
            .end_row();
    }
    copy_skipping_repeats(transaction, &rows, "spans", SPAN_COLUMNS, SPANS_UNIQUE).await
}

/// The unique index a span sent again breaks (its ids and start, the partition key).
const SPANS_UNIQUE: &str = "(trace_id, span_id, start_unix_nano) WHERE trace_id IS NOT NULL AND span_id IS NOT NULL";
/// The unique index a log record sent again breaks (its time and identity, see `LogColumns`).
const LOGS_UNIQUE: &str = "(time_unix_nano, identity)";

/// Gives each log row stored before log records had an identity (migration 0008) the one its
/// insert would give it now, and removes the rows that turn out to be copies of another (a
/// record sent again, which the store kept twice then), as SQLite's `identify_old_rows`.
/// Instances connecting at once take turns batch by batch (a transaction-scoped advisory lock);
/// a batch that meets a copy an ingest stored meanwhile (a unique violation) is run again, and
/// then finds it. Returns (rows identified, copies removed).
async fn identify_old_logs(pool: &PgPool) -> Result<(u64, u64)> {
    let (mut identified, mut removed, mut batches) = (0_u64, 0_u64, 0_u64);
    let mut conflicts = 0;
    loop {
        match identify_old_logs_batch(pool).await {
            Ok(None) => return Ok((identified, removed)),
            Ok(Some((batch_identified, batch_removed))) => {
                identified += batch_identified;
                removed += batch_removed;
                batches += 1;
                if batches.is_multiple_of(100) {
                    tracing::info!(identified, removed, "identifying log records stored before migration 0008");
                }
            }
            Err(StoreError::Query(sqlx::Error::Database(error)))
                if error.code().as_deref() == Some("23505") && conflicts < 10 =>
            {
                conflicts += 1;
            }
            Err(error) => return Err(error),
        }
    }
}

/// One batch of [`identify_old_logs`] in one transaction: what it identified and removed, or
/// `None` when no row was left.
async fn identify_old_logs_batch(pool: &PgPool) -> Result<Option<(u64, u64)>> {
    /// The advisory lock's key: "lagscope logs identity" in eight bytes.
    const LOCK: i64 = 0x6c67_7363_6c6f_6769;
    let mut transaction = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(LOCK).execute(&mut *transaction).await?;
    let rows: Vec<LogRowWithId> = sqlx::query_as("SELECT * FROM logs WHERE identity IS NULL ORDER BY id LIMIT 1000")
        .fetch_all(&mut *transaction)
        .await?;
    if rows.is_empty() {
        return Ok(None);
    }
    let (mut identified, mut removed) = (0, 0);
    for row in &rows {
        let (identity, time) = (row.identity(), row.row.time_unix_nano);
        // In id order, so that of several copies the first stored keeps its row.
        let updated = sqlx::query(
            "UPDATE logs SET identity = $1 WHERE id = $2 AND time_unix_nano = $3 AND NOT EXISTS
                 (SELECT 1 FROM logs WHERE time_unix_nano = $3 AND identity = $1)",
        )
        .bind(identity)
        .bind(row.id)
        .bind(time)
        .execute(&mut *transaction)
        .await?;
        if updated.rows_affected() == 1 {
            identified += 1;
        } else {
            sqlx::query("DELETE FROM logs WHERE id = $1 AND time_unix_nano = $2")
                .bind(row.id)
                .bind(time)
                .execute(&mut *transaction)
                .await?;
            removed += 1;
        }
    }
    transaction.commit().await?;
    Ok(Some((identified, removed)))
}

/// Streams `rows` into `table`'s partitions; returns how many were new. The common case: none
/// of the rows is stored yet, and they go straight in. A retried export (or a batch repeating a
/// row) breaks the table's unique index `unique`: the savepoint is rolled back and the rows take
/// a staging table and `INSERT ... ON CONFLICT DO NOTHING`, which skips what is already
/// stored. `table`, `columns` and `unique` are program text, never telemetry.
async fn copy_skipping_repeats(
    transaction: &mut Transaction<'_, Postgres>,
    rows: &CopyRows,
    table: &'static str,
    columns: &'static str,
    unique: &'static str,
) -> Result<u64> {
    let connection: &mut PgConnection = transaction;
    sqlx::query("SAVEPOINT copy_rows").execute(&mut *connection).await?;
    match rows.send(connection, &format!("COPY {table} ({columns}) FROM STDIN")).await {
        Ok(written) => {
            sqlx::query("RELEASE SAVEPOINT copy_rows").execute(&mut *connection).await?;
            return Ok(written);
        }
        Err(StoreError::Query(sqlx::Error::Database(error))) if error.code().as_deref() == Some("23505") => {
            sqlx::query("ROLLBACK TO SAVEPOINT copy_rows").execute(&mut *connection).await?;
        }
        Err(error) => return Err(error),
    }
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TEMP TABLE IF NOT EXISTS {table}_staging ON COMMIT DELETE ROWS AS \
         SELECT {columns} FROM {table} WITH NO DATA"
    )))
    .execute(&mut *connection)
    .await?;
    rows.send(connection, &format!("COPY {table}_staging ({columns}) FROM STDIN")).await?;
    let result = sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {table} ({columns}) SELECT {columns} FROM {table}_staging ON CONFLICT {unique} DO NOTHING"
    )))
    .execute(&mut *connection)
    .await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("TRUNCATE {table}_staging"))).execute(&mut *connection).await?;
    Ok(result.rows_affected())
}

/// Creates the batch's series on first sight, then streams the samples (the last one of a
/// series and time wins, as a re-sent sample replaces the stored one).
async fn insert_samples(transaction: &mut Transaction<'_, Postgres>, samples: &[Sample]) -> Result<u64> {
    if samples.is_empty() {
        return Ok(0);
    }
    let connection: &mut PgConnection = transaction;
    // Each series once, in key order: an upsert locks the series row, and ingests committing
    // at once (`concurrent_ingests`) must take shared rows in one order or deadlock. A series'
    // metadata comes from its first sample in the batch.
    let mut first_of_series: BTreeMap<&SeriesKey, &Sample> = BTreeMap::new();
    for sample in samples {
        first_of_series.entry(&sample.series).or_insert(sample);
    }
    let mut series_ids: BTreeMap<&SeriesKey, i64> = BTreeMap::new();
    for (series, sample) in first_of_series {
        let (id,): (i64,) = sqlx::query_as(
            "INSERT INTO series (name, labels, kind, unit, description, cluster, namespace, node_id)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (name, labels) DO UPDATE SET
                 kind = excluded.kind,
                 unit = coalesce(excluded.unit, series.unit),
                 description = coalesce(excluded.description, series.description)
             RETURNING id",
        )
        .bind(copy::text(&series.name))
        .bind(copy::text(&to_json_text(&series.labels)))
        .bind(sample.meta.kind.as_str())
        .bind(sample.meta.unit.as_deref().map(copy::text))
        .bind(sample.meta.description.as_deref().map(copy::text))
        .bind(series.label(CLUSTER).map(copy::text))
        .bind(series.label(NAMESPACE).map(copy::text))
        .bind(series.label(NODE_ID).map(copy::text))
        .fetch_one(&mut *connection)
        .await?;
        series_ids.insert(series, id);
    }
    let mut latest: BTreeMap<(i64, i64), &Sample> = BTreeMap::new();
    for sample in samples {
        let series_id = series_ids.get(&*sample.series).copied().expect("every series was upserted above");
        latest.insert((series_id, sample.time_unix_nano), sample);
    }
    sqlx::query(
        "CREATE TEMP TABLE IF NOT EXISTS samples_staging ON COMMIT DELETE ROWS AS \
         SELECT series_id, time_unix_nano, start_time_unix_nano, value, distribution FROM samples WITH NO DATA",
    )
    .execute(&mut *connection)
    .await?;
    let mut rows = CopyRows::default();
    for ((series_id, time), sample) in &latest {
        let (value, distribution) = match &sample.value {
            PointValue::Number(number) => (Some(*number).filter(|number| number.is_finite()), None),
            PointValue::Distribution(point) => (None, Some(to_json_text(point))),
        };
        rows.int(*series_id)
            .int(*time)
            .opt_int(sample.start_time_unix_nano)
            .opt_float(value)
            .opt_text(distribution.as_deref())
            .end_row();
    }
    rows.send(
        connection,
        "COPY samples_staging (series_id, time_unix_nano, start_time_unix_nano, value, distribution) FROM STDIN",
    )
    .await?;
    let result = sqlx::query(
        "INSERT INTO samples (series_id, time_unix_nano, start_time_unix_nano, value, distribution)
         SELECT series_id, time_unix_nano, start_time_unix_nano, value, distribution FROM samples_staging
         ORDER BY series_id, time_unix_nano
         ON CONFLICT (series_id, time_unix_nano) DO UPDATE SET
             start_time_unix_nano = excluded.start_time_unix_nano,
             value = excluded.value,
             distribution = excluded.distribution",
    )
    .execute(&mut *connection)
    .await?;
    sqlx::query("TRUNCATE samples_staging").execute(&mut *connection).await?;
    Ok(result.rows_affected())
}

/// Streams the log records into their partitions; returns how many were new (a record
/// identical to a stored one is that record sent again, see `LogColumns`).
async fn insert_logs(transaction: &mut Transaction<'_, Postgres>, logs: &[LogRecord]) -> Result<u64> {
    if logs.is_empty() {
        return Ok(0);
    }
    let mut rows = CopyRows::default();
    for record in logs {
        let resource = &record.resource;
        let columns = LogColumns::of(record);
        rows.int(record.time_unix_nano)
            .opt_int(record.observed_time_unix_nano)
            .int(i64::from(record.severity_number))
            .opt_text(record.severity_text.as_deref())
            .text(&columns.body)
            .opt_text(record.event_name.as_deref())
            .opt_text(record.trace_id.as_deref())
            .opt_text(record.span_id.as_deref())
            .opt_text(resource.service_name.as_deref())
            .opt_text(resource.system.as_deref())
            .opt_text(resource.cluster.as_deref())
            .opt_text(resource.component.as_ref().map(lagscope_model::Component::as_str))
            .opt_text(resource.node_id.as_deref())
            .text(&columns.resource_attributes)
            .opt_text(record.scope_name.as_deref())
            .opt_text(record.scope_version.as_deref())
            .text(&columns.attributes)
            .int(columns.identity)
            .end_row();
    }
    copy_skipping_repeats(transaction, &rows, "logs", LOG_COLUMNS, LOGS_UNIQUE).await
}

/// Takes the locks over the subjects of `anomalies` that may replace one another
/// (`crate::supersede::lock_key`), before any row is written, in key order: an instance
/// storing another version of one of these incidents waits for this transaction to commit
/// and then finds its row. Taken first and in one order, they cannot deadlock with one
/// another or with the row locks taken after them.
async fn lock_subjects(transaction: &mut Transaction<'_, Postgres>, anomalies: &[&Anomaly]) -> Result<()> {
    let mut keys: Vec<(i32, i32)> =
        anomalies.iter().filter_map(|anomaly| crate::supersede::lock_key(anomaly)).collect();
    if keys.is_empty() {
        return Ok(());
    }
    keys.sort_unstable();
    keys.dedup();
    let (classes, subjects): (Vec<i32>, Vec<i32>) = keys.into_iter().unzip();
    // A subquery's order holds for the locks taken over its rows (PostgreSQL's documentation
    // of advisory locks names this form as safe).
    sqlx::query(
        "SELECT count(pg_advisory_xact_lock(class, subject))
         FROM (SELECT class, subject FROM unnest($1::int4[], $2::int4[]) WITH ORDINALITY
               AS keys (class, subject, position) ORDER BY position) ordered",
    )
    .bind(&classes)
    .bind(&subjects)
    .execute(&mut **transaction)
    .await?;
    Ok(())
}

/// A new anomaly and the stored ones of the same incident (`crate::supersede`): all but the
/// one that starts first are closed and point at it, their `last_seen` moved on so that the
/// alerter sees them close. Returns the ids replaced.
async fn supersede(
    transaction: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    anomaly: &Anomaly,
    id: i64,
    seen_at: UnixNanos,
) -> Result<Vec<i64>> {
    if !crate::supersede::replaceable(anomaly.kind) {
        return Ok(Vec::new());
    }
    let candidates: Vec<crate::supersede::Candidate> =
        crate::supersede::candidates(crate::anomaly_query::Dialect::Postgres, anomaly, id)
            .build_query_as()
            .fetch_all(&mut **transaction)
            .await?;
    let Some((kept, replaced)) = crate::supersede::settle(anomaly, id, &candidates) else { return Ok(Vec::new()) };
    sqlx::query(
        "UPDATE anomalies SET superseded_by = $1, open = FALSE,
             last_seen_unix_nano = greatest(last_seen_unix_nano + 1, $2)
         WHERE id = ANY($3)",
    )
    .bind(kept)
    .bind(seen_at)
    .bind(&replaced)
    .execute(&mut **transaction)
    .await?;
    Ok(replaced)
}
