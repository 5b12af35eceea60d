//! Log lines that carry the failures lagscope explains, recognised by the exact texts the
//! systems print (../shared/reference/native-telemetry.md), turned into events:
//!
//! | event | the line (source) |
//! | --- | --- |
//! | `no_namenodes` | `Cannot get available namenode for {nsId} {rpcAddress} error: {msg}` (RouterRpcClient), or `No namenodes available under nameservice {nsId}` (NoNamenodesAvailableException) |
//! | `follower_read_disabled` | `Encountered OMNotLeaderException from {peer}. Disable OM follower read and retry OM leader directly.` (HadoopRpcOMFollowerReadFailoverProxyProvider, GrpcOmTransport) |
//! | `observer_too_far_behind` | `Observer Node is too far behind: serverStateId = {X} clientStateId = {Y}` (GlobalStateIdContext) |
//! | `cluster_switch` | `Current Pulsar service is {url}, it has been down for {n} ms, switch to the service {url}. ...` and `... switch back to the primary service` (AutoClusterFailover) |
//! | `indexing_rejected` | `rejected execution of {coordinating|primary|replica} operation [...]` (Elasticsearch, OpenSearch shard indexing pressure) |
//!
//! Used by the detectors, in the batch and the streaming analyzer alike:
//! - `no_namenodes` lines logged by a router (resource `lagscope.component` = `router`)
//!   without trace context are answers of that router to `no_namenodes_window`; a line with
//!   trace context belongs to a router span that already counts;
//! - `cluster_switch` lines of a client that names itself (`lagscope.client.id`) are its
//!   switches for `failover_flapping`: such a client is judged by the switches it logged (its
//!   own decisions), not by where its calls went;
//! - `follower_read_disabled` lines of a client that names itself are, for
//!   `follower_read_disabled`, what a rejected follower read is: the client (whose provider
//!   may retry the rejection inside one attempt) is caught if its later reads never go to a
//!   follower.
//!
//! And as evidence ([`attach_evidence`]): an observer's `too far behind` lines are attached to
//! the `untrusted_state` anomalies of its namespace in their window (the server's own words
//! for the future state a client carried), and Elasticsearch/OpenSearch rejection lines to the
//! `shard_pressure` and `unfair_rejection` anomalies of their node (and shard, when the line
//! names it), with the bytes the node printed.

use std::collections::BTreeMap;

use lagscope_model::conventions::{CLIENT_ID, NAMESPACE};
use lagscope_model::{Component, LogRecord, UnixNanos};
use serde::{Deserialize, Serialize};

/// The longest line kept in an event.
const MAX_TEXT: usize = 1024;

/// Phrases every recognised line contains (a store can pre-select candidate lines with them;
/// [`classify`] decides).
pub const PHRASES: &[&str] = &[
    "Cannot get available namenode for ",
    "No namenodes available under nameservice ",
    "Disable OM follower read and retry OM leader directly",
    "Observer Node is too far behind",
    "switch to the service ",
    "switch back to the primary service",
    "rejected execution of ",
];

/// The most lines kept for evidence (the most recent): rejection lines can come by the
/// thousand a second from a node under pressure.
pub const MAX_EVIDENCE_LINES: usize = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogEventKind {
    NoNamenodes,
    FollowerReadDisabled,
    ObserverTooFarBehind,
    ClusterSwitch,
    IndexingRejected,
}

impl LogEventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoNamenodes => "no_namenodes",
            Self::FollowerReadDisabled => "follower_read_disabled",
            Self::ObserverTooFarBehind => "observer_too_far_behind",
            Self::ClusterSwitch => "cluster_switch",
            Self::IndexingRejected => "indexing_rejected",
        }
    }
}

/// One recognised line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogEvent {
    pub kind: LogEventKind,
    pub time_unix_nano: UnixNanos,
    pub cluster: Option<String>,
    /// The namespace the line names, else the record's `lagscope.namespace` attribute.
    pub namespace: Option<String>,
    /// The node that logged the line.
    pub node_id: Option<String>,
    pub component: Option<Component>,
    /// `lagscope.client.id` of the record, for lines logged by clients.
    pub client_id: Option<String>,
    /// Whether the record carried trace context (then its span tells the same story).
    pub traced: bool,
    /// What the line says, by name: `namenode`, `server_state`, `client_state`, `from`, `to`,
    /// `role`, `shard`, `peer`, ...
    pub fields: BTreeMap<String, String>,
    pub text: String,
}

impl LogEvent {
    /// What tells this line from every other: its time and a hash of what it says, who logged
    /// it and where. A line with the same identity is the same line sent again (an exporter
    /// retried the request), as Loki takes an identical line at an identical time in a stream
    /// once; two lines of one logger differ in time or text.
    pub fn identity(&self) -> (UnixNanos, u64) {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::hash::DefaultHasher::new();
        (self.kind, &self.cluster, &self.namespace, &self.node_id, &self.client_id, &self.text).hash(&mut hasher);
        self.component.as_ref().map(Component::as_str).hash(&mut hasher);
        (self.time_unix_nano, hasher.finish())
    }

    /// A NoNamenodesAvailable answer of the router that logged it, not already a span's.
    pub fn router_answer(&self) -> Option<&str> {
        (self.kind == LogEventKind::NoNamenodes && !self.traced && self.component == Some(Component::Router))
            .then_some(self.node_id.as_deref())
            .flatten()
    }
}

impl LogEventKind {
    /// Lines kept only to be attached to anomalies as evidence.
    pub fn is_evidence(self) -> bool {
        matches!(self, Self::ObserverTooFarBehind | Self::IndexingRejected)
    }
}

/// The lines an anomaly of `kind` takes as evidence ([`attach_evidence`]), if any.
pub fn evidence_of(kind: lagscope_model::AnomalyKind) -> Option<LogEventKind> {
    use lagscope_model::AnomalyKind;
    match kind {
        AnomalyKind::UntrustedState => Some(LogEventKind::ObserverTooFarBehind),
        AnomalyKind::ShardPressure | AnomalyKind::UnfairRejection => Some(LogEventKind::IndexingRejected),
        _ => None,
    }
}

/// Attaches the evidence lines (`events`, in time order, at most [`MAX_EVIDENCE_LINES`] of
/// them, the most recent) to the anomalies they bear on: `evidence.log_lines` = how many, the
/// first and the last line. The same pass for the batch and the streaming analyzer.
pub fn attach_evidence<E: std::borrow::Borrow<LogEvent>>(anomalies: &mut [lagscope_model::Anomaly], events: &[E]) {
    let events = &events[events.len().saturating_sub(MAX_EVIDENCE_LINES)..];
    for anomaly in anomalies.iter_mut() {
        let Some(wanted) = evidence_of(anomaly.kind) else { continue };
        let (start, end) = (anomaly.start_unix_nano, anomaly.end_unix_nano);
        let from = events.partition_point(|event| event.borrow().time_unix_nano < start);
        let matching: Vec<&LogEvent> = events[from..]
            .iter()
            .map(std::borrow::Borrow::borrow)
            .take_while(|event| event.time_unix_nano <= end)
            .filter(|event| {
                event.kind == wanted
                    && event.cluster == anomaly.cluster
                    && match wanted {
                        // An observer's line names no namespace unless its record does.
                        LogEventKind::ObserverTooFarBehind => {
                            event.namespace.is_none() || event.namespace == anomaly.namespace
                        }
                        _ => {
                            event.node_id == anomaly.node_id
                                && (event.namespace.is_none() || event.namespace == anomaly.namespace)
                        }
                    }
            })
            .collect();
        let (Some(first), Some(last)) = (matching.first(), matching.last()) else { continue };
        anomaly.evidence.insert(
            "log_lines",
            serde_json::json!({
                "count": matching.len(),
                "first": first.text,
                "first_node": first.node_id,
                "last": last.text,
            }),
        );
    }
}

/// Keeps the first of the events with one [`LogEvent::identity`]: the others are the same
/// line sent again.
pub fn take_once<E: std::borrow::Borrow<LogEvent>>(events: &mut Vec<E>) {
    take_once_by(events, |event| event.borrow().identity());
}

/// [`take_once`] of items whose identity is known already (`identity`: each item's).
pub fn take_once_by<T>(items: &mut Vec<T>, identity: impl Fn(&T) -> (UnixNanos, u64)) {
    let mut seen = std::collections::HashSet::with_capacity(items.len());
    items.retain(|item| seen.insert(identity(item)));
}

/// The event a log record carries, if it is one of the recognised lines.
pub fn classify(log: &LogRecord) -> Option<LogEvent> {
    let body = log.body_text();
    let (kind, fields) = recognise(&body)?;
    let attribute = |key: &str| log.attributes.get(key).and_then(|value| value.as_str()).map(str::to_string);
    // The line's own namespace (a nameservice, an `index/shard`), else the record's.
    let namespace = fields.get("namespace").or_else(|| fields.get("shard")).cloned().or_else(|| attribute(NAMESPACE));
    let mut text = body;
    if text.len() > MAX_TEXT {
        let mut cut = MAX_TEXT;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    Some(LogEvent {
        kind,
        time_unix_nano: log.time_unix_nano,
        cluster: log.resource.cluster.clone(),
        namespace,
        node_id: log.resource.node_id.clone(),
        component: log.resource.component.clone(),
        client_id: attribute(CLIENT_ID),
        traced: log.span_id.is_some(),
        fields,
        text,
    })
}

/// The word after `marker` in `text` (up to whitespace, trimmed of `.`/`,`).
fn word_after<'a>(text: &'a str, marker: &str) -> Option<&'a str> {
    let rest = &text[text.find(marker)? + marker.len()..];
    let word = rest.split_whitespace().next()?;
    Some(word.trim_end_matches(['.', ',', ';']))
}

fn recognise(text: &str) -> Option<(LogEventKind, BTreeMap<String, String>)> {
    let mut fields = BTreeMap::new();
    let mut put = |key: &str, value: Option<&str>| {
        if let Some(value) = value.filter(|value| !value.is_empty()) {
            fields.insert(key.to_string(), value.to_string());
        }
    };
    let kind = if let Some(at) = text.find("Cannot get available namenode for ") {
        // Cannot get available namenode for {nsId} {rpcAddress} error: {msg}
        let mut words = text[at + "Cannot get available namenode for ".len()..].split_whitespace();
        put("namespace", words.next());
        put("namenode", words.next().filter(|word| *word != "error:"));
        LogEventKind::NoNamenodes
    } else if text.contains("No namenodes available under nameservice ") {
        put("namespace", word_after(text, "No namenodes available under nameservice "));
        LogEventKind::NoNamenodes
    } else if text.contains("Disable OM follower read and retry OM leader directly") {
        put("peer", word_after(text, "Encountered OMNotLeaderException from "));
        LogEventKind::FollowerReadDisabled
    } else if text.contains("Observer Node is too far behind") {
        put("server_state", word_after(text, "serverStateId = "));
        put("client_state", word_after(text, "clientStateId = "));
        LogEventKind::ObserverTooFarBehind
    } else if text.contains("switch back to the primary service") {
        put("from", word_after(text, "Current Pulsar service is secondary: "));
        put("to", word_after(text, "the primary service: "));
        LogEventKind::ClusterSwitch
    } else if text.contains("switch to the service ") && !text.contains("Failed to switch to service") {
        put("from", word_after(text, "Current Pulsar service is "));
        put("to", word_after(text, "switch to the service "));
        put("down_ms", word_after(text, "it has been down for "));
        LogEventKind::ClusterSwitch
    } else if let Some(role) = ["coordinating", "primary", "replica"]
        .into_iter()
        .find(|role| text.contains(&format!("rejected execution of {role} operation")))
    {
        put("role", Some(role));
        // OpenSearch names the shard: shard_detail=[index][0][P]
        if let Some(detail) = word_after(text, "shard_detail=") {
            let shard = detail.trim_start_matches('[').split("][").take(2).collect::<Vec<_>>().join("/");
            put("shard", Some(&shard));
        }
        LogEventKind::IndexingRejected
    } else {
        return None;
    };
    Some((kind, fields))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind_and_fields(text: &str) -> (LogEventKind, BTreeMap<String, String>) {
        recognise(text).unwrap_or_else(|| panic!("not recognised: {text}"))
    }

    #[test]
    fn the_systems_own_lines_are_recognised_with_their_fields() {
        let (kind, fields) = kind_and_fields(
            "Cannot get available namenode for ns1 nn1.example:8020 error: \
             No namenodes available under nameservice ns1",
        );
        assert_eq!(kind, LogEventKind::NoNamenodes);
        assert_eq!(fields["namespace"], "ns1");
        assert_eq!(fields["namenode"], "nn1.example:8020");
        let (kind, fields) = kind_and_fields(
            "org.apache.hadoop.hdfs.server.federation.router.NoNamenodesAvailableException: \
             No namenodes available under nameservice ns2",
        );
        assert_eq!((kind, fields["namespace"].as_str()), (LogEventKind::NoNamenodes, "ns2"));
        let (kind, fields) = kind_and_fields(
            "Encountered OMNotLeaderException from om2. Disable OM follower read and retry OM leader directly.",
        );
        assert_eq!((kind, fields["peer"].as_str()), (LogEventKind::FollowerReadDisabled, "om2"));
        let (kind, fields) =
            kind_and_fields("Observer Node is too far behind: serverStateId = 1200 clientStateId = 99999");
        assert_eq!(kind, LogEventKind::ObserverTooFarBehind);
        assert_eq!((fields["server_state"].as_str(), fields["client_state"].as_str()), ("1200", "99999"));
        let (kind, fields) = kind_and_fields(
            "Current Pulsar service is pulsar://a:6650, it has been down for 31000 ms, switch to the service \
             pulsar://b:6650. The current service down at 1764435600000",
        );
        assert_eq!(kind, LogEventKind::ClusterSwitch);
        assert_eq!((fields["from"].as_str(), fields["to"].as_str()), ("pulsar://a:6650", "pulsar://b:6650"));
        assert_eq!(fields["down_ms"], "31000");
        let (_, fields) = kind_and_fields(
            "Current Pulsar service is secondary: pulsar://b:6650, the primary service: pulsar://a:6650 has been \
             recover for 61000 ms, switch back to the primary service",
        );
        assert_eq!((fields["from"].as_str(), fields["to"].as_str()), ("pulsar://b:6650", "pulsar://a:6650"));
        let (kind, fields) = kind_and_fields(
            "rejected execution of primary operation [shard_detail=[logs-2026][3][P], \
             shard_coordinating_and_primary_bytes=1024, shard_operation_bytes=10]",
        );
        assert_eq!(kind, LogEventKind::IndexingRejected);
        assert_eq!((fields["role"].as_str(), fields["shard"].as_str()), ("primary", "logs-2026/3"));
        let (_, fields) = kind_and_fields(
            "rejected execution of coordinating operation [coordinating_and_primary_bytes=0, replica_bytes=0]",
        );
        assert_eq!(fields.get("shard"), None);
    }

    #[test]
    fn every_recognised_line_contains_one_of_the_phrases() {
        for text in [
            "Cannot get available namenode for ns1 nn1:8020 error: x",
            "No namenodes available under nameservice ns2",
            "Encountered OMNotLeaderException from om2. Disable OM follower read and retry OM leader directly.",
            "Observer Node is too far behind: serverStateId = 1 clientStateId = 2",
            "Current Pulsar service is a, it has been down for 1 ms, switch to the service b. x",
            "Current Pulsar service is secondary: b, the primary service: a has been recover for 1 ms, switch back to \
             the primary service",
            "rejected execution of replica operation [x]",
        ] {
            assert!(recognise(text).is_some(), "{text}");
            assert!(PHRASES.iter().any(|phrase| text.contains(phrase)), "{text}");
        }
    }

    #[test]
    fn other_lines_and_near_misses_are_not_events() {
        for text in [
            "Failed to switch to service pulsar://b:6650, because it is not available",
            "Observer Node is healthy",
            "Cannot get available datanode",
            "rejected execution of unknown operation",
            "",
        ] {
            assert_eq!(recognise(text), None, "{text}");
        }
    }
}

#[cfg(test)]
mod evidence_tests {
    use lagscope_model::{Anomaly, AnomalyKind, Severity};

    use super::*;

    const SECOND: i64 = 1_000_000_000;

    fn anomaly(kind: AnomalyKind, node: Option<&str>, namespace: &str, start: i64, end: i64) -> Anomaly {
        Anomaly {
            kind,
            severity: Severity::Warning,
            cluster: Some("c".to_string()),
            namespace: Some(namespace.to_string()),
            client_id: None,
            node_id: node.map(str::to_string),
            start_unix_nano: start * SECOND,
            end_unix_nano: end * SECOND,
            summary: String::new(),
            cause: String::new(),
            evidence: lagscope_model::Evidence::empty(),
            open: false,
            fingerprint: String::new(),
        }
    }

    fn event(text: &str, node: &str, at: i64) -> LogEvent {
        let (kind, fields) = recognise(text).expect("recognised");
        LogEvent {
            kind,
            time_unix_nano: at * SECOND,
            cluster: Some("c".to_string()),
            namespace: fields.get("shard").cloned(),
            node_id: Some(node.to_string()),
            component: None,
            client_id: None,
            traced: false,
            fields,
            text: text.to_string(),
        }
    }

    #[test]
    fn rejection_and_too_far_behind_lines_are_attached_to_the_anomalies_they_bear_on() {
        let shard_line = "rejected execution of primary operation [shard_detail=[logs][3][P], shard_operation_bytes=9]";
        let node_line =
            "rejected execution of coordinating operation [coordinating_and_primary_bytes=1, replica_bytes=0]";
        let other_shard =
            "rejected execution of primary operation [shard_detail=[logs][4][P], shard_operation_bytes=9]";
        let behind = "Observer Node is too far behind: serverStateId = 100 clientStateId = 9000000";
        let events = vec![
            event(shard_line, "es-1", 5),   // before the window
            event(shard_line, "es-1", 10),  // in
            event(other_shard, "es-1", 12), // another shard of the node
            event(node_line, "es-1", 15),   // the node's, no shard named: in
            event(shard_line, "es-2", 16),  // another node
            event(behind, "nn-obs-1", 20),  // for the untrusted state
            event(shard_line, "es-1", 61),  // after the window
        ];
        let mut anomalies = vec![
            anomaly(AnomalyKind::UnfairRejection, Some("es-1"), "logs/3", 10, 60),
            anomaly(AnomalyKind::UntrustedState, None, "ns1", 18, 30),
            anomaly(AnomalyKind::StaleRead, Some("es-1"), "logs/3", 10, 60),
        ];
        attach_evidence(&mut anomalies, &events);
        let lines = &anomalies[0].evidence["log_lines"];
        assert_eq!(lines["count"], 2, "{lines}");
        assert_eq!(lines["first"], shard_line);
        assert_eq!(lines["last"], node_line);
        assert_eq!(anomalies[1].evidence["log_lines"]["count"], 1);
        assert_eq!(anomalies[1].evidence["log_lines"]["first_node"], "nn-obs-1");
        assert_eq!(anomalies[2].evidence, lagscope_model::Evidence::empty(), "other kinds take no lines");
    }
}
