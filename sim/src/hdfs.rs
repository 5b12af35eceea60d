//! HDFS Router-Based Federation with Observer NameNodes (seeds 001 and 002).

mod namenode;
mod no_namenodes;
mod observer_reads;

use opentelemetry_proto::tonic::common::v1::KeyValue;

use crate::emit::{ProcessSpec, Sink, int, string};
use crate::{ScenarioInfo, SimConfig, Truth};

pub const SCENARIOS: &[ScenarioInfo] = &[
    ScenarioInfo {
        name: "hdfs-observer-healthy",
        system: "hdfs-rbf",
        summary: "clients through two routers; writes to the active, reads to two trailing observers that requeue; no anomaly",
    },
    ScenarioInfo {
        name: "hdfs-publish-race",
        system: "hdfs-rbf",
        summary: "HDFS-17156: the client publishes a write's state after the call returns; the next read carries the old state",
    },
    ScenarioInfo {
        name: "hdfs-publish-race-fixed",
        system: "hdfs-rbf",
        summary: "HDFS-17156 fixed: state published before the call returns",
    },
    ScenarioInfo {
        name: "hdfs-stale-router-merge",
        system: "hdfs-rbf",
        summary: "HDFS-16837: a stale router's response overwrites the client's newer state instead of a max-merge",
    },
    ScenarioInfo {
        name: "hdfs-stale-router-merge-fixed",
        system: "hdfs-rbf",
        summary: "HDFS-16837 fixed: the client max-merges",
    },
    ScenarioInfo {
        name: "hdfs-pool-not-advanced",
        system: "hdfs-rbf",
        summary: "HDFS-16826: an existing connection pool is not advanced by the client's state; the router forwards less",
    },
    ScenarioInfo {
        name: "hdfs-pool-not-advanced-fixed",
        system: "hdfs-rbf",
        summary: "HDFS-16826 fixed: every request advances the pool state",
    },
    ScenarioInfo {
        name: "hdfs-future-state",
        system: "hdfs-rbf",
        summary: "a client carries a state far beyond any server's: observers answer 'too far behind', the pools it touches are poisoned",
    },
    ScenarioInfo {
        name: "hdfs-observer-lag-storm",
        system: "hdfs-rbf",
        summary: "an observer's edit tailing stalls: requeues climb, queue-time ops outrun processing-time ops, the router queue fills",
    },
    ScenarioInfo {
        name: "hdfs-no-namenodes",
        system: "hdfs-rbf",
        summary: "HDFS-17166: the router's cached membership says 'no active' after failover; about a minute of NoNamenodesAvailableException",
    },
    ScenarioInfo {
        name: "hdfs-no-namenodes-fixed",
        system: "hdfs-rbf",
        summary: "HDFS-17166 fixed: the failing NameNode is rotated to the end of the cache; one exception",
    },
];

/// Which of the known bugs a run has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Bugs {
    /// HDFS-17156: a write's state reaches the client's context after the call returned.
    publish_race: bool,
    /// HDFS-16837: the client overwrites its state with a router's response.
    overwrite_merge: bool,
    /// HDFS-16826: an existing pool is not advanced by the client's state.
    pool_not_advanced: bool,
    /// A client restored with a state far in the future.
    future_state: bool,
    /// An observer's edit tailer stalls.
    tail_stall: bool,
}

pub fn run(config: &SimConfig, sink: &mut dyn Sink) -> Option<Truth> {
    let bugs = match config.scenario.as_str() {
        "hdfs-observer-healthy"
        | "hdfs-publish-race-fixed"
        | "hdfs-stale-router-merge-fixed"
        | "hdfs-pool-not-advanced-fixed" => Bugs::default(),
        "hdfs-publish-race" => Bugs { publish_race: true, ..Bugs::default() },
        "hdfs-stale-router-merge" => Bugs { overwrite_merge: true, ..Bugs::default() },
        "hdfs-pool-not-advanced" => Bugs { pool_not_advanced: true, ..Bugs::default() },
        "hdfs-future-state" => Bugs { future_state: true, ..Bugs::default() },
        "hdfs-observer-lag-storm" => Bugs { tail_stall: true, ..Bugs::default() },
        "hdfs-no-namenodes" => return Some(no_namenodes::run(config, sink, false)),
        "hdfs-no-namenodes-fixed" => return Some(no_namenodes::run(config, sink, true)),
        _ => return None,
    };
    let read_after_write = config.scenario.starts_with("hdfs-publish-race");
    Some(observer_reads::run(config, sink, bugs, read_after_write))
}

const CLUSTER: &str = "hdfs-prod";

fn process_spec(service: &str, component: &'static str, node: &str) -> ProcessSpec {
    ProcessSpec {
        service: service.to_string(),
        system: "hdfs-rbf".to_string(),
        cluster: CLUSTER.to_string(),
        component,
        node_id: node.to_string(),
    }
}

fn call_attributes(
    client_id: &str,
    call_id: &str,
    attempt: i64,
    namespace: &str,
    op: &str,
    method: &str,
) -> Vec<KeyValue> {
    vec![
        string("lagscope.client.id", client_id),
        string("lagscope.call.id", call_id),
        int("lagscope.attempt", attempt),
        string("lagscope.namespace", namespace),
        string("lagscope.op", op),
        string("rpc.method", method),
    ]
}

fn push_state(attributes: &mut Vec<KeyValue>, key: &str, state: Option<namenode::StateId>) {
    if let Some(state) = state {
        attributes.push(int(key, state));
    }
}
