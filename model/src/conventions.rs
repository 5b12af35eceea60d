//! The attribute and metric names of lagscope's telemetry conventions (v1).
//!
//! This is a public contract (see `docs/telemetry-conventions.md`): names are added, never
//! renamed or removed, because users' instrumentation and captured dumps depend on them.

// Resource attributes.
pub const SERVICE_NAME: &str = "service.name";
pub const SYSTEM: &str = "lagscope.system";
pub const CLUSTER: &str = "lagscope.cluster";
pub const COMPONENT: &str = "lagscope.component";
pub const NODE_ID: &str = "lagscope.node.id";

// Span attributes.
pub const CLIENT_ID: &str = "lagscope.client.id";
pub const CALL_ID: &str = "lagscope.call.id";
pub const ATTEMPT: &str = "lagscope.attempt";
pub const NAMESPACE: &str = "lagscope.namespace";
pub const OP: &str = "lagscope.op";
pub const RPC_METHOD: &str = "rpc.method";
pub const TARGET_NODE: &str = "lagscope.target.node";
pub const TARGET_ROLE: &str = "lagscope.target.role";
pub const NODE_ROLE: &str = "lagscope.node.role";
pub const CONSISTENCY: &str = "lagscope.consistency";
pub const FOLLOWER_READ: &str = "lagscope.follower_read";
pub const STATE_CARRIED: &str = "lagscope.state.carried";
pub const STATE_RETURNED: &str = "lagscope.state.returned";
pub const STATE_SERVED: &str = "lagscope.state.served";
pub const STATE_COMMITTED: &str = "lagscope.state.committed";
pub const STATE_ROUTER: &str = "lagscope.state.router";
pub const OUTCOME: &str = "lagscope.outcome";
pub const ERROR_TYPE: &str = "error.type";
pub const REQUEUES: &str = "lagscope.requeues";
pub const RETRY_DELAY_MS: &str = "lagscope.retry.delay_ms";
pub const BYTES: &str = "lagscope.bytes";

// Span events.
pub const EVENT_FOLLOWER_READ_DISABLED: &str = "lagscope.follower_read.disabled";
pub const EVENT_FAILOVER: &str = "lagscope.failover";
pub const EVENT_CACHE_REFRESH: &str = "lagscope.cache.refresh";
pub const FAILOVER_FROM: &str = "lagscope.failover.from";
pub const FAILOVER_TO: &str = "lagscope.failover.to";
pub const FAILOVER_REASON: &str = "lagscope.failover.reason";

// Metric names.
pub const METRIC_APPLIED_STATE: &str = "lagscope.server.applied_state";
pub const METRIC_COMMITTED_STATE: &str = "lagscope.server.committed_state";
pub const METRIC_ROLE: &str = "lagscope.server.role";
pub const METRIC_REQUEUE_CALLS: &str = "lagscope.server.requeue_calls";
pub const METRIC_RPC_QUEUE_OPS: &str = "lagscope.server.rpc_queue_ops";
pub const METRIC_RPC_PROCESSING_OPS: &str = "lagscope.server.rpc_processing_ops";
pub const METRIC_ROUTER_NO_NAMENODES: &str = "lagscope.router.no_namenodes";
pub const METRIC_ROUTER_CACHED_ROLE: &str = "lagscope.router.cached_role";
pub const METRIC_SHARD_INFLIGHT_BYTES: &str = "lagscope.shard.inflight_bytes";
pub const METRIC_SHARD_LIMIT_BYTES: &str = "lagscope.shard.limit_bytes";
pub const METRIC_SHARD_REJECTIONS: &str = "lagscope.shard.rejections";
pub const METRIC_PROBE_UP: &str = "lagscope.probe.up";

/// Span attributes that the store keeps in columns of their own. Everything else a sender
/// sent is kept in the span's JSON attributes.
pub const PROMOTED_SPAN_ATTRIBUTES: &[&str] = &[
    CLIENT_ID,
    CALL_ID,
    ATTEMPT,
    NAMESPACE,
    OP,
    RPC_METHOD,
    TARGET_NODE,
    TARGET_ROLE,
    NODE_ROLE,
    CONSISTENCY,
    FOLLOWER_READ,
    STATE_CARRIED,
    STATE_RETURNED,
    STATE_SERVED,
    STATE_COMMITTED,
    STATE_ROUTER,
    OUTCOME,
    ERROR_TYPE,
    REQUEUES,
    RETRY_DELAY_MS,
    BYTES,
];

/// Resource attributes that the store keeps in columns of their own.
pub const PROMOTED_RESOURCE_ATTRIBUTES: &[&str] = &[SERVICE_NAME, SYSTEM, CLUSTER, COMPONENT, NODE_ID];
