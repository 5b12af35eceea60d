//! Storing anomalies: each upserted by fingerprint (a row found again exactly as stored is not
//! written), the stored versions of one incident superseded by the one that starts first, and
//! the incidents' subjects locked first so that instances upserting together cannot deadlock.

use super::*;

/// Upserts `anomalies` in `transaction`, the rows locked in fingerprint order (so instances
/// upserting the same anomalies around a lease hand-over never deadlock).
/// Upserts each anomaly as seen at its time, in fingerprint order (those of one fingerprint in
/// their order), each incident's lock taken first and in order: two transactions upserting
/// the same anomalies cannot each wait for the other.
pub(super) async fn upsert(
    transaction: &mut Transaction<'_, Postgres>,
    anomalies: &[(&Anomaly, UnixNanos)],
) -> Result<UpsertOutcome> {
    let mut ordered = anomalies.to_vec();
    ordered.sort_by(|(left, _), (right, _)| left.fingerprint.cmp(&right.fingerprint));
    lock_subjects(transaction, ordered.iter().map(|(anomaly, _)| *anomaly)).await?;
    let mut outcome = UpsertOutcome::default();
    for (anomaly, seen_at) in ordered {
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
        .fetch_optional(&mut **transaction)
        .await?;
        if let Some(id) = outcome.found(returned) {
            let superseded = supersede(transaction, anomaly, id, seen_at).await?;
            outcome.inserted(id, &superseded);
        }
    }
    Ok(outcome)
}

/// Takes the locks over the subjects of `anomalies` that may replace one another
/// (`crate::supersede::lock_key`), before any row is written, in key order: an instance
/// storing another version of one of these incidents waits for this transaction to commit
/// and then finds its row. Taken first and in one order, they cannot deadlock with one
/// another or with the row locks taken after them.
async fn lock_subjects<'a>(
    transaction: &mut Transaction<'_, Postgres>,
    anomalies: impl Iterator<Item = &'a Anomaly>,
) -> Result<()> {
    let mut keys: Vec<(i32, i32)> = anomalies.filter_map(crate::supersede::lock_key).collect();
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
