//! Anomaly rows, unique by fingerprint.

use lagscope_model::{Anomaly, UnixNanos};
use sqlx::{Sqlite, SqlitePool, Transaction};

use crate::anomaly_query::Dialect;
use crate::rows::{AnomalyRow, to_json_text};
use crate::supersede;
use crate::{AnomalyFilter, Result, StoredAnomaly, UpsertOutcome};

/// Upserts each anomaly as seen at its time, in their order.
pub(super) async fn upsert(
    transaction: &mut Transaction<'_, Sqlite>,
    anomalies: &[(&Anomaly, UnixNanos)],
) -> Result<UpsertOutcome> {
    let mut outcome = UpsertOutcome::default();
    for &(anomaly, seen_at) in anomalies {
        // `first_seen = last_seen` only on the row's first insert: that tells new from known.
        // Found again exactly as stored (every pass over a client's recent spans finds its
        // anomalies of the last minutes again), the row is not written and returns nothing.
        let returned: Option<(i64, i64, i64)> = sqlx::query_as(
            "INSERT INTO anomalies (fingerprint, kind, severity, cluster, namespace, client_id,
                 node_id, start_unix_nano, end_unix_nano, summary, cause, evidence,
                 first_seen_unix_nano, last_seen_unix_nano, open)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
             ON CONFLICT (fingerprint) DO UPDATE SET
                 severity = excluded.severity,
                 node_id = excluded.node_id,
                 start_unix_nano = min(anomalies.start_unix_nano, excluded.start_unix_nano),
                 end_unix_nano = max(anomalies.end_unix_nano, excluded.end_unix_nano),
                 summary = excluded.summary,
                 cause = excluded.cause,
                 evidence = excluded.evidence,
                 open = excluded.open,
                 last_seen_unix_nano = max(anomalies.last_seen_unix_nano + 1, excluded.last_seen_unix_nano)
             WHERE (anomalies.severity IS NOT excluded.severity
                OR anomalies.node_id IS NOT excluded.node_id
                OR excluded.start_unix_nano < anomalies.start_unix_nano
                OR excluded.end_unix_nano > anomalies.end_unix_nano
                OR anomalies.summary IS NOT excluded.summary
                OR anomalies.cause IS NOT excluded.cause
                OR anomalies.open IS NOT excluded.open
                OR anomalies.evidence IS NOT excluded.evidence)
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
        .bind(&anomaly.summary)
        .bind(&anomaly.cause)
        .bind(to_json_text(&anomaly.evidence))
        .bind(seen_at)
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

/// A new anomaly and the stored ones of the same incident (`crate::supersede`): all but the
/// one that starts first are closed and point at it, their `last_seen` moved on so that the
/// alerter sees them close. Returns the ids replaced.
async fn supersede(
    transaction: &mut Transaction<'_, Sqlite>,
    anomaly: &Anomaly,
    id: i64,
    seen_at: UnixNanos,
) -> Result<Vec<i64>> {
    if !supersede::replaceable(anomaly.kind) {
        return Ok(Vec::new());
    }
    let candidates: Vec<supersede::Candidate> =
        supersede::candidates(Dialect::Sqlite, anomaly, id).build_query_as().fetch_all(&mut **transaction).await?;
    let Some((kept, replaced)) = supersede::settle(anomaly, id, &candidates) else { return Ok(Vec::new()) };
    for old in &replaced {
        sqlx::query(
            "UPDATE anomalies SET superseded_by = ?1, open = 0,
                 last_seen_unix_nano = max(last_seen_unix_nano + 1, ?2)
             WHERE id = ?3",
        )
        .bind(kept)
        .bind(seen_at)
        .bind(old)
        .execute(&mut **transaction)
        .await?;
    }
    Ok(replaced)
}

pub(super) async fn list(pool: &SqlitePool, filter: &AnomalyFilter) -> Result<Vec<StoredAnomaly>> {
    let rows: Vec<AnomalyRow> =
        crate::anomaly_query::list(Dialect::Sqlite, filter).build_query_as().fetch_all(pool).await?;
    rows.into_iter().map(AnomalyRow::into_stored).collect()
}

pub(super) async fn get(pool: &SqlitePool, id: i64) -> Result<Option<StoredAnomaly>> {
    let row: Option<AnomalyRow> =
        sqlx::query_as("SELECT * FROM anomalies WHERE id = ?1").bind(id).fetch_optional(pool).await?;
    row.map(AnomalyRow::into_stored).transpose()
}
