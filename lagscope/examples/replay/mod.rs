//! What the live-pass measures share (`scope_timelines`, `settle`): a simulated run's spans
//! grouped as the scope passes hold them, and their arguments.

use std::collections::BTreeMap;

use lagscope_model::Span;
use lagscope_sim::emit::Request;

/// `live.max_spans_per_scope`'s default.
pub const SCOPE_LIMIT: usize = 50_000;
/// `analyzer.stream.horizon_seconds`' default.
pub const HORIZON: i64 = 90_000_000_000;

/// A scope: (cluster, namespace).
pub type Scope = (Option<String>, Option<String>);

/// The number an argument gives (`default` without it), or an error naming `what` it is.
pub fn number(text: Option<String>, default: i64, what: &str) -> anyhow::Result<i64> {
    text.map_or(Ok(default), |text| text.parse().map_err(|error| anyhow::anyhow!("{what} {text:?}: {error}")))
}

/// The simulator's `scenario` run for `seconds` of simulated time, its trace exports converted
/// as the OTLP receivers convert them, each span under its scope, in export order.
pub fn spans_by_scope(scenario: &str, seconds: i64) -> anyhow::Result<BTreeMap<Scope, Vec<Span>>> {
    let mut config = lagscope_sim::SimConfig::new(scenario);
    config.duration = Some(seconds * lagscope_sim::SECOND);
    let mut requests: Vec<Request> = Vec::new();
    lagscope_sim::run(&config, &mut requests).map_err(|error| anyhow::anyhow!("simulating {scenario}: {error}"))?;
    let mut scopes: BTreeMap<Scope, Vec<Span>> = BTreeMap::new();
    for request in &requests {
        if let Request::Traces(request) = request {
            for span in lagscope_collector::otlp::spans_from_request(request).items {
                scopes.entry((span.resource.cluster.clone(), span.call.namespace.clone())).or_default().push(span);
            }
        }
    }
    Ok(scopes)
}
