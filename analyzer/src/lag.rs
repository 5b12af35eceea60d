//! The raw rows of lag analytics: one per served read, per applied-state report and per
//! rejection count. The aggregation (percentiles per namespace, node and time step) lives in
//! `lagscope-analytics`, which keeps polars out of everything else.
//!
//! "Behind" is measured against the namespace's committed state known at that moment (the
//! highest any server reported on a span or as `lagscope.server.committed_state`), in states
//! and in seconds: how long before the moment the first state the node did not have was
//! already committed. Both are 0 when the node was current.

use lagscope_model::conventions::{METRIC_APPLIED_STATE, METRIC_SHARD_REJECTIONS};
use std::collections::BTreeMap;

use lagscope_model::{ClientTimeline, ReadRollup, TimelineAttempt, TimelineCall, rollup_step_of};
use serde::Serialize;

use crate::AnalysisInput;
use crate::committed::{NamespaceKey, ReportsThrough};
use crate::detectors::shard_pressure::SHARD_ROLE;
use crate::floor::served_of;
use crate::series::increases;

mod windows;
pub use windows::{FirstAttempts, WindowedLag, reach};

/// A read a server served, and how far behind the namespace it was.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReadLag {
    pub cluster: Option<String>,
    pub namespace: Option<String>,
    /// The node that served it (or was sent it, when no server span says).
    pub node: Option<String>,
    pub role: Option<String>,
    pub client_id: String,
    pub time_unix_nano: i64,
    pub served: i64,
    /// The namespace's committed state known when the read completed, if any was reported.
    pub committed: Option<i64>,
    pub behind_states: Option<i64>,
    pub behind_seconds: Option<f64>,
}

/// A follower's applied state at one report, against the namespace's committed state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ApplyLagPoint {
    pub cluster: Option<String>,
    pub namespace: Option<String>,
    pub node: Option<String>,
    pub time_unix_nano: i64,
    pub applied: i64,
    pub committed: i64,
    pub behind_states: i64,
    pub behind_seconds: f64,
}

/// Rejections a shard counted for one role between two reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RejectionCount {
    pub cluster: Option<String>,
    /// The shard (`index/shard`) or other namespace the counter belongs to.
    pub namespace: Option<String>,
    pub node: Option<String>,
    pub role: String,
    pub time_unix_nano: i64,
    pub rejections: f64,
}

/// Every row of lag analytics the input holds.
#[derive(Debug, Default, Clone, PartialEq, Serialize)]
pub struct LagRows {
    pub reads: Vec<ReadLag>,
    pub apply: Vec<ApplyLagPoint>,
    pub rejections: Vec<RejectionCount>,
}

/// The reads of the input served at or after `complete_from`, rolled up per (cluster,
/// namespace, node) and minute, in (minute, scope) order: the sums of [`lag_rows`]'s reads of
/// each, without a row per read.
pub fn read_rollups(input: &AnalysisInput, complete_from: i64) -> Vec<ReadRollup> {
    // (minute, cluster, namespace, node)
    type Key<'a> = (i64, &'a Option<String>, &'a Option<String>, Option<&'a String>);
    let committed = input.committed();
    let mut rollups: BTreeMap<Key, ReadRollup> = BTreeMap::new();
    // A timeline's reads are summed apart first, per (minute, node), then added to the map:
    // a lookup per read in the map compared the cluster's and namespace's names every time.
    let mut of_timeline: Vec<(i64, Option<&String>, ReadRollup)> = Vec::new();
    for timeline in &input.timelines {
        let mut through = None;
        for read in served_reads_of(timeline, committed).filter(|read| read.at >= complete_from) {
            let (minute, node) = (rollup_step_of(read.at), read.node());
            let place = match of_timeline.iter().rposition(|(at, of, _)| *at == minute && *of == node) {
                Some(place) => place,
                None => {
                    of_timeline.push((minute, node, ReadRollup::default()));
                    of_timeline.len() - 1
                }
            };
            let rollup = &mut of_timeline[place].2;
            rollup.reads += 1;
            let through = through.get_or_insert_with(|| ReportsThrough::new(read.committed));
            let Some((_, states, seconds)) = read.behind(through) else { continue };
            rollup.compared += 1;
            if states > 0 {
                rollup.behind_reads += 1;
            }
            rollup.behind_states.record(states.max(0) as u64);
            rollup.behind_millis.record((seconds.max(0.0) * 1e3).round() as u64);
            rollup.max_behind_states = rollup.max_behind_states.max(Some(states));
            rollup.max_behind_seconds = Some(rollup.max_behind_seconds.map_or(seconds, |max| max.max(seconds)));
        }
        for (minute, node, summed) in of_timeline.drain(..) {
            rollups
                .entry((minute, &timeline.cluster, &timeline.namespace, node))
                .or_insert_with(|| ReadRollup {
                    cluster: timeline.cluster.clone(),
                    namespace: timeline.namespace.clone(),
                    node: node.cloned(),
                    minute_unix_nano: minute,
                    ..ReadRollup::default()
                })
                .merge(&summed);
        }
    }
    rollups.into_values().collect()
}

pub fn lag_rows(input: &AnalysisInput) -> LagRows {
    let committed = input.committed();
    LagRows { reads: read_lags(input, committed), apply: apply_lags(input, committed), rejections: rejections(input) }
}

/// The applied-state rows of `input`'s samples, against the committed states its samples and
/// timelines report and `also_committed` ((cluster, namespace), time, state), e.g. what spans
/// reported when the input holds only samples: [`lag_rows`]' `apply` without building the
/// spans' timelines.
pub fn apply_lag_rows(
    input: &AnalysisInput,
    also_committed: impl IntoIterator<Item = (NamespaceKey, i64, i64)>,
) -> Vec<ApplyLagPoint> {
    let mut reports = crate::committed::committed_reports(input);
    for (key, at, state) in also_committed {
        reports.entry(key).or_default().push((at, state));
    }
    for points in reports.values_mut() {
        points.sort_unstable();
    }
    apply_lags(input, &crate::committed::first_seen(reports))
}

fn read_lags(input: &AnalysisInput, committed: &crate::committed::CommittedReports) -> Vec<ReadLag> {
    let mut rows = Vec::new();
    for timeline in &input.timelines {
        let mut through = None;
        for read in served_reads_of(timeline, committed) {
            let through = through.get_or_insert_with(|| ReportsThrough::new(read.committed));
            rows.push(read_row(timeline, &read, read.behind(through)));
        }
    }
    rows.sort_by(|left, right| (left.time_unix_nano, &left.client_id).cmp(&(right.time_unix_nano, &right.client_id)));
    rows
}

/// The row of a read of `timeline`, `behind` its namespace by (committed, states, seconds).
fn read_row(timeline: &ClientTimeline, read: &LagRead<'_>, behind: Option<(i64, i64, f64)>) -> ReadLag {
    let (committed, behind_states, behind_seconds) = match behind {
        Some((committed, states, seconds)) => (Some(committed), Some(states), Some(seconds)),
        None => (None, None, None),
    };
    let attempt = read.attempt;
    ReadLag {
        cluster: timeline.cluster.clone(),
        namespace: timeline.namespace.clone(),
        node: read.node().cloned(),
        role: attempt
            .served_role
            .clone()
            .or_else(|| attempt.reported.node_role.clone())
            .or_else(|| attempt.target_role.clone()),
        client_id: timeline.client_id.clone(),
        time_unix_nano: read.at,
        served: read.served,
        committed,
        behind_states,
        behind_seconds,
    }
}

/// A served read of a timeline, as the read rows and the rollups count it: at its end, on the
/// node that served it (else the one it was sent to).
struct LagRead<'a> {
    attempt: &'a TimelineAttempt,
    served: i64,
    at: i64,
    /// The namespace's first-seen committed states.
    committed: &'a [(i64, i64)],
}

impl<'a> LagRead<'a> {
    fn node(&self) -> Option<&'a String> {
        self.attempt.served_by.as_ref().or(self.attempt.target_node.as_ref())
    }

    /// The committed state when it was served, and how far behind it the read was, in states
    /// and seconds ([`behind`]); none before any report. For the reads of one timeline in
    /// turn: `through` is of its `committed`.
    fn behind(&self, through: &mut ReportsThrough<'_>) -> Option<(i64, i64, f64)> {
        behind(self.committed, through.at(self.at), self.at, self.served)
    }
}

/// The timeline's served reads, with its namespace's first-seen committed states.
fn served_reads_of<'a>(
    timeline: &'a ClientTimeline,
    committed: &'a crate::committed::CommittedReports,
) -> impl Iterator<Item = LagRead<'a>> {
    let key: NamespaceKey = (timeline.cluster.clone(), timeline.namespace.clone());
    let committed = committed.get(&key).map(Vec::as_slice).unwrap_or_default();
    timeline.calls.iter().flat_map(move |call| served_reads_in(call, committed))
}

/// The served reads of one call, against its namespace's first-seen committed states.
fn served_reads_in<'a>(call: &'a TimelineCall, committed: &'a [(i64, i64)]) -> impl Iterator<Item = LagRead<'a>> {
    served_of(call).map(move |(attempt, served)| LagRead { attempt, served, at: attempt.end_unix_nano, committed })
}

fn apply_lags(input: &AnalysisInput, committed: &crate::committed::CommittedReports) -> Vec<ApplyLagPoint> {
    let mut rows = Vec::new();
    for ((scope, _), points) in input.series().series_of(METRIC_APPLIED_STATE, &[]) {
        let key: NamespaceKey = (scope.cluster.clone(), scope.namespace.clone());
        let Some(known) = committed.get(&key) else { continue };
        let mut through = ReportsThrough::new(known);
        for (at, applied) in points {
            let applied = applied as i64;
            let Some((committed, behind_states, behind_seconds)) = behind(known, through.at(at), at, applied) else {
                continue;
            };
            rows.push(ApplyLagPoint {
                cluster: scope.cluster.clone(),
                namespace: scope.namespace.clone(),
                node: scope.node.clone(),
                time_unix_nano: at,
                applied,
                committed,
                behind_states,
                behind_seconds,
            });
        }
    }
    rows.sort_by(|left, right| (left.time_unix_nano, &left.node).cmp(&(right.time_unix_nano, &right.node)));
    rows
}

fn rejections(input: &AnalysisInput) -> Vec<RejectionCount> {
    let mut rows = Vec::new();
    for ((scope, labels), points) in input.series().series_of(METRIC_SHARD_REJECTIONS, &[SHARD_ROLE]) {
        for (at, count) in increases(&points).filter(|(_, count)| *count > 0.0) {
            rows.push(RejectionCount {
                cluster: scope.cluster.clone(),
                namespace: scope.namespace.clone(),
                node: scope.node.clone(),
                role: labels[0].clone(),
                time_unix_nano: at,
                rejections: count,
            });
        }
    }
    rows.sort_by(|left, right| (left.time_unix_nano, &left.namespace).cmp(&(right.time_unix_nano, &right.namespace)));
    rows
}

/// Against the first-seen committed states of a namespace (sorted by time, rising), of which
/// `known` are at or before `at` ([`ReportsThrough`]): the committed state known at `at`, and
/// how far `state` was behind it in states and seconds.
fn behind(first_seen: &[(i64, i64)], known: usize, at: i64, state: i64) -> Option<(i64, i64, f64)> {
    let (_, committed) = *first_seen.get(known.checked_sub(1)?)?;
    if committed <= state {
        return Some((committed, 0, 0.0));
    }
    // The first report of a state above `state`: from then on the node was behind.
    let missed = first_seen[..known].partition_point(|(_, reported)| *reported <= state);
    let since = first_seen[missed].0;
    // (Saturating: a state is whatever its sender sent, down to i64::MIN.)
    Some((committed, committed.saturating_sub(state), at.saturating_sub(since).max(0) as f64 / 1e9))
}

#[cfg(test)]
mod tests {
    /// [`super::behind`] at `at`, its reports counted by a search.
    fn behind(first_seen: &[(i64, i64)], at: i64, state: i64) -> Option<(i64, i64, f64)> {
        super::behind(first_seen, first_seen.partition_point(|(time, _)| *time <= at), at, state)
    }

    #[test]
    fn behind_measures_states_and_time_since_the_first_missed_commit() {
        let known = [(1_000_000_000, 10), (2_000_000_000, 20), (5_000_000_000, 30)];
        // Before anything was reported: nothing to compare with.
        assert_eq!(behind(&known, 500_000_000, 5), None);
        // Current, and ahead (reports arrive late): 0 behind.
        assert_eq!(behind(&known, 2_500_000_000, 20), Some((20, 0, 0.0)));
        assert_eq!(behind(&known, 2_500_000_000, 25), Some((20, 0, 0.0)));
        // Served 15 at 6 s: committed 30; 20 was committed at 2 s, so 4 s behind.
        assert_eq!(behind(&known, 6_000_000_000, 15), Some((30, 15, 4.0)));
        // Served 20 at 6 s: 30 committed at 5 s, 1 s behind.
        assert_eq!(behind(&known, 6_000_000_000, 20), Some((30, 10, 1.0)));
    }

    #[test]
    fn behind_saturates_on_states_a_sender_made_up() {
        // A served state of i64::MIN, a committed one of i64::MAX: as far behind as can be
        // counted, not an overflow.
        let known = [(1_000_000_000, i64::MAX)];
        assert_eq!(behind(&known, 2_000_000_000, i64::MIN), Some((i64::MAX, i64::MAX, 1.0)));
        assert_eq!(behind(&known, 2_000_000_000, -1), Some((i64::MAX, i64::MAX, 1.0)));
    }
}
