//! Per-client causal timelines: each logical call of one client in one namespace, in client
//! order, with its attempts and what the router and the server did for each.

use serde::{Deserialize, Serialize};

use crate::span::SpanRef;
use crate::{Op, Outcome, StateId, UnixNanos};

/// How the router and server spans of an attempt were found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimelineJoin {
    /// Through the trace context (parent span ids).
    TraceContext,
    /// Through call id + client id + time, for senders that propagate no trace context.
    CallId,
    /// No router or server span was found for the attempt.
    ClientOnly,
}

/// One attempt of a call, joined across client, router and server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimelineAttempt {
    pub attempt: Option<i64>,
    pub start_unix_nano: UnixNanos,
    pub end_unix_nano: UnixNanos,
    pub client_span: SpanRef,
    pub router_spans: Vec<SpanRef>,
    pub server_spans: Vec<SpanRef>,
    pub join: TimelineJoin,
    /// Node the client sent the attempt to, and the role it believed that node had.
    pub target_node: Option<String>,
    pub target_role: Option<String>,
    /// Router node that proxied the attempt, if any.
    pub router_node: Option<String>,
    /// Node that executed the attempt and the role it had then.
    pub served_by: Option<String>,
    pub served_role: Option<String>,
    /// State the client's request carried.
    pub carried: Option<StateId>,
    /// State the router's request to the server carried (P(ns) in HDFS RBF).
    pub router_carried: Option<StateId>,
    /// Router's global state R(ns) when it proxied the attempt.
    pub router_state: Option<StateId>,
    /// Applied state of the executing node when it ran the attempt.
    pub served: Option<StateId>,
    /// State the response returned to the client.
    pub returned: Option<StateId>,
    /// Committed state known to the executing node.
    pub committed: Option<StateId>,
    pub consistency: Option<String>,
    pub follower_read: Option<bool>,
    /// The service address the client sent the attempt to (`server.address`), for clients
    /// that pick among cluster URLs (failover).
    #[serde(default)]
    pub server_address: Option<String>,
    pub outcome: Option<Outcome>,
    pub error_type: Option<String>,
    pub requeues: Option<i64>,
    /// What the metrics said at the attempt's start about the executing node and the
    /// namespace: the role it reported, its applied state, the namespace's committed state.
    #[serde(default)]
    pub reported: ReportedState,
}

/// Node and namespace state known from metrics at one moment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReportedState {
    pub node_role: Option<String>,
    pub node_applied: Option<StateId>,
    pub namespace_committed: Option<StateId>,
}

/// One logical call (all attempts sharing a call id).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimelineCall {
    pub call_id: Option<String>,
    pub op: Option<Op>,
    pub rpc_method: Option<String>,
    pub start_unix_nano: UnixNanos,
    pub end_unix_nano: UnixNanos,
    pub attempts: Vec<TimelineAttempt>,
    /// The floor this call's reads must not go below: the highest state returned by the
    /// client's earlier completed writes and served to its earlier completed reads.
    pub floor: Option<StateId>,
}

/// One client's history in one namespace, in client order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientTimeline {
    pub client_id: String,
    pub namespace: Option<String>,
    pub cluster: Option<String>,
    pub system: Option<String>,
    pub calls: Vec<TimelineCall>,
}
