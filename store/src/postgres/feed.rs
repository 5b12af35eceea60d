//! Spans and log lines in commit order on PostgreSQL ([`crate::SpanFeed`]).
//!
//! SQLite hands out row ids in commit order (one writer). PostgreSQL does not: ids come from a
//! sequence as each ingest's COPY runs, two ingests run at once, and the one with the later ids
//! may commit first, so a reader that has seen id 10 may later find 9. The feed therefore
//! answers with a *settled* id instead of the newest one: an id below which nothing is still
//! being written, so that every row with an id up to it is committed (or never will be) and a
//! row committed later has a higher id, the promise [`crate::SpanFeed`] makes.
//!
//! How it is found, without making ingests wait for each other:
//! 1. every ingest transaction first takes, for each fed table it writes, a shared advisory
//!    lock ([`SPAN_INGEST_LOCK`], [`LOG_INGEST_LOCK`]) and its transaction id, in one
//!    statement, before it draws any id ([`mark_ingest`]): each feed waits only for the
//!    ingests that write its table (a batch of metric samples holds back neither);
//! 2. the reader reads the sequence's last id handed out, *then* lists the transaction ids of
//!    the ingests holding that lock: an ingest that drew an id up to that last one held the
//!    lock before the sequence was read, so it is either listed or already ended;
//! 3. the reader waits until none of the listed transactions is running (a transaction's id
//!    lock is released after its commit became visible), then answers that last id.
//!
//! Only ingests are waited for, never other sessions' transactions: a pass waits at most for
//! the ingests in flight when it asked (two at a time, each a COPY and a commit). An ingest
//! still running after [`SETTLE_WAIT`] makes the read fail ([`StoreError::Unsettled`]): the
//! live pass that asked fails and its marks stay for the next one, rather than the pass
//! reading less than its marks stand for.

use std::time::{Duration, Instant};

use sqlx::{PgConnection, PgPool};

use super::*;

use crate::{Result, StoreError};

/// The advisory lock an ingest transaction that writes spans holds shared: (`'lags'`, 1), two
/// int4 keys.
pub(super) const SPAN_INGEST_LOCK: (i32, i32) = (0x6c61_6773, 1);

/// The advisory lock an ingest transaction that writes log records holds shared: (`'lags'`, 2).
/// (Builds before it took [`SPAN_INGEST_LOCK`] in every ingest and waited on it for both feeds:
/// while builds of both kinds share a database during an upgrade, a feed read by one can miss a
/// row the other commits late, until that instance restarts.)
pub(super) const LOG_INGEST_LOCK: (i32, i32) = (0x6c61_6773, 2);

/// The longest a read waits for the ingests in flight when it asked.
const SETTLE_WAIT: Duration = Duration::from_secs(5);

/// How often a read looks again whether those ingests have ended.
const POLL: Duration = Duration::from_millis(2);

/// A table whose rows the feed hands out by id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fed {
    Spans,
    Logs,
}

/// Marks the transaction as an ingest the feeds wait for, before any row is written (and so
/// before any id is drawn): the lock of each fed table it writes and its transaction id. One
/// that writes neither spans nor log records takes nothing.
pub(super) async fn mark_ingest(connection: &mut PgConnection, spans: bool, logs: bool) -> Result<()> {
    let mut locks = Vec::new();
    if spans {
        locks.push(SPAN_INGEST_LOCK);
    }
    if logs {
        locks.push(LOG_INGEST_LOCK);
    }
    let statement = match locks.len() {
        0 => return Ok(()),
        1 => "SELECT pg_current_xact_id(), pg_advisory_xact_lock_shared($1, $2)",
        _ => "SELECT pg_current_xact_id(), pg_advisory_xact_lock_shared($1, $2), pg_advisory_xact_lock_shared($1, $3)",
    };
    let mut query = sqlx::query(statement).bind(locks[0].0);
    for lock in &locks {
        query = query.bind(lock.1);
    }
    query.execute(connection).await?;
    Ok(())
}

/// The highest id of `fed`'s table such that every row with an id up to it is committed, and a
/// row committed later has a higher one (see the module documentation).
pub(super) async fn settled(pool: &PgPool, fed: Fed) -> Result<i64> {
    // 1. The last id handed out (0: none yet), read before the ingests are listed.
    let sequence = match fed {
        Fed::Spans => "SELECT COALESCE(pg_sequence_last_value(pg_get_serial_sequence('spans', 'id')::regclass), 0)",
        Fed::Logs => "SELECT COALESCE(pg_sequence_last_value(pg_get_serial_sequence('logs', 'id')::regclass), 0)",
    };
    let (last,): (i64,) = sqlx::query_as(sequence).fetch_one(pool).await?;
    let lock = match fed {
        Fed::Spans => SPAN_INGEST_LOCK,
        Fed::Logs => LOG_INGEST_LOCK,
    };
    // 2. The ingests running now: any that drew an id up to `last` is among them or ended.
    let running: Vec<String> = sqlx::query_scalar(
        "SELECT held.transactionid::text FROM pg_locks AS ingest
             JOIN pg_locks AS held
               ON held.virtualtransaction = ingest.virtualtransaction AND held.locktype = 'transactionid'
                  AND held.granted
             WHERE ingest.locktype = 'advisory' AND ingest.granted
               AND ingest.database = (SELECT oid FROM pg_database WHERE datname = current_database())
               AND ingest.classid::bigint = $1 AND ingest.objid::bigint = $2 AND ingest.objsubid = 2",
    )
    .bind(i64::from(lock.0))
    .bind(i64::from(lock.1))
    .fetch_all(pool)
    .await?;
    // 3. Until they have ended (their commits visible to every read that follows).
    let started = Instant::now();
    let mut waiting = running;
    while !waiting.is_empty() {
        if started.elapsed() >= SETTLE_WAIT {
            return Err(StoreError::Unsettled { running: waiting.len(), waited: SETTLE_WAIT });
        }
        tokio::time::sleep(POLL).await;
        waiting = sqlx::query_scalar(
            "SELECT transactionid::text FROM pg_locks
                 WHERE locktype = 'transactionid' AND granted AND transactionid::text = ANY($1)",
        )
        .bind(&waiting)
        .fetch_all(pool)
        .await?;
    }
    Ok(last)
}

/// Reads by id range, bounded by what [`settled`] answered.
#[async_trait]
impl SpanFeed for PgStore {
    async fn latest_span_id(&self) -> Result<i64> {
        settled(&self.pool, Fed::Spans).await
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
        let rows = fetch_identified_span_rows(
            sqlx::query(
                "SELECT * FROM (
                 SELECT * FROM spans WHERE id > $1 AND id <= $2 ORDER BY id LIMIT $3
             ) AS gained ORDER BY start_unix_nano, id",
            )
            .bind(after)
            .bind(through)
            .bind(i64::from(limit)),
            &self.pool,
        )
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
        let rows = fetch_identified_span_rows(
            sqlx::query(
                "SELECT * FROM spans
             WHERE trace_id = ANY($1) AND trace_id IS NOT NULL AND span_id IS NOT NULL AND id <= $2
             ORDER BY start_unix_nano, id",
            )
            .bind(trace_ids)
            .bind(through),
            &self.pool,
        )
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
        let rows = fetch_span_rows(
            sqlx::query(
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
            .bind(i64::from(limit)),
            &self.pool,
        )
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
        let through = settled(&self.pool, Fed::Logs).await?;
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
            Some(cluster) => named.push((index, super::copy::text(cluster).into_owned(), *after)),
            None => answers[index] = store.recognised_logs_after(None, window, *after, limit).await?,
        }
    }
    if named.is_empty() {
        return Ok(answers);
    }
    let through = settled(&store.pool, Fed::Logs).await?;
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
