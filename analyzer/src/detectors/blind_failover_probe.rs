//! `blind_failover_probe`: a client's sends to one cluster URL fail for at least
//! `min_seconds` without a failover, while its probe of that URL keeps saying "up" (seed 004:
//! a TCP-connect probe cannot see a half-dead cluster).

use lagscope_model::conventions::METRIC_PROBE_UP;
use lagscope_model::{Anomaly, AnomalyKind, ClientTimeline, Outcome, Severity, TimelineAttempt};

use super::evidence::{evidence, span_ids};
use crate::{AnalysisInput, AnalyzerConfig};

pub(crate) const SERVER_ADDRESS: &str = "server.address";
pub(crate) const PROBE_KIND: &str = "lagscope.probe.kind";
pub(crate) const CLIENT_ID: &str = "lagscope.client.id";

pub fn detect(input: &AnalysisInput, config: &AnalyzerConfig) -> Vec<Anomaly> {
    let settings = &config.blind_failover_probe;
    let probes = input.series().series_of(METRIC_PROBE_UP, &[SERVER_ADDRESS, PROBE_KIND, CLIENT_ID]);
    let mut anomalies = Vec::new();
    for (index, timeline) in input.timelines.iter().enumerate() {
        // (Of a settled timeline, what follows its cut: the witnesses before are no run.)
        let attempts: Vec<&TimelineAttempt> =
            input.consecutive_calls(index).iter().flat_map(|call| &call.attempts).collect();
        let mut run: Vec<&TimelineAttempt> = Vec::new();
        let mut runs: Vec<Vec<&TimelineAttempt>> = Vec::new();
        for attempt in attempts.iter().copied().filter(|attempt| attempt.server_address.is_some()) {
            let failed = attempt.outcome != Some(Outcome::Ok);
            let same_address = run.last().is_none_or(|last| last.server_address == attempt.server_address);
            if failed && same_address {
                run.push(attempt);
            } else {
                runs.push(std::mem::take(&mut run));
                if failed {
                    run.push(attempt);
                }
            }
        }
        runs.push(run);
        for run in runs.into_iter().filter(|run| !run.is_empty()) {
            let (first, last) = (run[0], run[run.len() - 1]);
            let (start, end) = (first.start_unix_nano, last.end_unix_nano);
            if end - start < settings.min_seconds * 1_000_000_000 {
                continue;
            }
            let address = first.server_address.clone().unwrap_or_default();
            // The client's verdicts on that address during the run.
            let verdicts: Vec<(f64, String)> = probes
                .iter()
                .filter(|((_, labels), _)| {
                    labels[0] == address && (labels[2].is_empty() || labels[2] == timeline.client_id)
                })
                .flat_map(|((_, labels), points)| {
                    points.iter().filter(|(at, _)| (start..=end).contains(at)).map(|(_, up)| (*up, labels[1].clone()))
                })
                .collect();
            if verdicts.is_empty() || verdicts.iter().any(|(up, _)| *up < 0.5) {
                continue;
            }
            anomalies.push(blind(timeline, first, run.len(), end, &address, &verdicts[0].1, verdicts.len()));
        }
    }
    anomalies
}

/// The anomaly: `failed_sends` sends of a run starting with `first` failed until `end` while
/// the client's `kind` probe of `address` said "up" `verdicts` times. Shared with the
/// streaming engine.
pub(crate) fn blind(
    timeline: &ClientTimeline,
    first: &TimelineAttempt,
    failed_sends: usize,
    end: i64,
    address: &str,
    kind: &str,
    verdicts: usize,
) -> Anomaly {
    let start = first.start_unix_nano;
    let seconds = (end - start) as f64 / 1e9;
    Anomaly {
        kind: AnomalyKind::BlindFailoverProbe,
        severity: Severity::Critical,
        cluster: timeline.cluster.clone(),
        namespace: timeline.namespace.clone(),
        client_id: Some(timeline.client_id.clone()),
        node_id: None,
        start_unix_nano: start,
        end_unix_nano: end,
        summary: format!(
            "client {} failed {} sends to {address} over {seconds:.0} s without failing over: its {kind} probe said the cluster was up {} times",
            timeline.client_id, failed_sends, verdicts
        ),
        cause: format!(
            "blind failover probe: the {kind} probe only checks that {address} accepts connections; a half-dead cluster \
             passes it while produce/consume fail, so the client never fails over (PIP-121's probeAvailable; a health \
             check is needed)"
        ),
        evidence: evidence!({
            "server_address": address,
            "probe_kind": kind,
            "probe_up_verdicts": verdicts,
            "failed_sends": failed_sends,
            "error_type": first.error_type,
            "window_seconds": seconds,
            "spans": span_ids(first),
        }),
        open: false,
        fingerprint: format!(
            "blind_failover_probe|{}|{}|{address}|{start}",
            timeline.cluster.as_deref().unwrap_or(""),
            timeline.client_id
        ),
    }
}
