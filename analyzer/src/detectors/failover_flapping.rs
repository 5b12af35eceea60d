//! `failover_flapping`: a client switches between clusters more often than its
//! switchBackDelay allows (seed 004: `failoverDelay` and `switchBackDelay` exist so that a
//! client settles on one cluster). Switches are read from the cluster URL (`server.address`)
//! its consecutive calls went to.

use lagscope_model::{Anomaly, AnomalyKind, ClientTimeline, Severity, TimelineAttempt};
use serde_json::json;

use super::evidence::span_ids;
use crate::{AnalysisInput, AnalyzerConfig};

pub fn detect(input: &AnalysisInput, config: &AnalyzerConfig) -> Vec<Anomaly> {
    let min_gap = config.failover_flapping.switch_back_delay_seconds * 1_000_000_000;
    let mut anomalies = Vec::new();
    for timeline in &input.timelines {
        let attempts: Vec<&TimelineAttempt> = timeline
            .calls
            .iter()
            .flat_map(|call| &call.attempts)
            .filter(|attempt| attempt.server_address.is_some())
            .collect();
        // (time, from, to, attempt) of every switch.
        let switches: Vec<(i64, &str, &str, &TimelineAttempt)> = attempts
            .windows(2)
            .filter(|pair| pair[0].server_address != pair[1].server_address)
            .map(|pair| {
                (
                    pair[1].start_unix_nano,
                    pair[0].server_address.as_deref().unwrap_or_default(),
                    pair[1].server_address.as_deref().unwrap_or_default(),
                    pair[1],
                )
            })
            .collect();
        // Runs of switches each closer than the delay to the previous one.
        let mut run: Vec<&(i64, &str, &str, &TimelineAttempt)> = Vec::new();
        let mut flush = |run: &mut Vec<&(i64, &str, &str, &TimelineAttempt)>| {
            if run.len() >= 2 {
                anomalies.push(flapping(timeline, run, min_gap));
            }
            run.clear();
        };
        for switch in &switches {
            if run.last().is_some_and(|previous| switch.0 - previous.0 >= min_gap) {
                flush(&mut run);
            }
            run.push(switch);
        }
        flush(&mut run);
    }
    anomalies
}

/// One switch: (time, from address, to address, the attempt that went to the new one).
pub(crate) type Switch<'a> = (i64, &'a str, &'a str, &'a TimelineAttempt);

/// The anomaly for a run of at least two switches each closer than `min_gap` to the last.
/// Shared with the streaming engine.
pub(crate) fn flapping(timeline: &ClientTimeline, run: &[&Switch<'_>], min_gap: i64) -> Anomaly {
    let (start, end) = (run[0].0, run[run.len() - 1].0);
    let path: Vec<String> =
        std::iter::once(run[0].1.to_string()).chain(run.iter().map(|switch| switch.2.to_string())).collect();
    Anomaly {
        kind: AnomalyKind::FailoverFlapping,
        severity: Severity::Warning,
        cluster: timeline.cluster.clone(),
        namespace: timeline.namespace.clone(),
        client_id: Some(timeline.client_id.clone()),
        node_id: None,
        start_unix_nano: start,
        end_unix_nano: end,
        summary: format!(
            "client {} switched clusters {} times in {:.0} s ({}), faster than a switch-back delay of {} s allows",
            timeline.client_id,
            run.len(),
            (end - start) as f64 / 1e9,
            path.join(" → "),
            min_gap / 1_000_000_000
        ),
        cause: "failover flapping: the client's failover and switch-back decisions do not wait long enough (or its \
                probe's verdicts flip), so it moves between clusters while neither is settled"
            .to_string(),
        evidence: json!({
            "switches": run.len(),
            "path": path,
            "switch_times_unix_nano": run.iter().map(|switch| switch.0).collect::<Vec<_>>(),
            "spans": run.iter().flat_map(|switch| span_ids(switch.3)).collect::<Vec<_>>(),
        }),
        open: false,
        fingerprint: format!(
            "failover_flapping|{}|{}|{start}",
            timeline.cluster.as_deref().unwrap_or(""),
            timeline.client_id
        ),
    }
}
