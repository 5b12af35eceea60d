//! The committed states servers of each namespace reported over time: on their spans
//! (`lagscope.state.committed`) and as `lagscope.server.committed_state`.

use std::collections::BTreeMap;

use lagscope_model::conventions::{CLUSTER, METRIC_COMMITTED_STATE, NAMESPACE};

use crate::AnalysisInput;
use crate::series::SeriesIndex;

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
    for (key, points) in sample_reports(input.series()) {
        reports.entry(key).or_default().extend(points);
    }
    for list in reports.values_mut() {
        list.sort_unstable();
    }
    reports
}

/// The reports of the samples (`lagscope.server.committed_state`), per namespace, in no order.
pub(crate) fn sample_reports(series: &SeriesIndex) -> CommittedReports {
    // By borrowed labels first: one owned key per namespace, not per series.
    let mut reported: BTreeMap<BorrowedKey, Vec<(i64, i64)>> = BTreeMap::new();
    for (series, points) in series.numeric(METRIC_COMMITTED_STATE) {
        let key = (series.label(CLUSTER), series.label(NAMESPACE));
        reported.entry(key).or_default().extend(points.iter().map(|&(at, value)| (at, value as i64)));
    }
    reported
        .into_iter()
        .map(|((cluster, namespace), points)| ((cluster.map(str::to_string), namespace.map(str::to_string)), points))
        .collect()
}

/// Keeps only the first report of each new highest state: when each state was first known
/// to be committed.
pub fn first_seen(mut reports: CommittedReports) -> CommittedReports {
    for points in reports.values_mut() {
        let all = std::mem::take(points);
        keep_rising(points, all);
    }
    reports
}

/// Appends to `first_seen` (when each state was first reported, rising) each of `later`
/// (sorted by time, none before `first_seen`'s last) that reports a state higher than any
/// before it.
pub(crate) fn keep_rising(first_seen: &mut Vec<(i64, i64)>, later: impl IntoIterator<Item = (i64, i64)>) {
    // (Not i64::MIN for "none yet": a sender may report that state too, and it is the first.)
    let mut highest = first_seen.last().map(|(_, state)| *state);
    for (time, state) in later {
        if highest.is_none_or(|highest| state > highest) {
            first_seen.push((time, state));
            highest = Some(state);
        }
    }
}

/// How many of a namespace's reports (sorted by time) are at or before a time, for times
/// that mostly rise, as a timeline's attempts do: from where the last answer left off,
/// searching the whole list only when the time jumps back or far ahead.
pub(crate) struct ReportsThrough<'a> {
    reports: &'a [(i64, i64)],
    last: usize,
}

impl<'a> ReportsThrough<'a> {
    pub(crate) fn new(reports: &'a [(i64, i64)]) -> Self {
        Self { reports, last: 0 }
    }

    /// `reports.partition_point(|(time, _)| *time <= at)`.
    pub(crate) fn at(&mut self, at: i64) -> usize {
        const STEPS: usize = 4;
        let reports = self.reports;
        if self.last == 0 || reports[self.last - 1].0 <= at {
            let mut through = self.last;
            for _ in 0..STEPS {
                if through < reports.len() && reports[through].0 <= at {
                    through += 1;
                } else {
                    break;
                }
            }
            if reports.get(through).is_none_or(|(time, _)| *time > at) {
                self.last = through;
                return through;
            }
        }
        self.last = reports.partition_point(|(time, _)| *time <= at);
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::{ReportsThrough, keep_rising};
    use crate::testing::Random;

    #[test]
    fn the_first_report_is_kept_whatever_its_state() {
        // i64::MIN is a state a sender may report (the streaming engine's staircase keeps it).
        let mut first_seen = Vec::new();
        keep_rising(&mut first_seen, [(1, i64::MIN), (2, i64::MIN), (3, -5), (4, -7), (5, 10)]);
        assert_eq!(first_seen, [(1, i64::MIN), (3, -5), (5, 10)]);
    }

    #[test]
    fn reports_through_a_time_are_what_a_search_finds_in_any_order_of_times() {
        let mut random = Random(0x9e37_79b9_7f4a_7c15);
        let mut next = move |bound: u64| random.below(bound);
        for _ in 0..200 {
            // Times with repeats (two reports at one time), a few or none.
            let mut reports: Vec<(i64, i64)> = (0..next(40)).map(|_| (next(60) as i64, next(1000) as i64)).collect();
            reports.sort_unstable();
            let mut through = ReportsThrough::new(&reports);
            let mut at = next(70) as i64 - 5;
            for _ in 0..100 {
                // Mostly rising by a little, sometimes back or far ahead.
                at += match next(10) {
                    0 => -(next(30) as i64),
                    1 => next(40) as i64,
                    _ => next(3) as i64,
                };
                assert_eq!(through.at(at), reports.partition_point(|(time, _)| *time <= at), "at {at} in {reports:?}");
            }
        }
    }
}
