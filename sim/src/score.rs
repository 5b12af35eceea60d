//! Scoring an analyzer's anomalies against a run's ground truth.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{ExpectedAnomaly, Truth};

/// An anomaly as an analyzer reported it (only what matching needs).
#[derive(Debug, Clone, PartialEq, Serialize)]
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
    /// Found anomalies that matched a borderline expected one ([`ExpectedAnomaly::optional`]):
    /// neither matched nor false. Borderline ones not found are not missed.
    pub tolerated: usize,
    /// Median and largest absolute error of matched windows' start and end, in milliseconds.
    pub start_error_ms: Option<(f64, f64)>,
    pub end_error_ms: Option<(f64, f64)>,
    /// The first few expected anomalies nothing matched, and found ones that matched nothing
    /// (at most [`EXAMPLES`] each, in time order): where to start looking.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub missed_examples: Vec<ExpectedAnomaly>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub false_examples: Vec<Found>,
}

/// How many missed and false anomalies a [`KindScore`] shows.
pub const EXAMPLES: usize = 5;

/// Matches found anomalies to expected ones: same kind and cluster, the same namespace,
/// client and node wherever the truth names one, overlapping windows (within the
/// tolerance). Each anomaly matches at most one on the other side, and as many match as can
/// (a maximum matching: the nearest starts first, then augmenting paths). Taken greedily
/// instead, an expected anomaly could take the only match of another while one of its own
/// waited: dense per-call anomalies whose times are off by a clock's skew are counted missed
/// and false though every one was found.
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
    kinds
        .into_keys()
        .map(|kind| {
            let of_kind = || truth.anomalies.iter().filter(|anomaly| anomaly.kind == kind);
            let expected: Vec<_> = of_kind().filter(|anomaly| !anomaly.optional).collect();
            let optional: Vec<_> = of_kind().filter(|anomaly| anomaly.optional).collect();
            let reported: Vec<_> = found.iter().filter(|anomaly| anomaly.kind == kind).collect();
            let by_cluster = ByCluster::of(&reported);
            let candidates_of = |wanted: &ExpectedAnomaly| candidates(&reported, &by_cluster, wanted);
            let candidates: Vec<Vec<usize>> = expected.iter().map(|wanted| candidates_of(wanted)).collect();
            let partner = maximum_matching(&candidates, reported.len());
            let mut start_errors = Vec::new();
            let mut end_errors = Vec::new();
            for (wanted, index) in expected.iter().zip(&partner) {
                if let Some(anomaly) = index.map(|index| reported[index]) {
                    start_errors.push((anomaly.start_unix_nano - wanted.start_unix_nano).abs() as f64 / 1e6);
                    end_errors.push((anomaly.end_unix_nano - wanted.end_unix_nano).abs() as f64 / 1e6);
                }
            }
            let matched = start_errors.len();
            let mut missed_examples: Vec<ExpectedAnomaly> = expected
                .iter()
                .zip(&partner)
                .filter(|(_, partner)| partner.is_none())
                .map(|(wanted, _)| (*wanted).clone())
                .collect();
            missed_examples.sort_by_key(|anomaly| anomaly.start_unix_nano);
            missed_examples.truncate(EXAMPLES);
            let mut matched_found = vec![false; reported.len()];
            for index in partner.iter().flatten() {
                matched_found[*index] = true;
            }
            // Then the borderline ones take what the required ones left.
            let borderline: Vec<Vec<usize>> = optional
                .iter()
                .map(|wanted| candidates_of(wanted).into_iter().filter(|index| !matched_found[*index]).collect())
                .collect();
            let mut tolerated = 0;
            for index in maximum_matching(&borderline, reported.len()).into_iter().flatten() {
                matched_found[index] = true;
                tolerated += 1;
            }
            let mut false_examples: Vec<Found> = reported
                .iter()
                .zip(&matched_found)
                .filter(|(_, matched)| !**matched)
                .map(|(anomaly, _)| (*anomaly).clone())
                .collect();
            false_examples.sort_by_key(|anomaly| anomaly.start_unix_nano);
            false_examples.truncate(EXAMPLES);
            KindScore {
                kind: kind.to_string(),
                expected: expected.len(),
                found: reported.len(),
                matched,
                missed: expected.len() - matched,
                false_positives: reported.len() - matched - tolerated,
                tolerated,
                start_error_ms: median_and_max(start_errors),
                end_error_ms: median_and_max(end_errors),
                missed_examples,
                false_examples,
            }
        })
        .collect()
}

/// An expected anomaly's candidates among one kind's found anomalies (indices into
/// `reported`), nearest start first: the same cluster, the same namespace, client and node
/// wherever the truth names one, windows overlapping within the tolerance.
fn candidates(reported: &[&Found], by_cluster: &ByCluster<'_>, wanted: &ExpectedAnomaly) -> Vec<usize> {
    let mut near: Vec<usize> = by_cluster
        .near(wanted)
        .filter(|index| {
            let anomaly = reported[*index];
            same_if_named(&wanted.namespace, &anomaly.namespace)
                && same_if_named(&wanted.client_id, &anomaly.client_id)
                && same_if_named(&wanted.node_id, &anomaly.node_id)
                && anomaly.start_unix_nano <= wanted.end_unix_nano + WINDOW_TOLERANCE_NANOS
                && anomaly.end_unix_nano >= wanted.start_unix_nano - WINDOW_TOLERANCE_NANOS
        })
        .collect();
    // Ties go to the first reported.
    near.sort_unstable_by_key(|index| ((reported[*index].start_unix_nano - wanted.start_unix_nano).abs(), *index));
    near
}

/// One kind's found anomalies by cluster, each cluster's by start: an expected anomaly's
/// candidates are those of its cluster that start within its window widened by the
/// tolerance and by the longest found window (found by binary search, not a scan of every
/// found anomaly for each expected one, which grew with the square of a busy run's anomalies).
struct ByCluster<'a> {
    clusters: BTreeMap<&'a str, Starts>,
}

/// (start, index into the found anomalies) in start order, and the longest found window.
struct Starts {
    starts: Vec<(i64, usize)>,
    longest: i64,
}

impl<'a> ByCluster<'a> {
    fn of(reported: &[&'a Found]) -> Self {
        let mut clusters: BTreeMap<&str, Starts> = BTreeMap::new();
        for (index, anomaly) in reported.iter().enumerate() {
            // One without a cluster matches nothing expected (every expected one names its).
            let Some(cluster) = anomaly.cluster.as_deref() else { continue };
            let starts = clusters.entry(cluster).or_insert(Starts { starts: Vec::new(), longest: 0 });
            starts.starts.push((anomaly.start_unix_nano, index));
            starts.longest = starts.longest.max(anomaly.end_unix_nano.saturating_sub(anomaly.start_unix_nano));
        }
        for starts in clusters.values_mut() {
            starts.starts.sort_unstable();
        }
        Self { clusters }
    }

    /// The found anomalies of `wanted`'s cluster whose windows may overlap its own within the
    /// tolerance (a superset: the caller checks each).
    fn near(&self, wanted: &ExpectedAnomaly) -> impl Iterator<Item = usize> + '_ {
        let starts = self.clusters.get(wanted.cluster.as_str()).map_or(&[][..], |starts| {
            // An overlapping window starts no earlier than this, and no later than `last`.
            let first = wanted.start_unix_nano.saturating_sub(WINDOW_TOLERANCE_NANOS).saturating_sub(starts.longest);
            let last = wanted.end_unix_nano.saturating_add(WINDOW_TOLERANCE_NANOS);
            let from = starts.starts.partition_point(|(start, _)| *start < first);
            let to = starts.starts.partition_point(|(start, _)| *start <= last);
            &starts.starts[from..to.max(from)]
        });
        starts.iter().map(|(_, index)| *index)
    }
}

/// A maximum matching of the left side (each with its candidates on the right, preferred
/// first) to the right side (`right` of them): each left's partner, if any. Greedy in order of
/// preference first, then an augmenting path (iterative, no recursion) from each left still
/// unmatched.
fn maximum_matching(candidates: &[Vec<usize>], right: usize) -> Vec<Option<usize>> {
    let mut partner: Vec<Option<usize>> = vec![None; candidates.len()];
    let mut owner: Vec<Option<usize>> = vec![None; right];
    // Nearest pairs first across all lefts.
    let mut pairs: Vec<(usize, usize, usize)> = candidates
        .iter()
        .enumerate()
        .flat_map(|(left, near)| near.iter().enumerate().map(move |(rank, index)| (rank, left, *index)))
        .collect();
    pairs.sort_unstable();
    for (_, left, index) in pairs {
        if partner[left].is_none() && owner[index].is_none() {
            partner[left] = Some(index);
            owner[index] = Some(left);
        }
    }
    let (mut visited, mut round) = (vec![0_u32; right], 0_u32);
    for start in 0..candidates.len() {
        if partner[start].is_some() || candidates[start].is_empty() {
            continue;
        }
        // Depth-first over alternating paths: (left, next candidate to try). A right is
        // visited in this search when its stamp is the search's (no array cleared per search).
        round += 1;
        let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
        let mut free = None;
        while let Some((left, next)) = stack.last_mut() {
            let Some(&index) = candidates[*left].get(*next) else {
                stack.pop();
                continue;
            };
            *next += 1;
            if visited[index] == round {
                continue;
            }
            visited[index] = round;
            match owner[index] {
                None => {
                    free = Some(index);
                    break;
                }
                Some(other) => stack.push((other, 0)),
            }
        }
        // Flip the path: each left on the stack takes the right it last tried.
        if let Some(mut index) = free {
            while let Some((left, next)) = stack.pop() {
                let taken = candidates[left][next - 1];
                debug_assert!(taken == index || owner[index] == Some(left));
                let previous = partner[left];
                partner[left] = Some(taken);
                owner[taken] = Some(left);
                match previous {
                    Some(freed) => index = freed,
                    None => break,
                }
            }
        }
    }
    partner
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

    fn expected(kind: &str, client: &str, start: i64, end: i64) -> ExpectedAnomaly {
        ExpectedAnomaly {
            optional: false,
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
        // Which ones: client b's expected read, client c's found one.
        assert_eq!(stale.missed_examples, vec![truth.anomalies[1].clone()]);
        assert_eq!(stale.false_examples, vec![reported[1].clone()]);
        assert_eq!(by_kind["apply_lag"].missed, 1);
        assert_eq!(by_kind["requeue_storm"].false_positives, 1);
    }

    #[test]
    fn borderline_anomalies_are_right_either_way() {
        // Client a's borderline read was found, b's was not: neither counts against the
        // analyzer. A found anomaly the required one can take goes to it first; one matching
        // nothing at all is still false.
        let borderline = |client: &str, start: i64| ExpectedAnomaly {
            optional: true,
            ..expected("stale_read", client, start, start)
        };
        let truth = Truth {
            anomalies: vec![
                borderline("a", 0),
                borderline("b", 100_000_000_000),
                expected("stale_read", "c", 50_000_000_000, 50_000_000_000),
                borderline("c", 50_500_000_000),
            ],
            ..Truth::default()
        };
        let reported = vec![
            found("stale_read", "a", 0, 0),
            found("stale_read", "c", 50_400_000_000, 50_400_000_000),
            found("stale_read", "d", 0, 0),
        ];
        let row = &score(&truth, &reported)[0];
        assert_eq!(
            (row.expected, row.found, row.matched, row.missed, row.tolerated, row.false_positives),
            (1, 3, 1, 0, 1, 1)
        );
        assert_eq!(row.false_examples, vec![reported[2].clone()]);
    }

    #[test]
    fn as_many_match_as_can_not_the_nearest_first() {
        // The first expected anomaly's nearest found one (0.2 s off) is the only one within the
        // second's window; matched nearest first, the second would be missed and the first's
        // other candidate (0.5 s off) counted false.
        let truth = Truth {
            anomalies: vec![
                expected("stale_read", "a", 1_000_000_000, 1_000_000_000),
                expected("stale_read", "a", 3_100_000_000, 3_100_000_000),
            ],
            ..Truth::default()
        };
        let reported = vec![
            found("stale_read", "a", 500_000_000, 500_000_000),
            found("stale_read", "a", 1_200_000_000, 1_200_000_000),
        ];
        let scores = score(&truth, &reported);
        assert_eq!((scores[0].matched, scores[0].missed, scores[0].false_positives), (2, 0, 0));
        assert_eq!(scores[0].start_error_ms, Some((1900.0, 1900.0)));
    }

    #[test]
    fn a_long_chain_of_shifted_anomalies_all_match() {
        // 5 000 anomalies of one client 100 ms apart, found 150 ms late: every one matches.
        let step = 100_000_000;
        let truth = Truth {
            anomalies: (0..5_000).map(|index| expected("stale_read", "a", index * step, index * step)).collect(),
            ..Truth::default()
        };
        let reported: Vec<Found> = (0..5_000)
            .map(|index| found("stale_read", "a", index * step + 150_000_000, index * step + 150_000_000))
            .collect();
        let scores = score(&truth, &reported);
        assert_eq!((scores[0].matched, scores[0].missed, scores[0].false_positives), (5_000, 0, 0));
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

    #[test]
    fn candidates_are_those_a_scan_of_every_found_anomaly_gives() {
        // Random windows (some long, some named loosely) in three clusters, one cluster unnamed.
        let mut rng = crate::rng::Rng::new(7);
        let mut pick = |names: &[&str]| {
            let name = *rng.pick(names);
            (!name.is_empty()).then(|| name.to_string())
        };
        let mut windows = crate::rng::Rng::new(8);
        let mut window = || {
            let start = windows.range(0, 60 * 1_000_000_000);
            let long = windows.chance(0.05);
            (start, start + if long { windows.range(0, 30 * 1_000_000_000) } else { windows.range(0, 5_000_000) })
        };
        let reported: Vec<Found> = (0..400)
            .map(|_| {
                let (start, end) = window();
                Found {
                    cluster: pick(&["c1", "c2", "c3", ""]),
                    namespace: pick(&["n1", "n2"]),
                    client_id: pick(&["a", "b", "c"]),
                    node_id: pick(&["x", "y"]),
                    ..found("stale_read", "a", start, end)
                }
            })
            .collect();
        let reported: Vec<&Found> = reported.iter().collect();
        let by_cluster = ByCluster::of(&reported);
        for _ in 0..400 {
            let (start, end) = window();
            let wanted = ExpectedAnomaly {
                cluster: pick(&["c1", "c2", "c3", "c4"]).unwrap_or_default(),
                namespace: pick(&["n1", ""]),
                client_id: pick(&["a", "b", ""]),
                node_id: pick(&["x", "y", ""]),
                ..expected("stale_read", "a", start, end)
            };
            let mut scanned: Vec<usize> = (0..reported.len())
                .filter(|index| {
                    let anomaly = reported[*index];
                    anomaly.cluster.as_deref() == Some(wanted.cluster.as_str())
                        && same_if_named(&wanted.namespace, &anomaly.namespace)
                        && same_if_named(&wanted.client_id, &anomaly.client_id)
                        && same_if_named(&wanted.node_id, &anomaly.node_id)
                        && anomaly.start_unix_nano <= wanted.end_unix_nano + WINDOW_TOLERANCE_NANOS
                        && anomaly.end_unix_nano >= wanted.start_unix_nano - WINDOW_TOLERANCE_NANOS
                })
                .collect();
            scanned.sort_by_key(|index| (reported[*index].start_unix_nano - wanted.start_unix_nano).abs());
            assert_eq!(candidates(&reported, &by_cluster, &wanted), scanned, "{wanted:?}");
        }
    }
}
