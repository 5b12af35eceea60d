//! What `/metrics` adds to the service's own counters: lagscope's findings as Prometheus
//! gauges, for teams that live in Grafana (`dashboards/grafana/`).
//!
//! - `lagscope_anomalies_open{kind,severity,cluster,namespace}`: anomalies whose condition
//!   still holds;
//! - `lagscope_window_open_seconds{kind,cluster,namespace,node}`: how long each open window
//!   has lasted, up to the latest data;
//! - per (cluster, namespace, node), over the whole minutes that hold the last
//!   [`GAUGE_WINDOW`] of data, from the read rollups the live analyzer writes (every read, at
//!   the cost of a few rows per node): `lagscope_reads{..}`,
//!   `lagscope_reads_behind_committed{..}`, `lagscope_read_behind_states{..,quantile}`,
//!   `lagscope_read_behind_seconds{..,quantile}`;
//! - per (cluster, namespace, node), over the last [`GAUGE_WINDOW`] of data, from the
//!   applied-state samples and the committed states samples and spans reported:
//!   `lagscope_apply_lag_states{..,quantile}`, `lagscope_apply_lag_seconds{..,quantile}`.
//!
//! Quantiles are 0.5, 0.99 and 1 (the maximum).
//!
//! Label values come from telemetry: they are escaped as the exposition format requires,
//! and each family is capped at [`MAX_SERIES_PER_FAMILY`] series.

use std::collections::BTreeMap;
use std::fmt::Write;

use lagscope_analyzer::{AnalysisInput, LagRows, apply_lag_rows};
use lagscope_model::conventions::{METRIC_APPLIED_STATE, METRIC_COMMITTED_STATE};
use lagscope_model::{LagQuery, Percentiles, rollup_step_of};
use lagscope_store::{AnomalyFilter, TimeRange};

use crate::lag::{MAX_ROLLUPS, staleness_by_node};
use crate::{ApiError, ApiState, LagAggregator};

/// The stretch of the latest data the lag and staleness gauges cover.
pub const GAUGE_WINDOW: i64 = 60 * 1_000_000_000;
/// Samples, and spans' committed states, one scrape reads at most for the apply-lag gauges.
pub const MAX_GAUGE_ROWS: u32 = 200_000;
/// Series per metric family at most (telemetry decides label values).
pub const MAX_SERIES_PER_FAMILY: usize = 2_000;
/// Open anomalies one scrape reads at most.
const MAX_OPEN: u32 = 1_000;

/// A metric family being written.
struct Family {
    name: &'static str,
    help: &'static str,
    rows: BTreeMap<String, f64>,
}

impl Family {
    fn new(name: &'static str, help: &'static str) -> Self {
        Self { name, help, rows: BTreeMap::new() }
    }

    fn set(&mut self, labels: &[(&str, Option<&str>)], value: f64) {
        if !value.is_finite() {
            return;
        }
        let mut text = String::new();
        for (index, (key, value)) in labels.iter().enumerate() {
            if index > 0 {
                text.push(',');
            }
            let _ = write!(text, "{key}=\"{}\"", escape(value.unwrap_or("")));
        }
        if self.rows.len() >= MAX_SERIES_PER_FAMILY && !self.rows.contains_key(&text) {
            return;
        }
        self.rows.insert(text, value);
    }

    fn add(&mut self, labels: &[(&str, Option<&str>)], value: f64) {
        self.set(labels, value + self.get(labels));
    }

    fn get(&self, labels: &[(&str, Option<&str>)]) -> f64 {
        let mut probe = Family::new(self.name, self.help);
        probe.set(labels, 0.0);
        probe.rows.keys().next().and_then(|key| self.rows.get(key)).copied().unwrap_or(0.0)
    }

    fn render(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} gauge", self.name);
        for (labels, value) in &self.rows {
            let _ = writeln!(out, "{}{{{labels}}} {value}", self.name);
        }
    }
}

/// A label value as the Prometheus text format needs it.
pub fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The gauges, in the Prometheus text format.
pub async fn analysis_gauges(state: &ApiState) -> Result<String, ApiError> {
    let mut open = Family::new("lagscope_anomalies_open", "Anomalies whose condition still holds.");
    let mut windows = Family::new(
        "lagscope_window_open_seconds",
        "How long each open window anomaly has lasted, up to the latest data.",
    );
    let latest = state.store.latest_time().await?;
    let filter = AnomalyFilter { open: Some(true), limit: MAX_OPEN, skip_evidence: true, ..AnomalyFilter::default() };
    for stored in state.store.anomalies(&filter).await? {
        let anomaly = &stored.anomaly;
        let (cluster, namespace) = (anomaly.cluster.as_deref(), anomaly.namespace.as_deref());
        open.add(
            &[
                ("kind", Some(anomaly.kind.as_str())),
                ("severity", Some(anomaly.severity.as_str())),
                ("cluster", cluster),
                ("namespace", namespace),
            ],
            1.0,
        );
        let until = latest.unwrap_or(anomaly.end_unix_nano).max(anomaly.end_unix_nano);
        let seconds = (until - anomaly.start_unix_nano) as f64 / 1e9;
        let labels = [
            ("kind", Some(anomaly.kind.as_str())),
            ("cluster", cluster),
            ("namespace", namespace),
            ("node", anomaly.node_id.as_deref()),
        ];
        windows.set(&labels, seconds.max(windows.get(&labels)));
    }
    let mut families = vec![open, windows];
    if let Some(latest) = latest {
        families.extend(read_gauges(state, latest).await?);
        if let Some(aggregate) = state.lag.clone() {
            families.extend(apply_gauges(state, aggregate, latest).await?);
        }
    }
    let mut out = String::new();
    for family in &families {
        family.render(&mut out);
    }
    Ok(out)
}

/// `quantile` 0.5, 0.99 and 1 (the maximum) of `p` under `scope`.
fn set_quantiles(family: &mut Family, scope: [(&str, Option<&str>); 3], p: &Percentiles) {
    for (quantile, value) in [("0.5", p.p50), ("0.99", p.p99), ("1", p.max)] {
        let [a, b, c] = scope;
        family.set(&[a, b, c, ("quantile", Some(quantile))], value);
    }
}

/// The read gauges, from the per-minute read rollups the live analyzer writes (every read of
/// the range, however many; percentiles within 1/16 as `/api/v1/staleness` gives them): the
/// whole minutes that hold the last [`GAUGE_WINDOW`] of data.
async fn read_gauges(state: &ApiState, latest: i64) -> Result<[Family; 4], ApiError> {
    let minutes = TimeRange { from: rollup_step_of(latest - GAUGE_WINDOW), to: latest + 1 };
    let rollups = state.store.read_rollups(minutes, MAX_ROLLUPS).await?;
    let mut reads = Family::new("lagscope_reads", "Reads served in the minutes holding the last minute of data.");
    let mut behind = Family::new(
        "lagscope_reads_behind_committed",
        "Reads served below the namespace's committed state, in the minutes holding the last minute of data.",
    );
    let mut read_states = Family::new(
        "lagscope_read_behind_states",
        "Served state behind the committed state at read time, in states (the minutes holding the last minute of data).",
    );
    let mut read_seconds = Family::new(
        "lagscope_read_behind_seconds",
        "Served state behind the committed state at read time, in seconds (the minutes holding the last minute of data).",
    );
    for node in staleness_by_node(&rollups) {
        let scope = [
            ("cluster", node.cluster.as_deref()),
            ("namespace", node.namespace.as_deref()),
            ("node", node.node.as_deref()),
        ];
        reads.set(&scope, node.reads as f64);
        behind.set(&scope, node.behind_reads as f64);
        if let Some(p) = &node.behind_states {
            set_quantiles(&mut read_states, scope, p);
        }
        if let Some(p) = &node.behind_seconds {
            set_quantiles(&mut read_seconds, scope, p);
        }
    }
    Ok([reads, behind, read_states, read_seconds])
}

/// The apply-lag gauges over the last [`GAUGE_WINDOW`] of data: the applied-state samples
/// against the committed states samples and spans reported (the spans read for their
/// committed state only), aggregated as `/api/v1/lag` aggregates them.
async fn apply_gauges(state: &ApiState, aggregate: LagAggregator, latest: i64) -> Result<[Family; 2], ApiError> {
    let range = TimeRange { from: latest - GAUGE_WINDOW, to: latest + 1 };
    let names = [METRIC_APPLIED_STATE, METRIC_COMMITTED_STATE];
    let samples = state.store.named_samples_in_range(&names, range, MAX_GAUGE_ROWS).await?;
    let committed = state.store.committed_on_spans(range, MAX_GAUGE_ROWS).await?;
    if samples.len() >= MAX_GAUGE_ROWS as usize || committed.len() >= MAX_GAUGE_ROWS as usize {
        tracing::warn!(
            samples = samples.len(),
            committed_on_spans = committed.len(),
            "/metrics: the apply-lag gauges cover only the oldest {MAX_GAUGE_ROWS} samples or spans of the last minute"
        );
    }
    let query = LagQuery {
        cluster: None,
        namespace: None,
        from_unix_nano: range.from,
        to_unix_nano: range.to,
        step_seconds: None,
    };
    let report = tokio::task::spawn_blocking(move || {
        let input = AnalysisInput::from_telemetry(&[], samples, 0);
        let reported = committed
            .into_iter()
            .map(|span| ((span.cluster, span.namespace), span.end_unix_nano, span.state_committed));
        let rows = LagRows { apply: apply_lag_rows(&input, reported), ..LagRows::default() };
        aggregate(&rows, &query)
    })
    .await
    .map_err(|error| ApiError::Analysis(error.to_string()))?
    .map_err(ApiError::Analysis)?;
    let mut apply_states = Family::new(
        "lagscope_apply_lag_states",
        "A node's applied state behind its namespace's committed state, in states (last minute of data).",
    );
    let mut apply_seconds = Family::new(
        "lagscope_apply_lag_seconds",
        "A node's applied state behind its namespace's committed state, in seconds (last minute of data).",
    );
    for bucket in &report.apply_lag {
        let scope = [
            ("cluster", bucket.cluster.as_deref()),
            ("namespace", bucket.namespace.as_deref()),
            ("node", bucket.node.as_deref()),
        ];
        set_quantiles(&mut apply_states, scope, &bucket.behind_states);
        set_quantiles(&mut apply_seconds, scope, &bucket.behind_seconds);
    }
    Ok([apply_states, apply_seconds])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped_and_families_capped() {
        let mut family = Family::new("m", "help");
        family.set(&[("client", Some("a\"b\\c\nd"))], 1.0);
        let mut out = String::new();
        family.render(&mut out);
        assert!(out.contains(r#"m{client="a\"b\\c\nd"} 1"#), "{out}");
        for index in 0..MAX_SERIES_PER_FAMILY + 10 {
            family.set(&[("n", Some(&index.to_string()))], 1.0);
        }
        assert_eq!(family.rows.len(), MAX_SERIES_PER_FAMILY);
        family.add(&[("client", Some("a\"b\\c\nd"))], 2.0);
        assert_eq!(family.get(&[("client", Some("a\"b\\c\nd"))]), 3.0);
    }
}
