//! The committed states servers of each namespace reported over time: on their spans
//! (`lagscope.state.committed`) and as `lagscope.server.committed_state`.

use std::collections::BTreeMap;

use lagscope_model::conventions::{CLUSTER, METRIC_COMMITTED_STATE, NAMESPACE};

use crate::AnalysisInput;

/// (cluster, namespace) of a report.
pub type NamespaceKey = (Option<String>, Option<String>);

/// Per namespace, (time, committed state) reports sorted by time.
pub type CommittedReports = BTreeMap<NamespaceKey, Vec<(i64, i64)>>;

pub fn committed_reports(input: &AnalysisInput) -> CommittedReports {
    let mut reports = CommittedReports::new();
    for timeline in &input.timelines {
        let key = (timeline.cluster.clone(), timeline.namespace.clone());
        for attempt in timeline.calls.iter().flat_map(|call| &call.attempts) {
            if let Some(committed) = attempt.committed {
                reports.entry(key.clone()).or_default().push((attempt.end_unix_nano, committed));
            }
        }
    }
    for sample in input.samples.iter().filter(|sample| sample.series.name == METRIC_COMMITTED_STATE) {
        let Some(value) = sample.value.as_number() else { continue };
        let key =
            (sample.series.label(CLUSTER).map(str::to_string), sample.series.label(NAMESPACE).map(str::to_string));
        reports.entry(key).or_default().push((sample.time_unix_nano, value as i64));
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
