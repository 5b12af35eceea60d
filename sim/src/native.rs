//! What the simulated nodes would expose natively, for scrapers: Hadoop `/jmx` JSON, Ozone
//! OMMetrics, Elasticsearch `_nodes/stats/indexing_pressure`, OpenSearch
//! `_nodes/stats/shard_indexing_pressure`, and Prometheus text. Built from the latest value
//! of every metric the run emitted, with the systems' own field names.

use std::collections::BTreeMap;
use std::fmt::Write;

use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{metric::Data, number_data_point};
use serde_json::{Value, json};

use crate::emit::Request;

/// One node's latest values: metric name → (labels → value).
#[derive(Debug, Default, Clone)]
pub struct NodeState {
    pub system: String,
    pub cluster: String,
    pub metrics: BTreeMap<String, BTreeMap<BTreeMap<String, String>, f64>>,
}

/// The latest value of every metric of every simulated node.
#[derive(Debug, Default, Clone)]
pub struct NativeState {
    pub nodes: BTreeMap<String, NodeState>,
}

fn text(value: &KeyValue) -> String {
    match value.value.as_ref().and_then(|value| value.value.as_ref()) {
        Some(any_value::Value::StringValue(text)) => text.clone(),
        Some(any_value::Value::IntValue(number)) => number.to_string(),
        Some(any_value::Value::BoolValue(flag)) => flag.to_string(),
        Some(any_value::Value::DoubleValue(number)) => number.to_string(),
        _ => String::new(),
    }
}

impl NativeState {
    /// Takes the metric points of an export request.
    pub fn observe(&mut self, request: &Request) {
        let Request::Metrics(request) = request else { return };
        for resource_metrics in &request.resource_metrics {
            let resource: BTreeMap<String, String> = resource_metrics
                .resource
                .iter()
                .flat_map(|resource| &resource.attributes)
                .map(|attribute| (attribute.key.clone(), text(attribute)))
                .collect();
            let Some(node) = resource.get("lagscope.node.id") else { continue };
            let state = self.nodes.entry(node.clone()).or_default();
            state.system = resource.get("lagscope.system").cloned().unwrap_or_default();
            state.cluster = resource.get("lagscope.cluster").cloned().unwrap_or_default();
            for metric in resource_metrics.scope_metrics.iter().flat_map(|scope| &scope.metrics) {
                let points = match &metric.data {
                    Some(Data::Gauge(gauge)) => &gauge.data_points,
                    Some(Data::Sum(sum)) => &sum.data_points,
                    _ => continue,
                };
                for point in points {
                    let labels: BTreeMap<String, String> =
                        point.attributes.iter().map(|attribute| (attribute.key.clone(), text(attribute))).collect();
                    let value = match point.value {
                        Some(number_data_point::Value::AsDouble(value)) => value,
                        Some(number_data_point::Value::AsInt(value)) => value as f64,
                        None => continue,
                    };
                    // A role gauge names the role in a label: keep only the current one.
                    let series = state.metrics.entry(metric.name.clone()).or_default();
                    if metric.name.ends_with("role") && metric.name != "lagscope.router.cached_role" {
                        series.clear();
                    }
                    series.insert(labels, value);
                }
            }
        }
    }
}

impl NodeState {
    fn value(&self, metric: &str) -> Option<f64> {
        self.metrics.get(metric).and_then(|series| series.values().copied().reduce(f64::max))
    }

    fn label_of(&self, metric: &str, label: &str) -> Option<String> {
        self.metrics.get(metric)?.keys().next()?.get(label).cloned()
    }
}

/// Hadoop `/jmx` of a NameNode or a Router, `{"beans":[...]}`.
pub fn hadoop_jmx(node: &str, state: &NodeState) -> Value {
    let number = |metric: &str| state.value(metric).unwrap_or(0.0) as i64;
    let mut beans = Vec::new();
    if state.metrics.contains_key("lagscope.router.no_namenodes")
        || state.metrics.contains_key("lagscope.router.cached_role")
    {
        beans.push(json!({
            "name": "Hadoop:service=Router,name=FederationRPC",
            "modelerType": "FederationRPCPerformanceMonitor",
            "tag.Hostname": node,
            "ProxyOps": 0,
            "ProxyOpNoNamenodes": number("lagscope.router.no_namenodes"),
            "ProxyOpFailureStandby": 0,
            "RpcServerCallQueue": number("lagscope.router.call_queue_length"),
        }));
        return json!({ "beans": beans });
    }
    let role = state.label_of("lagscope.server.role", "lagscope.node.role").unwrap_or_else(|| "standby".to_string());
    let applied = number("lagscope.server.applied_state");
    let written = state.value("lagscope.server.committed_state").map_or(applied, |value| value as i64);
    beans.push(json!({
        "name": "Hadoop:service=NameNode,name=RpcActivityForPort8020",
        "modelerType": "RpcActivityForPort8020",
        "tag.port": "8020",
        "tag.Context": "rpc",
        "tag.Hostname": node,
        "RpcQueueTimeNumOps": number("lagscope.server.rpc_queue_ops"),
        "RpcProcessingTimeNumOps": number("lagscope.server.rpc_processing_ops"),
        "RpcRequeueCalls": number("lagscope.server.requeue_calls"),
        "CallQueueLength": 0,
    }));
    beans.push(json!({
        "name": "Hadoop:service=NameNode,name=FSNamesystem",
        "modelerType": "FSNamesystem",
        "tag.Context": "dfs",
        "tag.HAState": role,
        "tag.Hostname": node,
        "LastWrittenTransactionId": written,
        "MillisSinceLastLoadedEdits": number("lagscope.server.millis_since_last_applied"),
    }));
    beans.push(json!({
        "name": "Hadoop:service=NameNode,name=NameNodeInfo",
        "modelerType": "org.apache.hadoop.hdfs.server.namenode.FSNamesystem",
        "JournalTransactionInfo": json!({
            "LastAppliedOrWrittenTxId": applied.to_string(),
            "MostRecentCheckpointTxId": (applied - applied % 1_000_000).to_string(),
        }).to_string(),
    }));
    beans.push(json!({
        "name": "Hadoop:service=NameNode,name=NameNodeStatus",
        "modelerType": "org.apache.hadoop.hdfs.server.namenode.NameNode",
        "State": role,
        "NNRole": "NameNode",
        "HostAndPort": format!("{node}:8020"),
    }));
    json!({ "beans": beans })
}

/// Ozone Manager `/jmx` with OMMetrics and OMHAMetrics.
pub fn ozone_jmx(node: &str, state: &NodeState) -> Value {
    let number = |metric: &str| state.value(metric).unwrap_or(0.0) as i64;
    let role = state.label_of("lagscope.server.role", "lagscope.node.role").unwrap_or_else(|| "follower".to_string());
    json!({ "beans": [
        {
            "name": "Hadoop:service=OzoneManager,name=OMMetrics",
            "modelerType": "OMMetrics",
            "tag.Context": "dfs",
            "tag.Hostname": node,
            "NumLinearizableRead": number("lagscope.ozone.linearizable_reads"),
            "NumLeaderSkipLinearizableRead": 0,
            "NumFollowerReadLocalLeaseSuccess": number("lagscope.ozone.local_lease_success"),
            "NumFollowerReadLocalLeaseFailLog": number("lagscope.ozone.local_lease_fail_log"),
            "NumFollowerReadLocalLeaseFailTime": number("lagscope.ozone.local_lease_fail_time"),
        },
        {
            "name": "Hadoop:service=OzoneManager,name=OMHAMetrics",
            "modelerType": "OMHAMetrics",
            "NodeId": node,
            "OzoneManagerHALeaderState": if role == "leader" { 1 } else { 0 },
        },
        {
            "name": format!("ratis:name=ratis.state_machine.{node}@omservice1"),
            "appliedIndex": state.value("lagscope.server.applied_state").unwrap_or(0.0) as i64,
        }
    ]})
}

fn shard_values(state: &NodeState, metric: &str) -> BTreeMap<String, f64> {
    state
        .metrics
        .get(metric)
        .map(|series| {
            series
                .iter()
                .filter_map(|(labels, value)| Some((labels.get("lagscope.namespace")?.clone(), *value)))
                .collect()
        })
        .unwrap_or_default()
}

/// Elasticsearch `GET _nodes/stats/indexing_pressure` for one node.
pub fn es_indexing_pressure(node: &str, state: &NodeState) -> Value {
    let inflight: f64 = shard_values(state, "lagscope.shard.inflight_bytes").values().sum();
    let rejections: f64 = shard_values(state, "lagscope.shard.rejections").values().sum();
    let limit = state.value("lagscope.shard.limit_bytes").unwrap_or(0.0);
    json!({
        "cluster_name": state.cluster,
        "nodes": { node: { "name": node, "indexing_pressure": { "memory": {
            "current": {
                "combined_coordinating_and_primary_in_bytes": inflight as i64,
                "coordinating_in_bytes": 0,
                "primary_in_bytes": inflight as i64,
                "replica_in_bytes": 0,
                "all_in_bytes": inflight as i64,
            },
            "total": {
                "combined_coordinating_and_primary_in_bytes": 0,
                "coordinating_in_bytes": 0,
                "primary_in_bytes": 0,
                "replica_in_bytes": 0,
                "all_in_bytes": 0,
                "coordinating_rejections": 0,
                "primary_rejections": rejections as i64,
                "replica_rejections": 0,
                "primary_document_rejections": 0,
            },
            "limit_in_bytes": limit as i64,
        }}}}
    })
}

/// OpenSearch `GET _nodes/stats/shard_indexing_pressure` for one node.
pub fn opensearch_shard_indexing_pressure(node: &str, state: &NodeState) -> Value {
    let inflight = shard_values(state, "lagscope.shard.inflight_bytes");
    let rejections = shard_values(state, "lagscope.shard.rejections");
    let limits = shard_values(state, "lagscope.shard.limit_bytes");
    let stats: serde_json::Map<String, Value> = inflight
        .iter()
        .map(|(namespace, bytes)| {
            let (index, shard) = namespace.split_once('/').unwrap_or((namespace.as_str(), "0"));
            let breakup = json!({ "node_limits": 0, "no_successful_request_limits": 0, "throughput_degradation_limits": 0 });
            (format!("[{index}][{shard}]"), json!({
                "memory": {
                    "current": { "coordinating_in_bytes": 0, "primary_in_bytes": *bytes as i64, "replica_in_bytes": 0 },
                    "total": { "coordinating_in_bytes": 0, "primary_in_bytes": 0, "replica_in_bytes": 0 },
                },
                "rejection": {
                    "coordinating": { "coordinating_rejections": 0, "breakup": breakup },
                    "primary": { "primary_rejections": rejections.get(namespace).copied().unwrap_or(0.0) as i64, "breakup": breakup },
                    "replica": { "replica_rejections": 0, "breakup": breakup },
                },
                "memory_allocation": {
                    "current": { "current_coordinating_and_primary_bytes": *bytes as i64, "current_replica_bytes": 0 },
                    "limit": {
                        "current_coordinating_and_primary_limits_in_bytes": limits.get(namespace).copied().unwrap_or(0.0) as i64,
                        "current_replica_limits_in_bytes": 0,
                    },
                },
            }))
        })
        .collect();
    json!({
        "cluster_name": state.cluster,
        "nodes": { node: { "name": node, "shard_indexing_pressure": {
            "stats": stats,
            "total_rejections_breakup": { "node_limits": 0, "no_successful_request_limits": 0, "throughput_degradation_limits": 0 },
            "enabled": true,
            "enforced": true,
        }}}
    })
}

/// Every metric of every node in the Prometheus text format (dots become underscores).
pub fn prometheus_text(state: &NativeState) -> String {
    let mut out = String::new();
    let mut by_metric: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (node, node_state) in &state.nodes {
        for (metric, series) in &node_state.metrics {
            let name = metric.replace(['.', '-'], "_");
            for (labels, value) in series {
                let mut all: BTreeMap<String, String> =
                    labels.iter().map(|(key, value)| (key.replace(['.', '-'], "_"), value.clone())).collect();
                all.insert("lagscope_node_id".to_string(), node.clone());
                all.insert("lagscope_cluster".to_string(), node_state.cluster.clone());
                let rendered: Vec<String> = all
                    .iter()
                    .map(|(key, value)| format!("{key}=\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\"")))
                    .collect();
                by_metric.entry(name.clone()).or_default().push(format!("{name}{{{}}} {value}", rendered.join(",")));
            }
        }
    }
    for (name, lines) in by_metric {
        let _ = writeln!(out, "# TYPE {name} gauge");
        for line in lines {
            let _ = writeln!(out, "{line}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SimConfig, run};

    #[test]
    fn native_endpoints_carry_the_systems_field_names() {
        let mut requests = Vec::new();
        let mut config = SimConfig::new("hdfs-observer-lag-storm");
        config.duration = Some(30 * crate::SECOND);
        run(&config, &mut requests).expect("runs");
        let mut state = NativeState::default();
        requests.iter().for_each(|request| state.observe(request));
        let observer = hadoop_jmx("nn-obs2", &state.nodes["nn-obs2"]);
        let text = observer.to_string();
        for field in [
            "RpcActivityForPort8020",
            "RpcQueueTimeNumOps",
            "RpcProcessingTimeNumOps",
            "RpcRequeueCalls",
            "tag.HAState",
            "JournalTransactionInfo",
            "LastAppliedOrWrittenTxId",
        ] {
            assert!(text.contains(field), "{field} missing from {text}");
        }
        assert_eq!(observer["beans"][1]["tag.HAState"], "observer");
        // nn-obs2's tailer stalls at 20 s: by 30 s it has not loaded edits for about 10 s.
        let stalled = observer["beans"][1]["MillisSinceLastLoadedEdits"].as_i64().unwrap_or(0);
        assert!((8_000..=11_000).contains(&stalled), "MillisSinceLastLoadedEdits {stalled}");
        let router = hadoop_jmx("router-1", &state.nodes["router-1"]).to_string();
        assert!(router.contains("FederationRPC") && router.contains("ProxyOpNoNamenodes"), "{router}");
        assert!(prometheus_text(&state).contains("lagscope_server_requeue_calls{"));
    }
}

#[cfg(test)]
mod ozone_tests {
    use super::*;
    use crate::{SimConfig, run};

    #[test]
    fn om_metrics_count_the_rejected_local_lease_read() {
        let mut requests = Vec::new();
        run(&SimConfig::new("ozone-follower-read-disabled"), &mut requests).expect("runs");
        let mut state = NativeState::default();
        requests.iter().for_each(|request| state.observe(request));
        let om2 = ozone_jmx("om2", &state.nodes["om2"]);
        assert_eq!(om2["beans"][0]["NumFollowerReadLocalLeaseFailTime"], 1);
        assert!(om2["beans"][0]["NumLinearizableRead"].as_i64().unwrap_or(0) > 0);
        assert_eq!(ozone_jmx("om1", &state.nodes["om1"])["beans"][1]["OzoneManagerHALeaderState"], 1);
    }
}
