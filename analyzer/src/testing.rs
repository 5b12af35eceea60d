//! What the unit tests share.

use lagscope_model::{CallFields, Component, Op, Outcome, ResourceFields, Span, SpanKind, StateFields, UnixNanos};

/// xorshift64*: the same cases on every run.
pub struct Random(pub u64);

impl Random {
    /// A number below `bound`.
    pub fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % bound
    }

    /// One of `from`.
    pub fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.below(from.len() as u64) as usize]
    }
}

/// A deterministic stream of numbers.
pub struct Numbers(pub u64);

impl Numbers {
    pub fn below(&mut self, bound: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % bound.max(1)
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

pub fn span(kind: SpanKind, component: Component, start: UnixNanos) -> Span {
    Span {
        trace_id: None,
        span_id: None,
        parent_span_id: None,
        name: "op".to_string(),
        kind,
        start_unix_nano: start,
        end_unix_nano: start + 5,
        status_code: 0,
        status_message: None,
        resource: ResourceFields { component: Some(component), ..ResourceFields::default() },
        scope_name: None,
        scope_version: None,
        scope_attributes: Default::default(),
        call: CallFields::default(),
        attributes: Default::default(),
        events: Vec::new(),
        links: Vec::new(),
    }
}

/// The spans of one call's attempt: the client's, and maybe a router's and a server's
/// under it, with or without trace context, some of them under a router that started a
/// trace of its own; states that raise and break floors.
pub fn call_spans(numbers: &mut Numbers, next_id: &mut u64, now: UnixNanos) -> Vec<Span> {
    let mut id = || {
        *next_id += 1;
        format!("{:016x}", *next_id)
    };
    let client = format!("client-{}", numbers.below(3));
    let call_id = (!numbers.chance(10)).then(|| format!("call-{}", numbers.below(12)));
    let attempt = (!numbers.chance(15)).then(|| numbers.below(3) as i64);
    let start = now + numbers.below(40) as i64 - 10;
    let op = if numbers.chance(40) { Op::Write } else { Op::Read };
    let state = |numbers: &mut Numbers| numbers.chance(80).then(|| numbers.below(50) as i64);
    let call = CallFields {
        client_id: Some(client),
        call_id,
        attempt,
        namespace: Some(format!("ns{}", numbers.below(2))),
        op: Some(op),
        state: StateFields { carried: state(numbers), returned: state(numbers), ..StateFields::default() },
        ..CallFields::default()
    };
    let traced = numbers.chance(80);
    let trace = format!("{:032x}", numbers.below(1 << 40));
    let mut attempt_span = span(SpanKind::Client, Component::Client, start);
    attempt_span.end_unix_nano = start + 3 + numbers.below(30) as i64;
    attempt_span.resource.cluster = Some(format!("cluster-{}", numbers.below(2)));
    attempt_span.resource.system = Some("hdfs".to_string());
    attempt_span.call = call.clone();
    if numbers.chance(10) {
        attempt_span.call.outcome = Some(Outcome::Rejected);
    }
    if traced {
        attempt_span.trace_id = Some(trace.clone());
        attempt_span.span_id = Some(id());
    }
    let mut spans = vec![attempt_span.clone()];
    let hop_call = CallFields {
        state: StateFields {
            carried: state(numbers),
            served: state(numbers),
            returned: state(numbers),
            ..StateFields::default()
        },
        ..call
    };
    let mut parent = attempt_span.span_id.clone();
    // A router that received no context starts a trace of its own.
    let root_router = numbers.chance(10);
    for component in [Component::Router, Component::Server] {
        if numbers.chance(25) {
            continue;
        }
        let mut hop = span(SpanKind::Server, component.clone(), start + numbers.below(6) as i64);
        hop.resource.node_id = Some(format!("node-{}", numbers.below(3)));
        hop.call = hop_call.clone();
        if numbers.chance(10) {
            hop.call.outcome = Some(Outcome::Error);
        }
        if traced || root_router {
            hop.trace_id = Some(if root_router { format!("{trace}-root") } else { trace.clone() });
            hop.span_id = Some(id());
            hop.parent_span_id = if root_router && component == Component::Router {
                None
            } else if numbers.chance(5) {
                Some(id()) // a parent lost on the way
            } else {
                parent.clone()
            };
            parent = hop.span_id.clone();
        }
        spans.push(hop);
    }
    spans
}

/// A sample of a node's applied or committed state, or of its role, at about `now`.
pub fn node_sample(numbers: &mut Numbers, now: UnixNanos) -> lagscope_model::Sample {
    use lagscope_model::conventions::{
        CLUSTER, METRIC_APPLIED_STATE, METRIC_COMMITTED_STATE, METRIC_ROLE, NAMESPACE, NODE_ID, NODE_ROLE,
    };
    let (node, cluster, namespace) = (
        format!("node-{}", numbers.below(3)),
        format!("cluster-{}", numbers.below(2)),
        format!("ns{}", numbers.below(2)),
    );
    let mut labels = vec![(NODE_ID.to_string(), node), (CLUSTER.to_string(), cluster)];
    if numbers.chance(70) {
        labels.push((NAMESPACE.to_string(), namespace));
    }
    let name = match numbers.below(3) {
        0 => METRIC_APPLIED_STATE,
        1 => {
            labels.push((NODE_ROLE.to_string(), ["active", "observer"][numbers.below(2) as usize].to_string()));
            METRIC_ROLE
        }
        _ => METRIC_COMMITTED_STATE,
    };
    lagscope_model::Sample {
        series: std::sync::Arc::new(lagscope_model::SeriesKey {
            name: name.to_string(),
            labels: labels.into_iter().collect(),
        }),
        meta: std::sync::Arc::new(lagscope_model::SeriesMeta {
            kind: lagscope_model::MetricKind::Gauge,
            unit: None,
            description: None,
        }),
        time_unix_nano: now + numbers.below(40) as i64 - 10,
        start_time_unix_nano: None,
        value: lagscope_model::PointValue::Number(numbers.below(50) as f64),
    }
}
