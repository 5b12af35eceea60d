//! Leases and analysis marks in PostgreSQL (schema: migrations/postgres/0002). Times are the
//! database's clock (`clock_timestamp()`), so instances on machines whose clocks disagree
//! still agree on who holds what.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::PgConnection;

use super::PgStore;
use crate::Result;
use crate::coordination::{ClusterStatus, Coordinator, InstanceStatus, Leases, Mark, PendingMark, SHARDS, process_key};

/// Writes marks (inside the caller's transaction when given one), a scope's with the oldest
/// time of its samples in `sample_times` ([`Mark::sample_times`]). Rows are written in key
/// order, so two transactions marking the same things lock them in the same order and never
/// deadlock; the seq of a mark written again is taken when its row is locked, so it is greater
/// than any seq an analyzer could have read before, and the mark keeps the older of its two
/// sample times (what it was read with may not have been analysed yet).
pub(super) async fn write_marks(
    connection: &mut PgConnection,
    marks: &BTreeSet<Mark>,
    sample_times: &BTreeMap<(Option<&str>, Option<&str>), i64>,
) -> Result<()> {
    if marks.is_empty() {
        return Ok(());
    }
    let mut kinds = Vec::with_capacity(marks.len());
    let mut keys = Vec::with_capacity(marks.len());
    let mut shards = Vec::with_capacity(marks.len());
    let mut samples_from: Vec<Option<i64>> = Vec::with_capacity(marks.len());
    for mark in marks {
        kinds.push(mark.kind());
        keys.push(super::copy::text(&mark.key()).into_owned());
        shards.push(mark.shard());
        samples_from.push(match mark {
            Mark::Scope(cluster, namespace) => sample_times.get(&(cluster.as_deref(), namespace.as_deref())).copied(),
            _ => None,
        });
    }
    sqlx::query(
        "INSERT INTO analysis_marks (kind, key, shard, seq, samples_from)
         SELECT kind, key, shard, nextval('analysis_marks_seq'), samples_from
         FROM unnest($1::smallint[], $2::text[], $3::integer[], $4::bigint[]) AS marked(kind, key, shard, samples_from)
         ORDER BY kind, key
         ON CONFLICT (kind, key) DO UPDATE SET
             seq = nextval('analysis_marks_seq'),
             samples_from = LEAST(analysis_marks.samples_from, excluded.samples_from)",
    )
    .bind(&kinds)
    .bind(&keys)
    .bind(&shards)
    .bind(&samples_from)
    .execute(connection)
    .await?;
    Ok(())
}

#[async_trait]
impl Coordinator for PgStore {
    async fn balance(&self, instance: &str, lease: Duration) -> Result<Leases> {
        let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
        let mut transaction = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO analysis_instances (instance, lease_ms, started_at, heartbeat_at)
             VALUES ($1, $2, clock_timestamp(), clock_timestamp())
             ON CONFLICT (instance) DO UPDATE SET heartbeat_at = clock_timestamp(), lease_ms = excluded.lease_ms",
        )
        .bind(instance)
        .bind(lease_ms)
        .execute(&mut *transaction)
        .await?;
        let (live,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM analysis_instances
             WHERE heartbeat_at + lease_ms * interval '1 millisecond' > clock_timestamp()",
        )
        .fetch_one(&mut *transaction)
        .await?;
        let live = live.max(1);
        // Only unexpired leases are renewed: an expired one may already be someone else's.
        let mut held: Vec<(i32,)> = sqlx::query_as(
            "UPDATE analysis_leases SET expires_at = clock_timestamp() + $2 * interval '1 millisecond'
             WHERE owner = $1 AND expires_at > clock_timestamp()
             RETURNING shard",
        )
        .bind(instance)
        .bind(lease_ms)
        .fetch_all(&mut *transaction)
        .await?;
        held.sort_unstable();
        let mut shards: Vec<i32> = held.into_iter().map(|(shard,)| shard).collect();
        let fair = usize::try_from((i64::from(SHARDS) + live - 1) / live).unwrap_or(0);
        let mut released = Vec::new();
        let mut claimed = Vec::new();
        if shards.len() > fair {
            released = shards.split_off(fair);
            sqlx::query(
                "UPDATE analysis_leases SET owner = NULL, expires_at = '-infinity'
                 WHERE owner = $1 AND shard = ANY($2)",
            )
            .bind(instance)
            .bind(&released)
            .execute(&mut *transaction)
            .await?;
        } else if shards.len() < fair {
            let rows: Vec<(i32,)> = sqlx::query_as(
                "UPDATE analysis_leases
                 SET owner = $1, expires_at = clock_timestamp() + $2 * interval '1 millisecond',
                     acquired_at = clock_timestamp(), generation = generation + 1
                 WHERE shard IN (
                     SELECT shard FROM analysis_leases WHERE expires_at <= clock_timestamp()
                     ORDER BY shard LIMIT $3 FOR UPDATE SKIP LOCKED
                 )
                 RETURNING shard",
            )
            .bind(instance)
            .bind(lease_ms)
            .bind(i64::try_from(fair - shards.len()).unwrap_or(0))
            .fetch_all(&mut *transaction)
            .await?;
            claimed = rows.into_iter().map(|(shard,)| shard).collect();
            claimed.sort_unstable();
            shards.extend(&claimed);
            shards.sort_unstable();
        }
        // Instances silent for an hour are forgotten (their leases expired long before).
        sqlx::query("DELETE FROM analysis_instances WHERE heartbeat_at < clock_timestamp() - interval '1 hour'")
            .execute(&mut *transaction)
            .await?;
        transaction.commit().await?;
        Ok(Leases { shards, claimed, released, live_instances: u32::try_from(live).unwrap_or(u32::MAX) })
    }

    async fn release(&self, instance: &str) -> Result<()> {
        let mut transaction = self.pool.begin().await?;
        sqlx::query("UPDATE analysis_leases SET owner = NULL, expires_at = '-infinity' WHERE owner = $1")
            .bind(instance)
            .execute(&mut *transaction)
            .await?;
        sqlx::query("DELETE FROM analysis_instances WHERE instance = $1")
            .bind(instance)
            .execute(&mut *transaction)
            .await?;
        transaction.commit().await?;
        Ok(())
    }

    async fn pending_marks(&self, shards: &[i32], limit: u32) -> Result<Vec<PendingMark>> {
        if shards.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<(i16, String, i64, Option<i64>)> = sqlx::query_as(
            "SELECT kind, key, seq, samples_from FROM analysis_marks WHERE shard = ANY($1) ORDER BY seq LIMIT $2",
        )
        .bind(shards)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|(kind, key, seq, samples_from)| {
                Ok(PendingMark { mark: Mark::from_stored(kind, key)?, seq, samples_from })
            })
            .collect()
    }

    async fn add_marks(&self, marks: &[Mark]) -> Result<()> {
        let marks: BTreeSet<Mark> = marks.iter().cloned().collect();
        let mut connection = self.pool.acquire().await?;
        write_marks(&mut connection, &marks, &BTreeMap::new()).await
    }

    async fn finish_marks(&self, marks: &[PendingMark]) -> Result<()> {
        if marks.is_empty() {
            return Ok(());
        }
        let kinds: Vec<i16> = marks.iter().map(|pending| pending.mark.kind()).collect();
        let keys: Vec<String> =
            marks.iter().map(|pending| super::copy::text(&pending.mark.key()).into_owned()).collect();
        let seqs: Vec<i64> = marks.iter().map(|pending| pending.seq).collect();
        // A mark an ingest transaction is writing again is locked by it: skipped, it stays
        // (its new seq makes it pending again), and this never waits on ingest.
        sqlx::query(
            "DELETE FROM analysis_marks WHERE (kind, key) IN (
                 SELECT marks.kind, marks.key
                 FROM analysis_marks AS marks
                 JOIN unnest($1::smallint[], $2::text[], $3::bigint[]) AS done(kind, key, seq)
                   ON marks.kind = done.kind AND marks.key = done.key AND marks.seq <= done.seq
                 FOR UPDATE OF marks SKIP LOCKED
             )",
        )
        .bind(&kinds)
        .bind(&keys)
        .bind(&seqs)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn note_process_clients(&self, seen: &[(Option<&str>, &str, &str)]) -> Result<()> {
        // Each pair once (a statement may not update a row twice), in key order (two instances
        // writing the same pairs lock them in the same order).
        let pairs: BTreeSet<(String, String)> = (seen.iter())
            .map(|(cluster, node, client)| (process_key(*cluster, node), super::copy::text(client).into_owned()))
            .collect();
        if pairs.is_empty() {
            return Ok(());
        }
        let (processes, clients): (Vec<String>, Vec<String>) = pairs.into_iter().unzip();
        sqlx::query(
            "INSERT INTO analysis_process_clients (process, client_id, seen_at)
             SELECT process, client_id, clock_timestamp()
             FROM unnest($1::text[], $2::text[]) AS seen(process, client_id)
             ORDER BY process, client_id
             ON CONFLICT (process, client_id) DO UPDATE SET seen_at = excluded.seen_at",
        )
        .bind(&processes)
        .bind(&clients)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn process_owners(
        &self,
        processes: &[(Option<&str>, &str)],
        window: Duration,
    ) -> Result<Vec<Option<String>>> {
        if processes.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<String> = processes.iter().map(|(cluster, node)| process_key(*cluster, node)).collect();
        let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT process, min(client_id) FROM analysis_process_clients
             WHERE process = ANY($1) AND seen_at > clock_timestamp() - $2 * interval '1 millisecond'
             GROUP BY process HAVING count(*) = 1",
        )
        .bind(&keys)
        .bind(window_ms)
        .fetch_all(&self.pool)
        .await?;
        let owners: std::collections::HashMap<String, String> = rows.into_iter().collect();
        Ok(keys.iter().map(|key| owners.get(key).cloned()).collect())
    }

    async fn forget_process_clients(&self, window: Duration) -> Result<()> {
        let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
        sqlx::query(
            "DELETE FROM analysis_process_clients WHERE seen_at <= clock_timestamp() - $1 * interval '1 millisecond'",
        )
        .bind(window_ms)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn status(&self) -> Result<ClusterStatus> {
        let instances: Vec<(String, i64, i64, bool, Vec<i32>)> = sqlx::query_as(
            "SELECT instances.instance,
                    (extract(epoch FROM clock_timestamp() - instances.heartbeat_at) * 1000)::bigint,
                    instances.lease_ms,
                    instances.heartbeat_at + instances.lease_ms * interval '1 millisecond' > clock_timestamp(),
                    coalesce(array_agg(leases.shard ORDER BY leases.shard)
                             FILTER (WHERE leases.shard IS NOT NULL), '{}')
             FROM analysis_instances AS instances
             LEFT JOIN analysis_leases AS leases
               ON leases.owner = instances.instance AND leases.expires_at > clock_timestamp()
             GROUP BY instances.instance, instances.heartbeat_at, instances.lease_ms
             ORDER BY instances.instance",
        )
        .fetch_all(&self.pool)
        .await?;
        let (unowned,): (Vec<i32>,) = sqlx::query_as(
            "SELECT coalesce(array_agg(shard ORDER BY shard), '{}') FROM analysis_leases
             WHERE owner IS NULL OR expires_at <= clock_timestamp()",
        )
        .fetch_one(&self.pool)
        .await?;
        let (pending,): (i64,) = sqlx::query_as("SELECT count(*) FROM analysis_marks").fetch_one(&self.pool).await?;
        Ok(ClusterStatus {
            shards: SHARDS,
            instances: instances
                .into_iter()
                .map(|(instance, heartbeat_age_ms, lease_ms, alive, shards)| InstanceStatus {
                    instance,
                    heartbeat_age_ms,
                    lease_ms,
                    alive,
                    shards,
                })
                .collect(),
            unowned_shards: unowned,
            pending_marks: u64::try_from(pending).unwrap_or(0),
        })
    }
}
