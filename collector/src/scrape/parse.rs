//! What the watched systems expose natively, to samples named by lagscope's conventions.
//! Pure: a body in, samples or an error naming what was wrong out.
//!
//! Every sample keeps the system's own name in `lagscope.source.metric` (`Bean.Attribute` for
//! JMX, the JSON path for node stats, the metric name for Prometheus), so nothing is renamed
//! out of sight. Mapped names:
//!
//! | source | lagscope metric |
//! | --- | --- |
//! | NameNode `RpcActivityForPort*.RpcQueueTimeNumOps` / `RpcProcessingTimeNumOps` / `RpcRequeueCalls` | `lagscope.server.rpc_queue_ops` / `rpc_processing_ops` / `requeue_calls` |
//! | NameNode `FSNamesystem.tag.HAState` | `lagscope.server.role` = 1 with `lagscope.node.role` |
//! | NameNode `FSNamesystem.LastWrittenTransactionId` (on the active) | `lagscope.server.committed_state` |
//! | NameNode `FSNamesystem.MillisSinceLastLoadedEdits` | `lagscope.server.millis_since_last_applied` |
//! | NameNode `NameNodeInfo.JournalTransactionInfo.LastAppliedOrWrittenTxId` | `lagscope.server.applied_state` |
//! | Router `FederationRPC.ProxyOpNoNamenodes` / `RpcServerCallQueue` | `lagscope.router.no_namenodes` / `lagscope.router.call_queue_length` |
//! | OM `OMHAMetrics.OzoneManagerHALeaderState` | `lagscope.server.role` (`leader` / `follower`) |
//! | OM `ratis.state_machine.*.appliedIndex` | `lagscope.server.applied_state` (and, on the leader, `committed_state`) |
//! | OM `OMMetrics.NumLinearizableRead`, `NumLeaderSkipLinearizableRead`, `NumFollowerReadLocalLease{Success,FailLog,FailTime}` | `lagscope.ozone.linearizable_reads`, `leader_skip_linearizable_reads`, `local_lease_success`, `local_lease_fail_log`, `local_lease_fail_time` |
//! | ES `indexing_pressure.memory.current.<role>_in_bytes` | `lagscope.shard.inflight_bytes` per `lagscope.shard.role` (node level) |
//! | ES `indexing_pressure.memory.total.<role>_rejections` | `lagscope.shard.rejections` |
//! | ES `indexing_pressure.memory.limit_in_bytes` | `lagscope.shard.limit_bytes` (replica: 1.5x, as ES sizes it) |
//! | OpenSearch `shard_indexing_pressure.stats.[index][n]` memory, rejection, memory_allocation.limit | the same three per shard (`lagscope.namespace` = `index/n`) |
//! | Prometheus `lagscope_*` with the conventions' names, `ratis_state_machine_appliedIndex` | the conventions' names; everything else kept under its own name |

use std::collections::BTreeMap;

use lagscope_model::conventions as conv;
use lagscope_model::{MetricKind, PointValue, Sample, SeriesKey, SeriesMeta, UnixNanos};
use serde_json::Value;

/// The label carrying the system's own name for a sample.
pub const SOURCE_METRIC: &str = "lagscope.source.metric";
/// The label naming the scrape target a sample came from.
pub const SCRAPE_TARGET: &str = "lagscope.scrape.target";
/// The shard role label of the shard metrics.
pub const SHARD_ROLE: &str = "lagscope.shard.role";

pub const METRIC_MILLIS_SINCE_LAST_APPLIED: &str = "lagscope.server.millis_since_last_applied";
pub const METRIC_ROUTER_CALL_QUEUE: &str = "lagscope.router.call_queue_length";

/// Builds samples with the target's labels and time.
pub struct Samples<'a> {
    labels: &'a BTreeMap<String, String>,
    time: UnixNanos,
    pub out: Vec<Sample>,
}

impl<'a> Samples<'a> {
    pub fn new(labels: &'a BTreeMap<String, String>, time: UnixNanos) -> Self {
        Self { labels, time, out: Vec::new() }
    }

    /// One sample: the target's labels, then `extra` (the target's win for cluster, namespace
    /// and node, which an operator set on purpose), the source name.
    fn push(&mut self, name: &str, kind: MetricKind, value: f64, source: &str, extra: &[(&str, &str)]) {
        if !value.is_finite() && kind != MetricKind::Gauge {
            return;
        }
        let mut labels: BTreeMap<String, String> =
            extra.iter().filter(|(_, value)| !value.is_empty()).map(|(k, v)| (k.to_string(), v.to_string())).collect();
        for (key, value) in self.labels {
            labels.insert(key.clone(), value.clone());
        }
        labels.insert(SOURCE_METRIC.to_string(), source.to_string());
        self.out.push(Sample {
            series: SeriesKey { name: name.to_string(), labels }.into(),
            meta: SeriesMeta { kind, unit: None, description: None }.into(),
            time_unix_nano: self.time,
            start_time_unix_nano: None,
            value: PointValue::Number(value),
        });
    }
}

fn number(value: &Value) -> Option<f64> {
    match value {
        Value::Number(number) => number.as_f64(),
        Value::String(text) => text.trim().parse().ok(),
        _ => None,
    }
}

fn json(body: &[u8], what: &str) -> Result<Value, String> {
    serde_json::from_slice(body).map_err(|error| format!("the body is not {what} JSON: {error}"))
}

/// Hadoop `/jmx` of a NameNode, an Observer or a Router.
pub fn hadoop_jmx(body: &[u8], samples: &mut Samples<'_>) -> Result<(), String> {
    let document = json(body, "Hadoop /jmx")?;
    let beans = document.get("beans").and_then(Value::as_array).ok_or("no \"beans\" array in the /jmx body")?;
    for bean in beans {
        let name = bean.get("name").and_then(Value::as_str).unwrap_or_default();
        let field = |key: &str| bean.get(key).and_then(number);
        let host = bean.get("tag.Hostname").and_then(Value::as_str).unwrap_or_default();
        let node = [(conv::NODE_ID, host)];
        if name.contains("name=RpcActivityForPort") {
            let bean_name = name.rsplit("name=").next().unwrap_or("RpcActivity");
            for (attribute, metric) in [
                ("RpcQueueTimeNumOps", conv::METRIC_RPC_QUEUE_OPS),
                ("RpcProcessingTimeNumOps", conv::METRIC_RPC_PROCESSING_OPS),
                ("RpcRequeueCalls", conv::METRIC_REQUEUE_CALLS),
            ] {
                if let Some(value) = field(attribute) {
                    let source = format!("{bean_name}.{attribute}");
                    samples.push(metric, MetricKind::CumulativeCounter, value, &source, &node);
                }
            }
        } else if name.ends_with("name=FSNamesystem") {
            let state = bean.get("tag.HAState").and_then(Value::as_str).unwrap_or_default();
            if !state.is_empty() {
                let extra = [(conv::NODE_ID, host), (conv::NODE_ROLE, state)];
                samples.push(conv::METRIC_ROLE, MetricKind::Gauge, 1.0, "FSNamesystem.tag.HAState", &extra);
            }
            // The active writes the edit log: its last written txid is the namespace's
            // committed state. A standby's or observer's is what it has read, not committed.
            if let Some(value) = field("LastWrittenTransactionId").filter(|_| state == "active") {
                let source = "FSNamesystem.LastWrittenTransactionId";
                samples.push(conv::METRIC_COMMITTED_STATE, MetricKind::Gauge, value, source, &node);
            }
            if let Some(value) = field("MillisSinceLastLoadedEdits") {
                let source = "FSNamesystem.MillisSinceLastLoadedEdits";
                samples.push(METRIC_MILLIS_SINCE_LAST_APPLIED, MetricKind::Gauge, value, source, &node);
            }
        } else if name.ends_with("name=NameNodeInfo") {
            // A JSON document inside a string, its numbers as strings too.
            let Some(text) = bean.get("JournalTransactionInfo").and_then(Value::as_str) else { continue };
            let info: Value = serde_json::from_str(text)
                .map_err(|error| format!("NameNodeInfo.JournalTransactionInfo is not JSON ({error}): {text:?}"))?;
            if let Some(value) = info.get("LastAppliedOrWrittenTxId").and_then(number) {
                let source = "NameNodeInfo.JournalTransactionInfo.LastAppliedOrWrittenTxId";
                samples.push(conv::METRIC_APPLIED_STATE, MetricKind::Gauge, value, source, &node);
            }
        } else if name.ends_with("name=FederationRPC") {
            if let Some(value) = field("ProxyOpNoNamenodes") {
                let source = "FederationRPC.ProxyOpNoNamenodes";
                samples.push(conv::METRIC_ROUTER_NO_NAMENODES, MetricKind::CumulativeCounter, value, source, &node);
            }
            if let Some(value) = field("RpcServerCallQueue") {
                samples.push(
                    METRIC_ROUTER_CALL_QUEUE,
                    MetricKind::Gauge,
                    value,
                    "FederationRPC.RpcServerCallQueue",
                    &node,
                );
            }
        }
    }
    Ok(())
}

/// Ozone Manager `/jmx`: OMMetrics, OMHAMetrics and the Ratis state machine.
pub fn ozone_jmx(body: &[u8], samples: &mut Samples<'_>) -> Result<(), String> {
    let document = json(body, "Ozone Manager /jmx")?;
    let beans = document.get("beans").and_then(Value::as_array).ok_or("no \"beans\" array in the /jmx body")?;
    let by_suffix = |suffix: &str| {
        beans.iter().find(|bean| bean.get("name").and_then(Value::as_str).is_some_and(|name| name.ends_with(suffix)))
    };
    let ha = by_suffix("name=OMHAMetrics");
    let metrics = by_suffix("name=OMMetrics");
    let host = ha
        .and_then(|bean| bean.get("NodeId"))
        .or_else(|| metrics.and_then(|bean| bean.get("tag.Hostname")))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let node = [(conv::NODE_ID, host)];
    let leader = ha.and_then(|bean| bean.get("OzoneManagerHALeaderState")).and_then(number).map(|state| state >= 1.0);
    if let Some(leader) = leader {
        let role = if leader { "leader" } else { "follower" };
        let extra = [(conv::NODE_ID, host), (conv::NODE_ROLE, role)];
        samples.push(conv::METRIC_ROLE, MetricKind::Gauge, 1.0, "OMHAMetrics.OzoneManagerHALeaderState", &extra);
    }
    if let Some(bean) = metrics {
        for (attribute, metric) in [
            ("NumLinearizableRead", "lagscope.ozone.linearizable_reads"),
            ("NumLeaderSkipLinearizableRead", "lagscope.ozone.leader_skip_linearizable_reads"),
            ("NumFollowerReadLocalLeaseSuccess", "lagscope.ozone.local_lease_success"),
            ("NumFollowerReadLocalLeaseFailLog", "lagscope.ozone.local_lease_fail_log"),
            ("NumFollowerReadLocalLeaseFailTime", "lagscope.ozone.local_lease_fail_time"),
        ] {
            if let Some(value) = bean.get(attribute).and_then(number) {
                samples.push(metric, MetricKind::CumulativeCounter, value, &format!("OMMetrics.{attribute}"), &node);
            }
        }
    }
    for bean in beans {
        let name = bean.get("name").and_then(Value::as_str).unwrap_or_default();
        if !name.starts_with("ratis:name=ratis.state_machine.") {
            continue;
        }
        if let Some(value) = bean.get("appliedIndex").and_then(number) {
            let source = format!("{}.appliedIndex", name.trim_start_matches("ratis:name="));
            samples.push(conv::METRIC_APPLIED_STATE, MetricKind::Gauge, value, &source, &node);
            // The leader's applied index is the closest to the commit index OM's JMX gives.
            if leader == Some(true) {
                samples.push(conv::METRIC_COMMITTED_STATE, MetricKind::Gauge, value, &source, &node);
            }
        }
    }
    Ok(())
}

const ROLES: [&str; 3] = ["coordinating", "primary", "replica"];

/// Elasticsearch `GET _nodes/stats/indexing_pressure`: per node, per role.
pub fn es_indexing_pressure(body: &[u8], samples: &mut Samples<'_>) -> Result<(), String> {
    let document = json(body, "Elasticsearch node stats")?;
    let cluster = document.get("cluster_name").and_then(Value::as_str).unwrap_or_default();
    let nodes = document.get("nodes").and_then(Value::as_object).ok_or("no \"nodes\" object in the node stats")?;
    for (id, node) in nodes {
        let name = node.get("name").and_then(Value::as_str).unwrap_or(id);
        let Some(memory) = node.pointer("/indexing_pressure/memory") else {
            return Err(format!(
                "node {name:?} has no indexing_pressure.memory: ask for _nodes/stats/indexing_pressure"
            ));
        };
        let limit = memory.get("limit_in_bytes").and_then(number);
        for role in ROLES {
            let extra = [(conv::CLUSTER, cluster), (conv::NODE_ID, name), (SHARD_ROLE, role)];
            let current = format!("indexing_pressure.memory.current.{role}_in_bytes");
            if let Some(value) = memory.pointer(&format!("/current/{role}_in_bytes")).and_then(number) {
                samples.push(conv::METRIC_SHARD_INFLIGHT_BYTES, MetricKind::Gauge, value, &current, &extra);
            }
            let rejections = format!("indexing_pressure.memory.total.{role}_rejections");
            if let Some(value) = memory.pointer(&format!("/total/{role}_rejections")).and_then(number) {
                samples.push(conv::METRIC_SHARD_REJECTIONS, MetricKind::CumulativeCounter, value, &rejections, &extra);
            }
            if let Some(limit) = limit {
                // Replicas get 1.5x the coordinating-and-primary limit.
                let limit = if role == "replica" { limit * 1.5 } else { limit };
                let source = "indexing_pressure.memory.limit_in_bytes";
                samples.push(conv::METRIC_SHARD_LIMIT_BYTES, MetricKind::Gauge, limit, source, &extra);
            }
        }
    }
    Ok(())
}

/// OpenSearch `GET _nodes/stats/shard_indexing_pressure`: per shard, per role.
pub fn opensearch_shard_indexing_pressure(body: &[u8], samples: &mut Samples<'_>) -> Result<(), String> {
    let document = json(body, "OpenSearch node stats")?;
    let cluster = document.get("cluster_name").and_then(Value::as_str).unwrap_or_default();
    let nodes = document.get("nodes").and_then(Value::as_object).ok_or("no \"nodes\" object in the node stats")?;
    for (id, node) in nodes {
        let name = node.get("name").and_then(Value::as_str).unwrap_or(id);
        let Some(stats) = node.pointer("/shard_indexing_pressure/stats").and_then(Value::as_object) else {
            return Err(format!(
                "node {name:?} has no shard_indexing_pressure.stats: ask for _nodes/stats/shard_indexing_pressure"
            ));
        };
        for (shard, stat) in stats {
            // "[index][0]" → "index/0"
            let namespace = shard.trim_start_matches('[').trim_end_matches(']').replace("][", "/");
            for role in ROLES {
                let extra = [
                    (conv::CLUSTER, cluster),
                    (conv::NODE_ID, name),
                    (conv::NAMESPACE, &namespace),
                    (SHARD_ROLE, role),
                ];
                let path = |tail: &str| format!("shard_indexing_pressure.stats.{shard}.{tail}");
                if let Some(value) = stat.pointer(&format!("/memory/current/{role}_in_bytes")).and_then(number) {
                    let source = path(&format!("memory.current.{role}_in_bytes"));
                    samples.push(conv::METRIC_SHARD_INFLIGHT_BYTES, MetricKind::Gauge, value, &source, &extra);
                }
                if let Some(value) = stat.pointer(&format!("/rejection/{role}/{role}_rejections")).and_then(number) {
                    let source = path(&format!("rejection.{role}.{role}_rejections"));
                    samples.push(conv::METRIC_SHARD_REJECTIONS, MetricKind::CumulativeCounter, value, &source, &extra);
                }
                let limit_field = if role == "replica" {
                    "current_replica_limits_in_bytes"
                } else {
                    "current_coordinating_and_primary_limits_in_bytes"
                };
                if let Some(value) = stat.pointer(&format!("/memory_allocation/limit/{limit_field}")).and_then(number) {
                    let source = path(&format!("memory_allocation.limit.{limit_field}"));
                    samples.push(conv::METRIC_SHARD_LIMIT_BYTES, MetricKind::Gauge, value, &source, &extra);
                }
            }
        }
    }
    Ok(())
}

/// The conventions' metric and label names as Prometheus writes them (dots to underscores).
fn convention_names() -> BTreeMap<String, &'static str> {
    [
        conv::METRIC_APPLIED_STATE,
        conv::METRIC_COMMITTED_STATE,
        conv::METRIC_ROLE,
        conv::METRIC_REQUEUE_CALLS,
        conv::METRIC_RPC_QUEUE_OPS,
        conv::METRIC_RPC_PROCESSING_OPS,
        conv::METRIC_ROUTER_NO_NAMENODES,
        conv::METRIC_ROUTER_CACHED_ROLE,
        conv::METRIC_SHARD_INFLIGHT_BYTES,
        conv::METRIC_SHARD_LIMIT_BYTES,
        conv::METRIC_SHARD_REJECTIONS,
        conv::METRIC_PROBE_UP,
        METRIC_MILLIS_SINCE_LAST_APPLIED,
        METRIC_ROUTER_CALL_QUEUE,
        conv::CLUSTER,
        conv::NAMESPACE,
        conv::NODE_ID,
        conv::NODE_ROLE,
        conv::TARGET_NODE,
        conv::SYSTEM,
        SHARD_ROLE,
        "lagscope.probe.kind",
        "server.address",
        "server.port",
    ]
    .into_iter()
    .map(|name| (name.replace('.', "_"), name))
    .collect()
}

/// The Prometheus text exposition format (version 0.0.4).
pub fn prometheus_text(body: &[u8], samples: &mut Samples<'_>) -> Result<(), String> {
    let text = std::str::from_utf8(body).map_err(|error| format!("the body is not UTF-8: {error}"))?;
    let names = convention_names();
    let mut kinds: BTreeMap<&str, MetricKind> = BTreeMap::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.split_whitespace();
            if let (Some("TYPE"), Some(name), Some(kind)) = (words.next(), words.next(), words.next()) {
                let kind = match kind {
                    "counter" => MetricKind::CumulativeCounter,
                    _ => MetricKind::Gauge,
                };
                kinds.insert(name, kind);
            }
            continue;
        }
        let (name, labels, value) =
            prometheus_line(line).map_err(|message| format!("line {}: {message}: {line:?}", index + 1))?;
        let kind = kinds.get(name).copied().unwrap_or(MetricKind::Gauge);
        let mut extra: Vec<(String, String)> = labels
            .into_iter()
            .map(|(key, value)| (names.get(&key).map_or(key, |name| name.to_string()), value))
            .collect();
        let mapped = if name == "ratis_state_machine_appliedIndex" {
            // Ozone's rewrite puts the peer in `instance`.
            if let Some((_, instance)) = extra.iter().find(|(key, _)| key == "instance") {
                extra.push((conv::NODE_ID.to_string(), instance.clone()));
            }
            conv::METRIC_APPLIED_STATE.to_string()
        } else {
            names.get(name).map_or_else(|| name.to_string(), |mapped| mapped.to_string())
        };
        let extra: Vec<(&str, &str)> = extra.iter().map(|(key, value)| (key.as_str(), value.as_str())).collect();
        samples.push(&mapped, kind, value, name, &extra);
    }
    Ok(())
}

/// A sample line's name, labels and value.
type PrometheusSample<'a> = (&'a str, Vec<(String, String)>, f64);

/// `name{label="value",...} value [timestamp]`.
fn prometheus_line(line: &str) -> Result<PrometheusSample<'_>, String> {
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace()).ok_or("a sample without a value")?;
    let name = &line[..name_end];
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
        return Err(format!("invalid metric name {name:?}"));
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        let mut chars = after.char_indices().peekable();
        let mut end = None;
        loop {
            while chars.peek().is_some_and(|(_, c)| c.is_whitespace() || *c == ',') {
                chars.next();
            }
            let Some(&(start, c)) = chars.peek() else { break };
            if c == '}' {
                end = Some(start + 1);
                break;
            }
            let key_start = start;
            while chars.peek().is_some_and(|(_, c)| *c != '=') {
                chars.next();
            }
            let Some((equals, _)) = chars.next() else { return Err("a label without '='".to_string()) };
            let key = after[key_start..equals].trim().to_string();
            if chars.next().map(|(_, c)| c) != Some('"') {
                return Err(format!("label {key:?} has no quoted value"));
            }
            let mut value = String::new();
            loop {
                match chars.next() {
                    Some((_, '\\')) => match chars.next() {
                        Some((_, 'n')) => value.push('\n'),
                        Some((_, other)) => value.push(other),
                        None => return Err("an unterminated label value".to_string()),
                    },
                    Some((_, '"')) => break,
                    Some((_, other)) => value.push(other),
                    None => return Err("an unterminated label value".to_string()),
                }
            }
            labels.push((key, value));
        }
        let end = end.ok_or("labels without a closing '}'")?;
        rest = &after[end..];
    }
    let value_text = rest.split_whitespace().next().ok_or("a sample without a value")?;
    let value = match value_text {
        "+Inf" | "Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        other => other.parse().map_err(|_| format!("invalid value {other:?}"))?,
    };
    Ok((name, labels, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(
        parser: fn(&[u8], &mut Samples<'_>) -> Result<(), String>,
        body: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<Vec<Sample>, String> {
        let mut samples = Samples::new(labels, 1_000);
        parser(body.as_bytes(), &mut samples)?;
        Ok(samples.out)
    }

    fn find<'a>(samples: &'a [Sample], name: &str) -> Vec<&'a Sample> {
        samples.iter().filter(|sample| sample.series.name == name).collect()
    }

    /// The sample body of the reference (public exporter fixtures), unchanged.
    const REAL_RPC_ACTIVITY: &str = r#"{"beans":[{"name":"Hadoop:service=NameNode,name=RpcActivityForPort8020","modelerType":"RpcActivityForPort8020",
 "tag.port":"8020","tag.Context":"rpc","tag.NumOpenConnectionsPerUser":"{\"hive\":11}","tag.Hostname":"nn1",
 "ReceivedBytes":1505609759776,"SentBytes":4366768779986,"RpcQueueTimeNumOps":6291228413,"RpcQueueTimeAvgTime":0.0296,
 "RpcProcessingTimeNumOps":6291228413,"RpcProcessingTimeAvgTime":0.1285,"RpcAuthenticationFailures":0,
 "RpcClientBackoff":0,"RpcSlowCalls":0,"NumOpenConnections":0,"CallQueueLength":0}]}"#;

    #[test]
    fn a_real_rpc_activity_bean_maps_to_the_queue_and_processing_counters() {
        let labels = BTreeMap::from([(conv::CLUSTER.to_string(), "prod".to_string())]);
        let samples = parse(hadoop_jmx, REAL_RPC_ACTIVITY, &labels).expect("parses");
        let queue = find(&samples, conv::METRIC_RPC_QUEUE_OPS);
        assert_eq!(queue.len(), 1);
        assert_eq!(queue[0].value, PointValue::Number(6_291_228_413.0));
        assert_eq!(queue[0].meta.kind, MetricKind::CumulativeCounter);
        assert_eq!(queue[0].series.label(conv::NODE_ID), Some("nn1"));
        assert_eq!(queue[0].series.label(conv::CLUSTER), Some("prod"));
        assert_eq!(queue[0].series.label(SOURCE_METRIC), Some("RpcActivityForPort8020.RpcQueueTimeNumOps"));
        assert!(find(&samples, conv::METRIC_REQUEUE_CALLS).is_empty(), "no RpcRequeueCalls in this bean");
    }

    #[test]
    fn journal_transaction_info_is_json_inside_a_string_with_string_numbers() {
        let body = r#"{"beans":[
            {"name":"Hadoop:service=NameNode,name=FSNamesystem","tag.HAState":"observer","tag.Hostname":"nn3",
             "LastWrittenTransactionId":18100,"MillisSinceLastLoadedEdits":2500},
            {"name":"Hadoop:service=NameNode,name=NameNodeInfo",
             "JournalTransactionInfo":"{\"LastAppliedOrWrittenTxId\":\"18187\",\"MostRecentCheckpointTxId\":\"18186\"}"}]}"#;
        let labels = BTreeMap::from([(conv::NODE_ID.to_string(), "nn3".to_string())]);
        let samples = parse(hadoop_jmx, body, &labels).expect("parses");
        assert_eq!(find(&samples, conv::METRIC_APPLIED_STATE)[0].value, PointValue::Number(18_187.0));
        assert!(find(&samples, conv::METRIC_COMMITTED_STATE).is_empty(), "an observer does not commit");
        let role = find(&samples, conv::METRIC_ROLE);
        assert_eq!(role[0].series.label(conv::NODE_ROLE), Some("observer"));
        assert_eq!(find(&samples, METRIC_MILLIS_SINCE_LAST_APPLIED)[0].value, PointValue::Number(2_500.0));

        let broken = body.replace("{\\\"LastApplied", "{\\\"LastApplied\\\"");
        let error = parse(hadoop_jmx, &broken, &labels).expect_err("broken inner JSON");
        assert!(error.contains("JournalTransactionInfo"), "{error}");
    }

    #[test]
    fn bodies_that_are_not_what_the_target_says_are_refused_by_name() {
        let labels = BTreeMap::new();
        let error = parse(hadoop_jmx, "<html>login</html>", &labels).expect_err("html");
        assert!(error.contains("not Hadoop /jmx JSON"), "{error}");
        let error = parse(es_indexing_pressure, r#"{"nodes":{"x":{"name":"es1"}}}"#, &labels).expect_err("wrong stats");
        assert!(error.contains("indexing_pressure") && error.contains("es1"), "{error}");
        let error = parse(prometheus_text, "up{job=\"a\" 1\n", &labels).expect_err("unterminated");
        assert!(error.starts_with("line 1:"), "{error}");
        let error = parse(prometheus_text, "# TYPE x gauge\nx not-a-number\n", &labels).expect_err("value");
        assert!(error.contains("line 2") && error.contains("not-a-number"), "{error}");
    }

    #[test]
    fn prometheus_text_maps_the_conventions_and_keeps_everything_else() {
        let body = "# HELP lagscope_server_applied_state x\n# TYPE lagscope_server_applied_state gauge\n\
            lagscope_server_applied_state{lagscope_node_id=\"om2\",lagscope_namespace=\"omservice1\"} 1234\n\
            # TYPE ratis_state_machine_appliedIndex gauge\n\
            ratis_state_machine_appliedIndex{instance=\"om3\",group=\"g1\"} 99 1764435600000\n\
            # TYPE http_requests_total counter\n\
            http_requests_total{path=\"/a \\\"b\\\"\",code=\"200\"} 7\n";
        let samples = parse(prometheus_text, body, &BTreeMap::new()).expect("parses");
        let applied = find(&samples, conv::METRIC_APPLIED_STATE);
        assert_eq!(applied.len(), 2);
        assert_eq!(applied[0].series.label(conv::NODE_ID), Some("om2"));
        assert_eq!(applied[0].series.label(conv::NAMESPACE), Some("omservice1"));
        assert_eq!(applied[1].series.label(conv::NODE_ID), Some("om3"));
        assert_eq!(applied[1].series.label(SOURCE_METRIC), Some("ratis_state_machine_appliedIndex"));
        let other = find(&samples, "http_requests_total");
        assert_eq!(other[0].meta.kind, MetricKind::CumulativeCounter);
        assert_eq!(other[0].series.label("path"), Some("/a \"b\""));
    }
}
