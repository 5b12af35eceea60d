//! Scoring an analyzer's anomalies against a run's ground truth.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::Truth;

/// An anomaly as an analyzer reported it (only what matching needs).
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    pub kind: String,
    pub cluster: Option<String>,
    pub namespace: Option<String>,
    pub client_id: Option<String>,
    pub node_id: Option<String>,
    pub start_unix_nano: i64,
    pub end_unix_nano: i64,
}

/// How far apart a found anomaly's window may lie from the expected one and still match it.
pub const WINDOW_TOLERANCE_NANOS: i64 = 2_000_000_000;

/// One row of the evaluation table: a scenario and an anomaly kind.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KindScore {
    pub kind: String,
    pub expected: usize,
    pub found: usize,
    pub matched: usize,
    pub missed: usize,
    pub false_positives: usize,
    /// Median and largest absolute error of matched windows' start and end, in milliseconds.
    pub start_error_ms: Option<(f64, f64)>,
    pub end_error_ms: Option<(f64, f64)>,
}

/// Matches found anomalies to expected ones: same kind and cluster, the same namespace,
/// client and node wherever the truth names one, overlapping windows (within the
/// tolerance); each found anomaly matches at most one expected, nearest start first.
pub fn score(truth: &Truth, found: &[Found]) -> Vec<KindScore> {
    let mut kinds: BTreeMap<&str, ()> = BTreeMap::new();
    for kind in truth
        .anomalies
        .iter()
        .map(|anomaly| anomaly.kind.as_str())
        .chain(found.iter().map(|anomaly| anomaly.kind.as_str()))
    {
        kinds.insert(kind, ());
    }
    let mut used = vec![false; found.len()];
    kinds
        .into_keys()
        .map(|kind| {
            let expected: Vec<_> = truth.anomalies.iter().filter(|anomaly| anomaly.kind == kind).collect();
            let mut start_errors = Vec::new();
            let mut end_errors = Vec::new();
            for wanted in &expected {
                let candidate = found
                    .iter()
                    .enumerate()
                    .filter(|(index, anomaly)| {
                        !used[*index]
                            && anomaly.kind == kind
                            && anomaly.cluster.as_deref() == Some(wanted.cluster.as_str())
                            && same_if_named(&wanted.namespace, &anomaly.namespace)
                            && same_if_named(&wanted.client_id, &anomaly.client_id)
                            && same_if_named(&wanted.node_id, &anomaly.node_id)
                            && anomaly.start_unix_nano <= wanted.end_unix_nano + WINDOW_TOLERANCE_NANOS
                            && anomaly.end_unix_nano >= wanted.start_unix_nano - WINDOW_TOLERANCE_NANOS
                    })
                    .min_by_key(|(_, anomaly)| (anomaly.start_unix_nano - wanted.start_unix_nano).abs());
                if let Some((index, anomaly)) = candidate {
                    used[index] = true;
                    start_errors.push((anomaly.start_unix_nano - wanted.start_unix_nano).abs() as f64 / 1e6);
                    end_errors.push((anomaly.end_unix_nano - wanted.end_unix_nano).abs() as f64 / 1e6);
                }
            }
            let n_found = found.iter().filter(|anomaly| anomaly.kind == kind).count();
            let matched = start_errors.len();
            KindScore {
                kind: kind.to_string(),
                expected: expected.len(),
                found: n_found,
                matched,
                missed: expected.len() - matched,
                false_positives: n_found - matched,
                start_error_ms: median_and_max(start_errors),
                end_error_ms: median_and_max(end_errors),
            }
        })
        .collect()
}

fn same_if_named(wanted: &Option<String>, got: &Option<String>) -> bool {
    wanted.is_none() || wanted == got
}

fn median_and_max(mut values: Vec<f64>) -> Option<(f64, f64)> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    Some((values[values.len() / 2], values[values.len() - 1]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ExpectedAnomaly;

    fn expected(kind: &str, client: &str, start: i64, end: i64) -> ExpectedAnomaly {
        ExpectedAnomaly {
            kind: kind.to_string(),
            cluster: "c".to_string(),
            namespace: Some("ns".to_string()),
            client_id: Some(client.to_string()),
            node_id: None,
            start_unix_nano: start,
            end_unix_nano: end,
            detail: String::new(),
        }
    }

    fn found(kind: &str, client: &str, start: i64, end: i64) -> Found {
        Found {
            kind: kind.to_string(),
            cluster: Some("c".to_string()),
            namespace: Some("ns".to_string()),
            client_id: Some(client.to_string()),
            node_id: Some("n".to_string()),
            start_unix_nano: start,
            end_unix_nano: end,
        }
    }

    #[test]
    fn counts_matches_misses_and_false_positives_per_kind() {
        let truth = Truth {
            anomalies: vec![
                expected("stale_read", "a", 0, 10),
                expected("stale_read", "b", 100, 110),
                expected("apply_lag", "a", 0, 5),
            ],
            ..Truth::default()
        };
        let reported = vec![
            found("stale_read", "a", 3_000_000, 12_000_000),
            found("stale_read", "c", 100, 110),
            found("requeue_storm", "a", 0, 1),
        ];
        let scores = score(&truth, &reported);
        let by_kind: BTreeMap<_, _> = scores.iter().map(|row| (row.kind.as_str(), row)).collect();
        let stale = by_kind["stale_read"];
        assert_eq!((stale.expected, stale.found, stale.matched, stale.missed, stale.false_positives), (2, 2, 1, 1, 1));
        assert_eq!(stale.start_error_ms, Some((3.0, 3.0)));
        assert_eq!(by_kind["apply_lag"].missed, 1);
        assert_eq!(by_kind["requeue_storm"].false_positives, 1);
    }

    #[test]
    fn windows_far_apart_do_not_match() {
        let truth = Truth { anomalies: vec![expected("stale_read", "a", 0, 10)], ..Truth::default() };
        let scores = score(
            &truth,
            &[found("stale_read", "a", 10 + 3 * WINDOW_TOLERANCE_NANOS, 20 + 3 * WINDOW_TOLERANCE_NANOS)],
        );
        assert_eq!((scores[0].missed, scores[0].false_positives), (1, 1));
    }
}
