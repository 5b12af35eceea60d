//! Joins client, router and server spans into per-client timelines.
//!
//! A router or server span belongs to the client attempt it descends from through the trace
//! context (parent span ids). A sender that propagates no trace context is joined by call id
//! and client id, to the attempt nearest in time.

use std::collections::BTreeMap;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use lagscope_model::{ClientTimeline, Component, Span, TimelineAttempt, TimelineCall, TimelineJoin, UnixNanos};

use crate::floor::floors;

/// How far up a trace the join looks for the client attempt (client → router → server is
/// three levels; instrumented libraries add a few more).
pub(crate) const MAX_PARENT_HOPS: usize = 32;

/// Builds the timeline of every (client, namespace) in `spans`, ordered by client id then
/// namespace. Calls are in client order (start time), each with its attempts.
///
/// A span that comes again (the trace and span ids and the start of an earlier one in
/// `spans`: an exporter retried a request that had been received, OTLP delivery being at least
/// once) is the same span, taken once: the first. (Ids alone are not enough: a generator that
/// repeats ids across runs makes different spans with the same ids, and PostgreSQL keeps
/// them apart by start.)
pub fn build_timelines(spans: &[Span], horizon: UnixNanos) -> Vec<ClientTimeline> {
    let spans: Vec<&Span> = spans.iter().collect();
    build_timelines_of(&spans, horizon)
}

/// The one attribute without a column of its own that timelines read.
const TIMELINE_ATTRIBUTE: &str = "server.address";

/// `span` with what [`build_timelines`] (and the lag rows built on its timelines) read, and no
/// more: its name, status message, other attributes, events, links, scope and resource
/// attributes go. What `export --parquet` sets aside, and what `/api/v1/lag` keeps of the spans
/// it reads.
pub fn for_timelines(span: &Span) -> Span {
    let mut slim = Span {
        trace_id: span.trace_id.clone(),
        span_id: span.span_id.clone(),
        parent_span_id: span.parent_span_id.clone(),
        name: String::new(),
        kind: span.kind,
        start_unix_nano: span.start_unix_nano,
        end_unix_nano: span.end_unix_nano,
        status_code: span.status_code,
        status_message: None,
        resource: lagscope_model::ResourceFields { attributes: Default::default(), ..span.resource.clone() },
        scope_name: None,
        scope_version: None,
        scope_attributes: Default::default(),
        call: span.call.clone(),
        attributes: Default::default(),
        events: Vec::new(),
        links: Vec::new(),
    };
    if let Some(value) = span.attributes.get(TIMELINE_ATTRIBUTE) {
        slim.attributes.insert(TIMELINE_ATTRIBUTE.to_string(), value.clone());
    }
    slim
}

/// [`build_timelines`] of spans held elsewhere (the live analyzer's caches keep them boxed).
pub fn build_timelines_of(spans: &[&Span], horizon: UnixNanos) -> Vec<ClientTimeline> {
    build_timelines_after(spans, horizon, |_, _| None)
}

/// A call id of a client in a namespace: (client id, namespace, call id).
pub(crate) type CallIdOf<'s> = (&'s str, Option<&'s str>, &'s str);

/// [`build_timelines_of`] of spans that follow others, not given: `open_before(id, first)`
/// says when the last call of a call id that began before `first` (the start of the id's first
/// attempt among `spans`) began, if one did. The id's first attempts that start within the
/// horizon of that belong to that call, as they would among all the spans: they are grouped
/// as a call of their own here, but not as one that starts with them.
pub(crate) fn build_timelines_after(
    spans: &[&Span],
    horizon: UnixNanos,
    open_before: impl Fn(CallIdOf<'_>, UnixNanos) -> Option<UnixNanos>,
) -> Vec<ClientTimeline> {
    let mut by_id: ById<'_> = HashMap::default();
    by_id.reserve(spans.len());
    let mut seen: HashSet<(&str, &str, UnixNanos)> = HashSet::default();
    seen.reserve(spans.len());
    let mut repeated = vec![false; spans.len()];
    for (index, span) in spans.iter().enumerate() {
        if let (Some(trace_id), Some(span_id)) = (&span.trace_id, &span.span_id) {
            if seen.insert((trace_id, span_id, span.start_unix_nano)) {
                by_id.insert((trace_id, span_id), index);
            } else {
                repeated[index] = true;
            }
        }
    }
    let client_attempts: Vec<usize> =
        (0..spans.len()).filter(|index| !repeated[*index] && is_client_attempt(spans[*index])).collect();
    let hops = attach_hops(spans, &by_id, &repeated, &client_attempts);

    // (client, namespace) -> its first attempt span and its calls (keys borrowed from the
    // spans: an attempt costs no string copies here)
    let mut grouped: BTreeMap<(&str, Option<&str>), (usize, CallAttempts<'_>)> = BTreeMap::new();
    for &index in &client_attempts {
        let span = spans[index];
        let client_id = span.call.client_id.as_deref().unwrap_or_default();
        let key = match &span.call.call_id {
            Some(call_id) => CallKey::Call(call_id),
            None => CallKey::Lone(index),
        };
        let (_, calls) =
            grouped.entry((client_id, span.call.namespace.as_deref())).or_insert_with(|| (index, BTreeMap::new()));
        calls.entry(key).or_default().push(index);
    }

    grouped
        .into_iter()
        .map(|((client_id, namespace), (first_index, calls))| {
            let (client_id, namespace) = (client_id.to_string(), namespace.map(str::to_string));
            let mut timeline_calls: Vec<TimelineCall> = calls
                .into_iter()
                .flat_map(|(key, attempt_indexes)| {
                    calls_within(spans, attempt_indexes, horizon, |first| match key {
                        CallKey::Call(call_id) => {
                            open_before((client_id.as_str(), namespace.as_deref(), call_id), first)
                        }
                        CallKey::Lone(_) => None,
                    })
                })
                .map(|mut attempt_indexes| {
                    attempt_indexes.sort_by_key(|index| (spans[*index].call.attempt, spans[*index].start_unix_nano));
                    build_call(spans, &attempt_indexes, &hops)
                })
                .collect();
            timeline_calls.sort_by_key(|call| (call.start_unix_nano, call.end_unix_nano));
            let first_span = Some(&spans[first_index]);
            let mut timeline = ClientTimeline {
                client_id,
                namespace,
                cluster: first_span.and_then(|span| span.resource.cluster.clone()),
                system: first_span.and_then(|span| span.resource.system.clone()),
                calls: timeline_calls,
            };
            let call_floors = floors(&timeline.calls);
            for (call, floor) in timeline.calls.iter_mut().zip(call_floors) {
                call.floor = floor.highest().map(|contribution| contribution.state);
            }
            timeline
        })
        .collect()
}

/// Call key -> the span indexes of its attempts.
type CallAttempts<'s> = BTreeMap<CallKey<'s>, Vec<usize>>;

/// The attempts of one call id as the calls they are: in start order, a call per run of
/// attempts that start within `horizon` of the run's first. `open(first)`: the first start of
/// a call of the id begun before these attempts, the first of which starts at `first`
/// ([`build_timelines_after`]), whose run they may go on.
fn calls_within(
    spans: &[&Span],
    mut attempt_indexes: Vec<usize>,
    horizon: UnixNanos,
    open: impl FnOnce(UnixNanos) -> Option<UnixNanos>,
) -> Vec<Vec<usize>> {
    attempt_indexes.sort_by_key(|index| spans[*index].start_unix_nano);
    let mut calls: Vec<Vec<usize>> = Vec::new();
    // The first start of the run the attempts go on.
    let mut first = attempt_indexes.first().and_then(|index| open(spans[*index].start_unix_nano));
    for index in attempt_indexes {
        let start = spans[index].start_unix_nano;
        let goes_on = first.is_some_and(|first| start <= first.saturating_add(horizon));
        match calls.last_mut() {
            Some(call) if goes_on => call.push(index),
            // (The first of these attempts going on a call begun before them: a call here.)
            _ => {
                calls.push(vec![index]);
                if !goes_on {
                    first = Some(start);
                }
            }
        }
    }
    calls
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum CallKey<'s> {
    Call(&'s str),
    Lone(usize),
}

/// The router and server spans joined to each client attempt (by span index).
#[derive(Debug, Default)]
struct Hops {
    by_attempt: HashMap<usize, Vec<usize>>,
    join: HashMap<usize, TimelineJoin>,
}

pub(crate) fn is_client_attempt(span: &Span) -> bool {
    span.call.client_id.is_some() && span.component() == Some(Component::Client)
}

/// Spans by (trace id, span id), each taken once (different spans sharing ids: the last).
type ById<'s> = HashMap<(&'s str, &'s str), usize>;

fn attach_hops(spans: &[&Span], by_id: &ById<'_>, repeated: &[bool], client_attempts: &[usize]) -> Hops {
    let mut by_call: HashMap<(&str, &str), Vec<usize>> = HashMap::default();
    for &index in client_attempts {
        let call = &spans[index].call;
        if let (Some(client_id), Some(call_id)) = (&call.client_id, &call.call_id) {
            by_call.entry((client_id, call_id)).or_default().push(index);
        }
    }
    let is_client: Vec<bool> = {
        let mut flags = vec![false; spans.len()];
        for &index in client_attempts {
            flags[index] = true;
        }
        flags
    };

    let mut hops = Hops::default();
    for (index, span) in spans.iter().enumerate() {
        if is_client[index]
            || repeated[index]
            || !matches!(span.component(), Some(Component::Router | Component::Server))
        {
            continue;
        }
        // A hop that received trace context (it has a parent) joins the attempt it descends
        // from, or none: when its ancestors were lost on the way, the call's other attempts
        // are not its own. A hop that received none (a root of its own trace, or no ids at
        // all: its system propagates no context) joins by call id, and the hops under such a
        // root join with it.
        let joined = if span.trace_id.is_some() && span.span_id.is_some() && span.parent_span_id.is_some() {
            match ancestor(spans, by_id, &is_client, index) {
                Some(Ancestor::Attempt(attempt)) => Some((attempt, TimelineJoin::TraceContext)),
                Some(Ancestor::RootHop(root)) => {
                    nearest_attempt_of_call(spans, &by_call, spans[root]).map(|attempt| (attempt, TimelineJoin::CallId))
                }
                None => None,
            }
        } else {
            nearest_attempt_of_call(spans, &by_call, span).map(|attempt| (attempt, TimelineJoin::CallId))
        };
        if let Some((attempt, join)) = joined {
            hops.by_attempt.entry(attempt).or_default().push(index);
            hops.join.entry(attempt).or_insert(join);
        }
    }
    hops
}

/// Where a hop's trace context came from: the client attempt it descends from, or a hop at
/// the root of the trace (a process that received no context and started the trace).
enum Ancestor {
    Attempt(usize),
    RootHop(usize),
}

fn ancestor(spans: &[&Span], by_id: &ById<'_>, is_client: &[bool], index: usize) -> Option<Ancestor> {
    let mut current = &spans[index];
    for _ in 0..MAX_PARENT_HOPS {
        let trace_id = current.trace_id.as_deref()?;
        let parent_id = current.parent_span_id.as_deref()?;
        let parent_index = *by_id.get(&(trace_id, parent_id))?;
        let parent = &spans[parent_index];
        if is_client[parent_index] {
            return Some(Ancestor::Attempt(parent_index));
        }
        if parent.parent_span_id.is_none() {
            return matches!(parent.component(), Some(Component::Router | Component::Server))
                .then_some(Ancestor::RootHop(parent_index));
        }
        current = parent;
    }
    None
}

fn nearest_attempt_of_call(spans: &[&Span], by_call: &HashMap<(&str, &str), Vec<usize>>, span: &Span) -> Option<usize> {
    let client_id = span.call.client_id.as_deref()?;
    let call_id = span.call.call_id.as_deref()?;
    let candidates = by_call.get(&(client_id, call_id))?;
    candidates
        .iter()
        .copied()
        .filter(|candidate| same_attempt_or_unnumbered(spans[*candidate].call.attempt, span.call.attempt))
        .min_by_key(|candidate| {
            let attempt = &spans[*candidate];
            let distance = distance_to(attempt.start_unix_nano, attempt.end_unix_nano, span.start_unix_nano);
            // Same attempt number first, then nearest in time.
            (attempt.call.attempt != span.call.attempt || span.call.attempt.is_none(), distance)
        })
}

/// Whether a hop of a call (without trace context) may join one of the call's attempts: the
/// attempt with its number, never another one (that attempt's client span was lost, or never
/// sent), and by time alone only where one of the two has no number.
pub(crate) fn same_attempt_or_unnumbered(attempt: Option<i64>, hop: Option<i64>) -> bool {
    attempt.is_none() || hop.is_none() || attempt == hop
}

/// How far `at` lies outside [`start`, `end`] (0 inside).
pub(crate) fn distance_to(start: UnixNanos, end: UnixNanos, at: UnixNanos) -> i64 {
    if at < start {
        start.saturating_sub(at)
    } else if at > end {
        at.saturating_sub(end)
    } else {
        0
    }
}

fn build_call(spans: &[&Span], attempt_indexes: &[usize], hops: &Hops) -> TimelineCall {
    let attempts: Vec<TimelineAttempt> = attempt_indexes
        .iter()
        .map(|index| {
            let joined: Vec<&Span> =
                hops.by_attempt.get(index).map_or(&[][..], Vec::as_slice).iter().map(|hop| spans[*hop]).collect();
            let join = hops.join.get(index).copied().unwrap_or(TimelineJoin::ClientOnly);
            attempt_of(spans[*index], &joined, join)
        })
        .collect();
    call_of(spans[attempt_indexes[0]], attempts)
}

/// A call of `attempts` (in attempt order), named by its first attempt's span.
pub(crate) fn call_of(first: &Span, attempts: Vec<TimelineAttempt>) -> TimelineCall {
    TimelineCall {
        call_id: first.call.call_id.clone(),
        op: first.call.op.clone(),
        rpc_method: first.call.rpc_method.clone(),
        start_unix_nano: attempts.iter().map(|attempt| attempt.start_unix_nano).min().unwrap_or_default(),
        end_unix_nano: attempts.iter().map(|attempt| attempt.end_unix_nano).max().unwrap_or_default(),
        attempts,
        floor: None,
    }
}

/// The attempt of the client span `client`, with the router and server spans joined to it
/// (in the order the spans are given) and how the first of them was found.
pub(crate) fn attempt_of(client: &Span, joined: &[&Span], join: TimelineJoin) -> TimelineAttempt {
    let mut routers: Vec<&Span> = Vec::new();
    let mut servers: Vec<&Span> = Vec::new();
    for &hop in joined {
        match hop.component() {
            Some(Component::Router) => routers.push(hop),
            Some(Component::Server) => servers.push(hop),
            _ => {}
        }
    }
    routers.sort_by_key(|span| span.start_unix_nano);
    servers.sort_by_key(|span| span.start_unix_nano);
    // The execution that answered: the last successful server span, else the last one.
    let server = servers.iter().rev().find(|span| span.is_ok()).or(servers.last()).copied();
    // The router hop that led to it: its parent if the trace says so, else the last one.
    let router = server
        .and_then(|server| {
            routers.iter().find(|router| router.span_id.is_some() && router.span_id == server.parent_span_id)
        })
        .or(routers.last())
        .copied();
    let call = &client.call;
    TimelineAttempt {
        attempt: call.attempt,
        start_unix_nano: client.start_unix_nano,
        end_unix_nano: client.end_unix_nano,
        client_span: client.reference(),
        router_spans: routers.iter().map(|span| span.reference()).collect(),
        server_spans: servers.iter().map(|span| span.reference()).collect(),
        join,
        target_node: call.target_node.clone(),
        target_role: call.target_role.clone(),
        router_node: router.and_then(|span| span.resource.node_id.clone()),
        served_by: server.and_then(|span| span.resource.node_id.clone()),
        served_role: server.and_then(|span| span.call.node_role.clone()),
        carried: call.state.carried,
        router_carried: router.and_then(|span| span.call.state.carried),
        router_state: router.and_then(|span| span.call.state.router),
        served: server.and_then(|span| span.call.state.served).or(call.state.served),
        returned: call
            .state
            .returned
            .or_else(|| router.and_then(|span| span.call.state.returned))
            .or_else(|| server.and_then(|span| span.call.state.returned)),
        committed: server.and_then(|span| span.call.state.committed).or(call.state.committed),
        consistency: call.consistency.clone(),
        follower_read: call.follower_read,
        server_address: client.attributes.get("server.address").and_then(|value| value.as_str()).map(str::to_string),
        outcome: Some(if client.is_ok() { lagscope_model::Outcome::Ok } else { outcome_of(client) }),
        error_type: call.error_type.clone(),
        requeues: server.and_then(|span| span.call.requeues),
        reported: Default::default(),
    }
}

fn outcome_of(span: &Span) -> lagscope_model::Outcome {
    span.call.outcome.clone().unwrap_or(lagscope_model::Outcome::Error)
}

#[cfg(test)]
mod slim_tests {
    use lagscope_model::{Component, SpanEvent, SpanKind, SpanLink};
    use serde_json::json;

    use super::*;
    use crate::testing::span;

    #[test]
    fn the_slim_copy_keeps_what_timelines_read() {
        let mut whole = span(SpanKind::Client, Component::Client, 7);
        whole.trace_id = Some("0af7651916cd43dd8448eb211c80319c".to_string());
        whole.span_id = Some("b7ad6b7169203331".to_string());
        whole.status_message = Some("refused".to_string());
        whole.scope_name = Some("io.opentelemetry".to_string());
        whole.scope_version = Some("1.0".to_string());
        whole.scope_attributes.insert("scope.key".to_string(), json!("v"));
        whole.resource.attributes.insert("host.name".to_string(), json!("app-1"));
        whole.resource.node_id = Some("app-1".to_string());
        whole.call.client_id = Some("client-1".to_string());
        whole.call.call_id = Some("call-1".to_string());
        whole.attributes.insert(TIMELINE_ATTRIBUTE.to_string(), json!("pulsar://a:6650"));
        whole.attributes.insert("net.peer.port".to_string(), json!(6650));
        whole.events.push(SpanEvent { time_unix_nano: 8, name: "e".to_string(), attributes: Default::default() });
        whole.links.push(SpanLink { trace_id: None, span_id: None, attributes: Default::default() });

        let copy = for_timelines(&whole);
        assert_eq!(copy.attributes.len(), 1);
        assert_eq!(copy.attributes[TIMELINE_ATTRIBUTE], json!("pulsar://a:6650"));
        assert!(copy.name.is_empty() && copy.status_message.is_none() && copy.scope_name.is_none());
        assert!(copy.resource.attributes.is_empty() && copy.scope_attributes.is_empty());
        assert!(copy.events.is_empty() && copy.links.is_empty());
        assert_eq!(
            (copy.trace_id.as_deref(), copy.resource.node_id.as_deref()),
            (whole.trace_id.as_deref(), Some("app-1"))
        );
        assert_eq!(copy.call, whole.call);
        // The timelines are the same either way.
        assert_eq!(build_timelines(std::slice::from_ref(&whole), 1), build_timelines(&[copy], 1));
    }
}
