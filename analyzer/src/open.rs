//! Which window anomalies are still open: those whose condition held at the last telemetry
//! that could have shown it ending.
//!
//! Sources arrive apart. Spans come from every process's batch exporter within seconds; a
//! node's metrics come every export interval or scrape (15 s, 60 s). Judged against the
//! latest data of the whole cluster, a lag or a storm seen in a node's metrics would close a
//! few seconds after each sample, while the spans moved on, and open again at the next: the
//! window would flap every interval. So each window is judged against the telemetry it is
//! found in: a window found in metrics against the latest sample of its node (its next
//! sample says whether the condition still holds), any other against the latest call or log
//! line of its cluster. Whatever the source, a window the cluster has moved past by
//! `open_silence_seconds` is resolved: its node stopped reporting, or its clients went away.

use std::hash::Hash;

use rustc_hash::FxHashMap;

use lagscope_model::{AnomalyKind, UnixNanos};

/// Kinds found in a node's metrics, judged by that node's samples.
pub(crate) fn found_in_metrics(kind: AnomalyKind) -> bool {
    matches!(
        kind,
        AnomalyKind::ApplyLag | AnomalyKind::RequeueStorm | AnomalyKind::ShardPressure | AnomalyKind::UnfairRejection
    )
}

/// How far each source of each cluster's telemetry has come. `K` names a cluster or a node
/// (`Option<&str>` in the batch analyzer, interned symbols in the streaming engine).
#[derive(Debug)]
pub(crate) struct DataEnds<K> {
    /// The latest call end or log line, per cluster (the streaming engine notes one per call).
    calls_and_lines: FxHashMap<K, UnixNanos>,
    /// The latest sample, per cluster and per (cluster, node).
    samples: FxHashMap<K, UnixNanos>,
    node_samples: FxHashMap<(K, K), UnixNanos>,
}

impl<K> Default for DataEnds<K> {
    fn default() -> Self {
        Self {
            calls_and_lines: FxHashMap::default(),
            samples: FxHashMap::default(),
            node_samples: FxHashMap::default(),
        }
    }
}

fn raise<Key: Hash + Eq>(map: &mut FxHashMap<Key, UnixNanos>, key: Key, at: UnixNanos) {
    let end = map.entry(key).or_insert(UnixNanos::MIN);
    *end = (*end).max(at);
}

impl<K: Hash + Eq + Copy> DataEnds<K> {
    /// A call of `cluster` that ended at `at`, or a log line of it.
    pub fn call_or_line(&mut self, cluster: K, at: UnixNanos) {
        raise(&mut self.calls_and_lines, cluster, at);
    }

    /// A sample of `node` (a series without a node counts for its cluster only).
    pub fn sample(&mut self, cluster: K, node: Option<K>, at: UnixNanos) {
        raise(&mut self.samples, cluster, at);
        if let Some(node) = node {
            raise(&mut self.node_samples, (cluster, node), at);
        }
    }

    /// Whether a window of `kind` in `cluster` (of `node`) that ends at `end` is open.
    pub fn is_open(
        &self,
        kind: AnomalyKind,
        cluster: K,
        node: Option<K>,
        end: UnixNanos,
        grace: i64,
        silence: i64,
    ) -> bool {
        if !kind.is_window() {
            return false;
        }
        let calls_and_lines = self.calls_and_lines.get(&cluster).copied();
        let samples = self.samples.get(&cluster).copied();
        // The latest of anything the cluster sent.
        let all = calls_and_lines.max(samples).unwrap_or(UnixNanos::MIN);
        let own = if found_in_metrics(kind) {
            node.and_then(|node| self.node_samples.get(&(cluster, node)).copied()).or(samples)
        } else {
            calls_and_lines
        }
        .unwrap_or(all);
        end.saturating_add(grace) >= own && end.saturating_add(silence) >= all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    #[test]
    fn a_metric_window_is_judged_by_its_node_s_samples_and_closes_when_the_cluster_moves_far_past() {
        let mut ends: DataEnds<&str> = DataEnds::default();
        // obs-1 reports every 60 s; the spans of the cluster run 40 s past its last sample.
        ends.sample("c", Some("obs-1"), 120 * S);
        ends.sample("c", Some("obs-2"), 150 * S);
        ends.call_or_line("c", 160 * S);
        let open = |ends: &DataEnds<&str>, kind, node, end| ends.is_open(kind, "c", node, end, 5 * S, 300 * S);
        assert!(open(&ends, AnomalyKind::ApplyLag, Some("obs-1"), 120 * S), "held at obs-1's latest sample");
        assert!(!open(&ends, AnomalyKind::ApplyLag, Some("obs-1"), 60 * S), "obs-1 reported past it");
        assert!(!open(&ends, AnomalyKind::ApplyLag, Some("obs-2"), 120 * S), "obs-2 reported 30 s past it");
        // A node without samples of its own: the cluster's samples decide.
        assert!(open(&ends, AnomalyKind::RequeueStorm, Some("nn-9"), 146 * S));
        assert!(!open(&ends, AnomalyKind::RequeueStorm, None, 140 * S));
        // Windows found in spans and lines are judged by them, not by metrics running ahead.
        ends.sample("c", Some("router-1"), 200 * S);
        assert!(open(&ends, AnomalyKind::NoNamenodesWindow, Some("router-1"), 156 * S));
        assert!(!open(&ends, AnomalyKind::NoNamenodesWindow, Some("router-1"), 150 * S));
        // Per-read kinds are never open.
        assert!(!open(&ends, AnomalyKind::StaleRead, None, 160 * S));
        // The cluster moved on by the silence: closed, whatever its own source says.
        ends.call_or_line("c", 500 * S);
        assert!(!open(&ends, AnomalyKind::ApplyLag, Some("obs-1"), 120 * S), "obs-1 silent for 380 s");
        // Another cluster's data changes nothing.
        ends.call_or_line("d", 10_000 * S);
        assert!(!open(&ends, AnomalyKind::NoNamenodesWindow, None, 400 * S));
        assert!(open(&ends, AnomalyKind::NoNamenodesWindow, None, 496 * S));
    }
}
