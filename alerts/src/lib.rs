//! Alerts from anomalies: which receivers an anomaly goes to (routes), how anomalies group
//! into one incident (one page per root cause), what inhibits a page, and the bodies each
//! paging system takes (Alertmanager API v2, PagerDuty Events API v2, the Alertmanager
//! webhook JSON version 4).
//!
//! Pure: no I/O. The service keeps the incidents and the outbox in its store and sends the
//! bodies built here (`lagscope::alerting`).

mod payload;

use std::collections::BTreeMap;

use lagscope_model::{Anomaly, AnomalyKind, Severity, UnixNanos};
use serde::{Deserialize, Serialize};

pub use payload::{PAGERDUTY_SUMMARY_LIMIT, alertmanager_body, pagerduty_body, rfc3339, webhook_body};

/// A paging system lagscope delivers to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ReceiverKind {
    /// Alertmanager's API v2: `POST {url}/api/v2/alerts`.
    Alertmanager { url: String },
    /// PagerDuty Events API v2: `POST {url}` (default `https://events.pagerduty.com/v2/enqueue`).
    Pagerduty {
        routing_key: String,
        #[serde(default = "default_pagerduty_url")]
        url: String,
    },
    /// Anything that takes Alertmanager's webhook JSON (version 4): `POST {url}`.
    Webhook { url: String },
}

fn default_pagerduty_url() -> String {
    "https://events.pagerduty.com/v2/enqueue".to_string()
}

/// `[[alerts.receiver]]`: a named paging system.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receiver {
    pub name: String,
    #[serde(flatten)]
    pub kind: ReceiverKind,
}

/// `[[alerts.route]]`: anomalies matching every list given (an empty list matches all) go
/// to `receiver`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Route {
    pub receiver: String,
    pub kinds: Vec<String>,
    /// Severities at or above which to page, e.g. `["critical"]`.
    pub severities: Vec<String>,
    pub clusters: Vec<String>,
    pub namespaces: Vec<String>,
}

impl Route {
    pub fn matches(&self, anomaly: &Anomaly) -> bool {
        let any_or = |list: &[String], value: Option<&str>| {
            list.is_empty() || value.is_some_and(|value| list.iter().any(|wanted| wanted == value))
        };
        any_or(&self.kinds, Some(anomaly.kind.as_str()))
            && any_or(&self.severities, Some(anomaly.severity.as_str()))
            && any_or(&self.clusters, anomaly.cluster.as_deref())
            && any_or(&self.namespaces, anomaly.namespace.as_deref())
    }
}

/// One incident: the anomalies sharing a root cause, paged once.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct IncidentKey(pub String);

/// The incident an anomaly belongs to. A window (a lag, a storm, a NoNamenodesAvailable
/// window) is its own incident; per-read anomalies (stale reads, state regressions, dropped
/// states, pinned retries) group under the node that served them, so that a lagging
/// observer's hundred stale reads page once, under that observer.
pub fn incident_of(anomaly: &Anomaly) -> IncidentKey {
    if anomaly.kind.is_window() {
        return IncidentKey(format!("{}|{}", anomaly.kind.as_str(), anomaly.fingerprint));
    }
    let part = |value: &Option<String>| value.clone().unwrap_or_default();
    IncidentKey(format!(
        "{}|{}|{}|{}",
        anomaly.kind.as_str(),
        part(&anomaly.cluster),
        part(&anomaly.namespace),
        part(&anomaly.node_id)
    ))
}

impl IncidentKey {
    /// The anomaly kind the incident is of (the key's first part).
    pub fn kind(&self) -> &str {
        self.0.split('|').next().unwrap_or_default()
    }

    /// Whether the incident is a window (resolved when its condition ends), not a group of
    /// per-read anomalies (resolved after a quiet period).
    pub fn is_window(&self) -> bool {
        AnomalyKind::parse(self.kind()).is_some_and(AnomalyKind::is_window)
    }

    /// A stable, bounded key for the paging systems (PagerDuty's `dedup_key`, the webhook's
    /// `groupKey`): the kind and a 64-bit FNV-1a hash of the incident.
    pub fn dedup_key(&self) -> String {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in self.0.bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        format!("lagscope-{}-{hash:016x}", self.kind())
    }
}

/// Whether `inhibitor` (an open `apply_lag` of a node) inhibits pages for `anomaly` (a stale
/// read that node served): the lag is the cause, and it pages already.
pub fn inhibits(inhibitor: &Anomaly, anomaly: &Anomaly) -> bool {
    inhibitor.kind == AnomalyKind::ApplyLag
        && inhibitor.open
        && anomaly.kind == AnomalyKind::StaleRead
        && inhibitor.node_id.is_some()
        && inhibitor.node_id == anomaly.node_id
        && inhibitor.cluster == anomaly.cluster
}

/// What a receiver is told about an incident.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Alert {
    pub incident: IncidentKey,
    /// Identify the alert in Alertmanager: the same for every message about one incident.
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub starts_at: UnixNanos,
    /// Set when the incident is resolved.
    pub ends_at: Option<UnixNanos>,
    /// The anomaly page of the incident's latest anomaly.
    pub generator_url: String,
    pub severity: Severity,
    /// Where the incident is (PagerDuty's `source`): the node, else the cluster.
    pub source: String,
    /// The evidence of the incident's latest anomaly: the minimal sequence of operations
    /// that broke the guarantee.
    pub evidence: serde_json::Value,
    /// Anomalies in the incident so far.
    pub members: u64,
    /// A window incident whose window has closed but which is not resolved yet (the alerter's
    /// state, in no message body).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed: Option<WindowClosed>,
}

/// A window that closed: its end, and the wall-clock time the alerter first saw it closed.
/// The incident resolves once the window has stayed closed for `alerts.window_resolve_after`;
/// a window that opens again meanwhile (the analyzer closed it while one source's telemetry
/// ran ahead of the rest, and reopened it as the rest arrived) stays one incident, firing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowClosed {
    pub end_unix_nano: UnixNanos,
    pub seen_unix_nano: UnixNanos,
}

impl Alert {
    /// The alert of an incident whose latest anomaly is `latest` (stored as `anomaly_id`),
    /// started at `starts_at`, with `members` anomalies.
    pub fn of(
        incident: &IncidentKey,
        latest: &Anomaly,
        anomaly_id: i64,
        starts_at: UnixNanos,
        members: u64,
        external_url: &str,
    ) -> Alert {
        let mut labels = BTreeMap::new();
        labels.insert("alertname".to_string(), latest.kind.as_str().to_string());
        labels.insert("severity".to_string(), latest.severity.as_str().to_string());
        labels.insert("source".to_string(), "lagscope".to_string());
        for (name, value) in [("cluster", &latest.cluster), ("namespace", &latest.namespace), ("node", &latest.node_id)]
        {
            if let Some(value) = value {
                labels.insert(name.to_string(), value.clone());
            }
        }
        // A window is one client's (or one node's): its client is part of its identity. A
        // node's grouped reads come from many clients: their count is an annotation.
        if latest.kind.is_window()
            && let Some(client) = &latest.client_id
        {
            labels.insert("client".to_string(), client.clone());
        }
        let link = format!("{}/anomalies/{anomaly_id}", external_url.trim_end_matches('/'));
        let mut annotations = BTreeMap::new();
        let summary = if members > 1 {
            format!("{} ({} anomalies in this incident)", latest.summary, members)
        } else {
            latest.summary.clone()
        };
        annotations.insert("summary".to_string(), summary);
        annotations.insert("cause".to_string(), latest.cause.clone());
        annotations.insert("anomaly".to_string(), link.clone());
        if !latest.kind.is_window()
            && let Some(client) = &latest.client_id
        {
            annotations.insert("latest_client".to_string(), client.clone());
        }
        let source =
            latest.node_id.clone().or_else(|| latest.cluster.clone()).unwrap_or_else(|| "lagscope".to_string());
        Alert {
            incident: incident.clone(),
            labels,
            annotations,
            starts_at,
            ends_at: None,
            generator_url: link,
            severity: latest.severity,
            source,
            evidence: latest.evidence.value().clone(),
            members,
            closed: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anomaly(kind: AnomalyKind, node: &str, client: &str) -> Anomaly {
        Anomaly {
            kind,
            severity: Severity::Critical,
            cluster: Some("prod".to_string()),
            namespace: Some("ns1".to_string()),
            client_id: Some(client.to_string()),
            node_id: Some(node.to_string()),
            start_unix_nano: 1_000,
            end_unix_nano: 2_000,
            summary: "client read state 10 below its floor 12".to_string(),
            cause: "observer behind".to_string(),
            evidence: serde_json::json!({"floor": 12, "served": 10}).into(),
            open: kind.is_window(),
            fingerprint: format!("{}-{node}-{client}", kind.as_str()),
        }
    }

    #[test]
    fn reads_group_under_their_node_and_windows_stand_alone() {
        let (a, b) = (anomaly(AnomalyKind::StaleRead, "obs1", "c1"), anomaly(AnomalyKind::StaleRead, "obs1", "c2"));
        assert_eq!(incident_of(&a), incident_of(&b));
        assert_ne!(incident_of(&a), incident_of(&anomaly(AnomalyKind::StaleRead, "obs2", "c1")));
        let (w1, w2) = (anomaly(AnomalyKind::ApplyLag, "obs1", "c1"), anomaly(AnomalyKind::ApplyLag, "obs1", "c2"));
        assert_ne!(incident_of(&w1), incident_of(&w2));
        assert!(incident_of(&w1).is_window() && !incident_of(&a).is_window());
        let key = incident_of(&a).dedup_key();
        assert!(key.starts_with("lagscope-stale_read-") && key.len() < 64, "{key}");
        assert_eq!(key, incident_of(&b).dedup_key());
    }

    #[test]
    fn an_open_lag_inhibits_the_stale_reads_its_node_served_only() {
        let lag = anomaly(AnomalyKind::ApplyLag, "obs1", "-");
        assert!(inhibits(&lag, &anomaly(AnomalyKind::StaleRead, "obs1", "c1")));
        assert!(!inhibits(&lag, &anomaly(AnomalyKind::StaleRead, "obs2", "c1")));
        assert!(!inhibits(&lag, &anomaly(AnomalyKind::CarriedStateRegression, "obs1", "c1")));
        let mut resolved = lag.clone();
        resolved.open = false;
        assert!(!inhibits(&resolved, &anomaly(AnomalyKind::StaleRead, "obs1", "c1")));
    }

    #[test]
    fn routes_match_every_list_given() {
        let read = anomaly(AnomalyKind::StaleRead, "obs1", "c1");
        assert!(Route { receiver: "am".to_string(), ..Route::default() }.matches(&read));
        let critical_reads = Route {
            receiver: "pd".to_string(),
            kinds: vec!["stale_read".to_string()],
            severities: vec!["critical".to_string()],
            clusters: vec!["prod".to_string()],
            namespaces: vec![],
        };
        assert!(critical_reads.matches(&read));
        let mut warning = read.clone();
        warning.severity = Severity::Warning;
        assert!(!critical_reads.matches(&warning));
        let mut elsewhere = read;
        elsewhere.cluster = None;
        assert!(!critical_reads.matches(&elsewhere));
    }

    #[test]
    fn alert_labels_identify_the_incident_not_the_latest_read() {
        let (a, b) = (anomaly(AnomalyKind::StaleRead, "obs1", "c1"), anomaly(AnomalyKind::StaleRead, "obs1", "c2"));
        let key = incident_of(&a);
        let (first, second) =
            (Alert::of(&key, &a, 7, 1_000, 1, "http://ls/"), Alert::of(&key, &b, 9, 1_000, 2, "http://ls"));
        assert_eq!(first.labels, second.labels);
        assert_eq!(first.labels["alertname"], "stale_read");
        assert_eq!(first.labels["node"], "obs1");
        assert!(!first.labels.contains_key("client"));
        assert_eq!(second.generator_url, "http://ls/anomalies/9");
        assert!(second.annotations["summary"].contains("2 anomalies"));
        let window = anomaly(AnomalyKind::FollowerReadDisabled, "om1", "c3");
        assert_eq!(Alert::of(&incident_of(&window), &window, 1, 0, 1, "http://ls").labels["client"], "c3");
    }
}
