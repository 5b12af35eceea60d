//! Which stored anomaly a newly stored one replaces, or is replaced by.
//!
//! A window, or a run of attempts (`pinned_retry`), is named (fingerprinted) by where it
//! starts. When the telemetry of its first seconds arrives later than the rest, a live pass
//! sees it start later and stores it, and a later pass finds it whole, under another name. Two
//! such anomalies are one incident: the same kind and subject (cluster, namespace, client,
//! node, and the shard role or call they are about), windows that overlap. Detectors never
//! report two overlapping windows of one subject, so the one that starts first (the whole)
//! is kept and the others point at it (`superseded_by`): closed, no longer listed, and seen
//! by the alerter as closing. (A client's `failover_flapping` is such a window: found from the
//! addresses its calls went to, then from the switch lines it logged, which came later and
//! start at the first switch itself, it is one incident.) Anomalies of a call's attempt (`stale_read`,
//! `carried_state_regression`, `router_state_dropped`) are named by that attempt, never
//! partial so: two of them may overlap and both stand.

use lagscope_model::{Anomaly, AnomalyKind, UnixNanos};
use sqlx::{Database, Encode, QueryBuilder, Type};

use crate::anomaly_query::Dialect;

/// Whether anomalies of `kind` may replace one another.
pub(crate) fn replaceable(kind: AnomalyKind) -> bool {
    kind.is_window() || kind == AnomalyKind::PinnedRetry
}

/// What, beyond the columns, tells two anomalies of one kind apart as subjects: the shard role
/// (`shard_pressure`, `unfair_rejection`), the call (`pinned_retry`), the probed address
/// (`blind_failover_probe`), read from the evidence.
fn subject(evidence: &serde_json::Value) -> [Option<&serde_json::Value>; 3] {
    ["role", "call_id", "address"].map(|key| evidence.get(key))
}

/// Whether `left` and `right` are one incident, the later start to be replaced by the earlier:
/// of a replaceable kind, the same columns and subject, their windows overlapping (what the
/// store's [`candidates`] query and [`settle`] find together, for anomalies in hand).
pub fn same_incident(left: &Anomaly, right: &Anomaly) -> bool {
    replaceable(left.kind)
        && left.kind == right.kind
        && (&left.cluster, &left.namespace, &left.client_id, &left.node_id)
            == (&right.cluster, &right.namespace, &right.client_id, &right.node_id)
        && subject(left.evidence.value()) == subject(right.evidence.value())
        && left.start_unix_nano <= right.end_unix_nano
        && left.end_unix_nano >= right.start_unix_nano
}

/// The key of the lock (PostgreSQL's transaction-scoped advisory lock, as `(class, key)`) that an
/// upsert holds over `anomaly`'s subject while it looks for, and settles, the same incident.
///
/// Without it, two instances that store two versions of one incident at once (around a lease
/// hand-over) each look before the other's row is committed, and both versions stay. With it,
/// the later of the two waits until the earlier commits, and then sees its row. The key is the
/// subject's columns hashed (FNV-1a, the same in every process and build); two subjects that
/// share a key only take turns. `None` for kinds that are never replaced.
pub(crate) fn lock_key(anomaly: &Anomaly) -> Option<(i32, i32)> {
    /// The class of these locks: "laga" (lagscope anomalies), apart from the ingest lock's.
    const CLASS: i32 = 0x6c61_6761;
    if !replaceable(anomaly.kind) {
        return None;
    }
    let mut hash: u32 = 0x811c_9dc5;
    let mut feed = |bytes: &[u8]| {
        for byte in bytes {
            hash = (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193);
        }
    };
    feed(anomaly.kind.as_str().as_bytes());
    for column in [&anomaly.cluster, &anomaly.namespace, &anomaly.client_id, &anomaly.node_id] {
        match column {
            // A marker apart from any text, so that absent and empty differ.
            None => feed(&[0xfe]),
            Some(text) => {
                feed(&[0xff]);
                feed(text.as_bytes());
            }
        }
    }
    Some((CLASS, hash as i32))
}

/// A stored anomaly that may be the same incident as a new one: same kind and columns,
/// overlapping window, not replaced already (what the store's query returns).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct Candidate {
    pub(crate) id: i64,
    pub(crate) start_unix_nano: UnixNanos,
    pub(crate) evidence: String,
}

/// The stored anomalies that may be the same incident as `anomaly`, just stored as `id`: of
/// its kind and columns (absent ones absent too), not replaced already, their windows
/// overlapping its.
pub(crate) fn candidates<DB>(dialect: Dialect, anomaly: &Anomaly, id: i64) -> QueryBuilder<DB>
where
    DB: Database,
    <DB as Database>::Arguments: Default,
    for<'t> String: Encode<'t, DB> + Type<DB>,
    for<'t> Option<String>: Encode<'t, DB> + Type<DB>,
    for<'t> i64: Encode<'t, DB> + Type<DB>,
{
    let same = match dialect {
        Dialect::Sqlite => " IS ",
        Dialect::Postgres => " IS NOT DISTINCT FROM ",
    };
    let mut query = QueryBuilder::new("SELECT id, start_unix_nano, evidence FROM anomalies WHERE kind = ");
    query.push_bind(anomaly.kind.as_str().to_string());
    for (column, value) in [
        ("cluster", &anomaly.cluster),
        ("namespace", &anomaly.namespace),
        ("client_id", &anomaly.client_id),
        ("node_id", &anomaly.node_id),
    ] {
        query.push(format_args!(" AND {column}{same}")).push_bind(value.clone());
    }
    query.push(" AND superseded_by IS NULL AND id <> ").push_bind(id);
    query.push(" AND start_unix_nano <= ").push_bind(anomaly.end_unix_nano);
    query.push(" AND end_unix_nano >= ").push_bind(anomaly.start_unix_nano);
    query
}

/// Of the new anomaly (stored as `id`) and the `candidates` of the same subject, the one kept
/// (the earliest start, then the lowest id) and the ids replaced by it.
pub(crate) fn settle(anomaly: &Anomaly, id: i64, candidates: &[Candidate]) -> Option<(i64, Vec<i64>)> {
    let of_anomaly = subject(anomaly.evidence.value());
    let mut same: Vec<(UnixNanos, i64)> = candidates
        .iter()
        .filter(|candidate| {
            let evidence = serde_json::from_str(&candidate.evidence).unwrap_or_default();
            candidate.id != id && subject(&evidence) == of_anomaly
        })
        .map(|candidate| (candidate.start_unix_nano, candidate.id))
        .collect();
    if same.is_empty() {
        return None;
    }
    same.push((anomaly.start_unix_nano, id));
    same.sort_unstable();
    let kept = same[0].1;
    Some((kept, same[1..].iter().map(|(_, id)| *id).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(start: UnixNanos, evidence: &str) -> Anomaly {
        Anomaly {
            kind: AnomalyKind::UnfairRejection,
            severity: lagscope_model::Severity::Warning,
            cluster: Some("es".to_string()),
            namespace: Some("logs/1".to_string()),
            client_id: None,
            node_id: Some("es-node-1".to_string()),
            start_unix_nano: start,
            end_unix_nano: start + 10,
            summary: String::new(),
            cause: String::new(),
            evidence: serde_json::from_str::<serde_json::Value>(evidence).expect("JSON").into(),
            fingerprint: format!("f{start}"),
            open: true,
        }
    }

    fn candidate(id: i64, start: UnixNanos, evidence: &str) -> Candidate {
        Candidate { id, start_unix_nano: start, evidence: evidence.to_string() }
    }

    /// The earliest start is kept, whichever came first; another role is another subject.
    #[test]
    fn the_earliest_start_of_one_subject_is_kept() {
        let primary = r#"{"role":"primary","spans":[]}"#;
        let replica = r#"{"role":"replica","spans":[]}"#;
        // The whole came after the partial: it replaces it.
        assert_eq!(settle(&window(64, primary), 9, &[candidate(3, 65, primary)]), Some((9, vec![3])));
        // The partial came after the whole: it is replaced at once.
        assert_eq!(settle(&window(65, primary), 9, &[candidate(3, 64, primary)]), Some((3, vec![9])));
        // Two partials before: both go.
        let both = [candidate(3, 66, primary), candidate(4, 65, primary)];
        assert_eq!(settle(&window(64, primary), 9, &both), Some((9, vec![4, 3])));
        // Another role's window, or the row itself: nothing to settle.
        assert_eq!(settle(&window(64, primary), 9, &[candidate(3, 65, replica)]), None);
        assert_eq!(settle(&window(64, primary), 9, &[candidate(9, 64, primary)]), None);
        assert!(replaceable(AnomalyKind::PinnedRetry) && replaceable(AnomalyKind::ApplyLag));
        assert!(!replaceable(AnomalyKind::StaleRead) && !replaceable(AnomalyKind::RouterStateDropped));
    }

    /// One incident: the same kind, columns and subject, windows that overlap.
    #[test]
    fn anomalies_in_hand_are_one_incident_as_the_store_finds_them() {
        let primary = r#"{"role":"primary","spans":[]}"#;
        let (first, overlapping) = (window(64, primary), window(70, primary));
        assert!(same_incident(&first, &overlapping) && same_incident(&overlapping, &first));
        assert!(!same_incident(&first, &window(80, primary)), "apart in time");
        assert!(!same_incident(&first, &window(70, r#"{"role":"replica","spans":[]}"#)), "another subject");
        let mut elsewhere = window(70, primary);
        elsewhere.node_id = Some("es-node-2".to_string());
        assert!(!same_incident(&first, &elsewhere), "another node");
        let (mut read, mut again) = (window(64, primary), window(70, primary));
        (read.kind, again.kind) = (AnomalyKind::StaleRead, AnomalyKind::StaleRead);
        assert!(!same_incident(&read, &again), "a kind never replaced");
    }

    /// One subject, one lock, whatever the window or evidence; another column, another lock;
    /// kinds never replaced take none.
    #[test]
    fn a_subject_locks_one_key_fixed_across_builds() {
        let primary = window(64, r#"{"role":"primary"}"#);
        let key = lock_key(&primary).expect("a window kind");
        assert_eq!(lock_key(&window(90, r#"{"role":"replica"}"#)), Some(key));
        // Fixed: instances of different builds must agree on it.
        assert_eq!(key, (0x6c61_6761, 0x117f_dd57));
        let other_node = Anomaly { node_id: Some("es-node-2".to_string()), ..primary.clone() };
        assert_ne!(lock_key(&other_node), Some(key));
        let no_node = Anomaly { node_id: None, ..primary.clone() };
        let empty_node = Anomaly { node_id: Some(String::new()), ..primary.clone() };
        assert_ne!(lock_key(&no_node), lock_key(&empty_node));
        assert_eq!(lock_key(&Anomaly { kind: AnomalyKind::StaleRead, ..primary }), None);
    }
}
