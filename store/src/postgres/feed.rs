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
