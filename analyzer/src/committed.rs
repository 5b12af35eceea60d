//! The committed states servers of each namespace reported over time: on their spans
//! (`lagscope.state.committed`) and as `lagscope.server.committed_state`.

use std::collections::BTreeMap;

use lagscope_model::conventions::{CLUSTER, METRIC_COMMITTED_STATE, NAMESPACE};

use crate::AnalysisInput;

/// (cluster, namespace) of a report.
pub type NamespaceKey = (Option<String>, Option<String>);

/// A [`NamespaceKey`] of borrowed labels.
type BorrowedKey<'a> = (Option<&'a str>, Option<&'a str>);

/// Per namespace, (time, committed state) reports sorted by time.
pub type CommittedReports = BTreeMap<NamespaceKey, Vec<(i64, i64)>>;

pub fn committed_reports(input: &AnalysisInput) -> CommittedReports {
    let mut reports = CommittedReports::new();
    for timeline in &input.timelines {
        let mut points = timeline
            .calls
            .iter()
            .flat_map(|call| &call.attempts)
            .filter_map(|attempt| Some((attempt.end_unix_nano, attempt.committed?)))
            .peekable();
        if points.peek().is_some() {
            reports.entry((timeline.cluster.clone(), timeline.namespace.clone())).or_default().extend(points);
        }
    }
    // By borrowed labels first: one owned key per namespace, not per series.
    let mut reported: BTreeMap<BorrowedKey, Vec<(i64, i64)>> = BTreeMap::new();
    for (series, points) in input.series().numeric(METRIC_COMMITTED_STATE) {
        let key = (series.label(CLUSTER), series.label(NAMESPACE));
        reported.entry(key).or_default().extend(points.iter().map(|&(at, value)| (at, value as i64)));
    }
    for ((cluster, namespace), points) in reported {
        reports.entry((cluster.map(str::to_string), namespace.map(str::to_string))).or_default().extend(points);
    }
    for list in reports.values_mut() {
        list.sort_unstable();
    }
    reports
}

/// Keeps only the first report of each new highest state: when each state was first known
/// to be committed.
pub fn first_seen(mut reports: CommittedReports) -> CommittedReports {
    for points in reports.values_mut() {
        let mut highest = i64::MIN;
        points.retain(|(_, state)| {
            let keep = *state > highest;
            highest = highest.max(*state);
            keep
        });
    }
    reports
}
