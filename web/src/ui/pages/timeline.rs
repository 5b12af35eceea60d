//! A client's timeline as the anomaly and client pages draw it: swimlanes of the client, its
//! routers and servers, and a table of every attempt with its states, the violations marked.

use super::*;

/// A client's timeline drawn for a page: swimlanes and the table of attempts.
#[derive(Debug, Serialize)]
pub(super) struct TimelineView {
    svg: String,
    legend: Vec<(String, String)>,
    table: Table,
    calls: usize,
    shown_calls: usize,
    spans_cut: bool,
    namespaces: Vec<String>,
}

pub(super) fn outcome_color(outcome: Option<&Outcome>) -> plotters::style::RGBColor {
    match outcome {
        Some(Outcome::Ok) => charts::GREEN,
        Some(Outcome::Rejected) => charts::AMBER,
        Some(Outcome::Error | Outcome::Timeout) => charts::RED,
        _ => charts::GREY,
    }
}

/// Keeps at most `max` of `calls` (sorted by start): those around `focus` (half before it, half
/// from it on, shifted when one side runs out), or the most recent without one. An anomaly
/// page focuses on the anomaly: a busy client's ±30 s window holds more calls than a page
/// draws, and the newest of them would leave the anomaly out of its own page.
fn keep_calls_to_draw<T>(calls: &mut Vec<T>, start_of: impl Fn(&T) -> i64, focus: Option<i64>, max: usize) {
    if calls.len() <= max {
        return;
    }
    let last_first = calls.len() - max;
    let first = match focus {
        Some(at) => calls.partition_point(|call| start_of(call) < at).saturating_sub(max / 2).min(last_first),
        None => last_first,
    };
    calls.drain(..first);
    calls.truncate(max);
}

/// A client's timeline in `range` as a page draws it; `focus` (an anomaly's start) picks which
/// calls when there are more than a page draws.
pub(super) async fn timeline_view(
    state: &UiState,
    client_id: &str,
    namespace: Option<&str>,
    range: &PageRange,
    anomalies: &[StoredAnomaly],
    focus: Option<i64>,
) -> Result<TimelineView, ApiError> {
    let spans = state.store.client_spans(client_id, range.range(), MAX_PAGE_SPANS).await?;
    let own = spans.iter().filter(|span| span.call.client_id.as_deref() == Some(client_id)).count();
    let mut timelines: Vec<ClientTimeline> = build_timelines(&spans, state.call_horizon)
        .into_iter()
        .filter(|timeline| timeline.client_id == client_id)
        .filter(|timeline| namespace.is_none() || timeline.namespace.as_deref() == namespace)
        .collect();
    let namespaces: Vec<String> =
        timelines.iter().map(|timeline| timeline.namespace.clone().unwrap_or_else(|| "-".to_string())).collect();
    for timeline in &mut timelines {
        crate::enrich_timeline(state.store.as_ref(), timeline).await?;
    }
    // Spans by id, for the router and server bars' times.
    let by_id: HashMap<&str, &Span> =
        spans.iter().filter_map(|span| span.span_id.as_deref().map(|id| (id, span))).collect();
    let (flagged, floor_setters) = flagged_spans(anomalies);
    // The calls to draw, of every namespace: around the focus, else the most recent.
    let mut calls: Vec<(&ClientTimeline, &lagscope_model::TimelineCall)> =
        timelines.iter().flat_map(|timeline| timeline.calls.iter().map(move |call| (timeline, call))).collect();
    calls.sort_by_key(|(_, call)| call.start_unix_nano);
    let total_calls = calls.len();
    keep_calls_to_draw(&mut calls, |(_, call)| call.start_unix_nano, focus, MAX_PAGE_CALLS);
    let mut lanes: Vec<String> = Vec::new();
    let lane_of = |name: String, lanes: &mut Vec<String>| match lanes.iter().position(|lane| *lane == name) {
        Some(index) => index,
        None => {
            lanes.push(name);
            lanes.len() - 1
        }
    };
    for timeline in &timelines {
        lane_of(format!("client {} · {}", client_id, timeline.namespace.as_deref().unwrap_or("-")), &mut lanes);
    }
    let mut bars = Vec::new();
    let mut table = Table::new(&[
        "start",
        "op",
        "method",
        "attempt",
        "sent to",
        "router",
        "served by",
        "carried",
        "router carried",
        "served",
        "returned",
        "floor",
        "committed",
        "outcome",
        "anomaly",
    ]);
    for (timeline, call) in &calls {
        let client_lane =
            lane_of(format!("client {} · {}", client_id, timeline.namespace.as_deref().unwrap_or("-")), &mut lanes);
        for attempt in &call.attempts {
            let span_id = attempt.client_span.span_id.clone().unwrap_or_default();
            let flag = flagged.get(&span_id).cloned().or_else(|| {
                attempt
                    .server_spans
                    .iter()
                    .chain(&attempt.router_spans)
                    .find_map(|hop| hop.span_id.as_ref().and_then(|id| flagged.get(id).cloned()))
            });
            let below_floor = matches!((call.floor, attempt.served), (Some(floor), Some(served)) if served < floor);
            bars.push(Bar {
                lane: client_lane,
                start: attempt.start_unix_nano,
                end: attempt.end_unix_nano,
                color: if flag.is_some() { charts::RED } else { outcome_color(attempt.outcome.as_ref()) },
                highlight: flag.is_some(),
                text: None,
            });
            for router in &attempt.router_spans {
                let Some(span) = router.span_id.as_deref().and_then(|id| by_id.get(id)) else { continue };
                let lane = lane_of(format!("router {}", router.node_id.as_deref().unwrap_or("-")), &mut lanes);
                bars.push(Bar {
                    lane,
                    start: span.start_unix_nano,
                    end: span.end_unix_nano,
                    color: charts::color(0),
                    highlight: false,
                    text: None,
                });
            }
            for server in &attempt.server_spans {
                let Some(span) = server.span_id.as_deref().and_then(|id| by_id.get(id)) else { continue };
                let lane = lane_of(format!("server {}", server.node_id.as_deref().unwrap_or("-")), &mut lanes);
                bars.push(Bar {
                    lane,
                    start: span.start_unix_nano,
                    end: span.end_unix_nano,
                    color: if below_floor { charts::RED } else { charts::color(4) },
                    highlight: flag.is_some(),
                    text: None,
                });
            }
            table.rows.push(attempt_row(call, attempt, below_floor, flag, floor_setters.get(&span_id).copied()));
        }
    }
    let names = order_lanes(&lanes, &mut bars);
    let svg = charts::lanes(&names, &bars, charts::Span { from: range.from, to: range.to });
    let legend = [
        ("ok", charts::GREEN),
        ("rejected", charts::AMBER),
        ("error / timeout", charts::RED),
        ("router hop", charts::color(0)),
        ("server execution", charts::color(4)),
    ]
    .into_iter()
    .map(|(name, color)| (name.to_string(), charts::hex(color)))
    .chain(std::iter::once(("broke a guarantee (outlined)".to_string(), charts::hex(charts::RED))))
    .collect();
    Ok(TimelineView {
        svg,
        legend,
        table,
        calls: total_calls,
        shown_calls: calls.len(),
        spans_cut: own >= MAX_PAGE_SPANS as usize,
        namespaces,
    })
}

/// Which attempts broke a guarantee (their span ids are in an anomaly's evidence: the
/// anomaly's id and kind) and which set the floor a stale read was judged against.
pub(super) fn flagged_spans(anomalies: &[StoredAnomaly]) -> (HashMap<String, (i64, String)>, HashMap<String, i64>) {
    let mut flagged: HashMap<String, (i64, String)> = HashMap::new();
    let mut floor_setters: HashMap<String, i64> = HashMap::new();
    for stored in anomalies {
        let evidence = stored.anomaly.evidence.value();
        for id in crate::ui::span_ids(evidence, "spans") {
            flagged.entry(id).or_insert((stored.id, stored.anomaly.kind.as_str().to_string()));
        }
        if let Some(setter) = evidence.get("floor_set_by") {
            for id in crate::ui::span_ids(setter, "spans") {
                floor_setters.entry(id).or_insert(stored.id);
            }
        }
    }
    (flagged, floor_setters)
}

/// A timeline table's row of one attempt: its states (the served one marked when below the
/// floor), nodes, outcome, and the anomaly it broke a guarantee in or set the floor of.
pub(super) fn attempt_row(
    call: &lagscope_model::TimelineCall,
    attempt: &lagscope_model::TimelineAttempt,
    below_floor: bool,
    flag: Option<(i64, String)>,
    floor_setter: Option<i64>,
) -> Vec<Cell> {
    let state_cell = |value: Option<i64>| Cell::text(value.map(|v| v.to_string()).unwrap_or_default());
    let served_cell = match (attempt.served, below_floor) {
        (Some(served), true) => Cell::class(served.to_string(), "critical"),
        (served, _) => state_cell(served),
    };
    let node_role = |node: &Option<String>, role: &Option<String>| match (node, role) {
        (Some(node), Some(role)) => format!("{node} ({role})"),
        (Some(node), None) => node.clone(),
        (None, Some(role)) => format!("({role})"),
        (None, None) => String::new(),
    };
    let served_role = attempt.served_role.clone().or_else(|| attempt.reported.node_role.clone());
    vec![
        Cell::text(time_text(attempt.start_unix_nano)),
        Cell::text(call.op.as_ref().map(|op| op.as_str().to_string()).unwrap_or_default()),
        Cell::text(call.rpc_method.clone().unwrap_or_default()),
        Cell::text(attempt.attempt.map(|a| a.to_string()).unwrap_or_default()),
        Cell::text(node_role(&attempt.target_node, &attempt.target_role)),
        Cell::text(attempt.router_node.clone().unwrap_or_default()),
        Cell::text(node_role(&attempt.served_by, &served_role)),
        state_cell(attempt.carried),
        state_cell(attempt.router_carried),
        served_cell,
        state_cell(attempt.returned),
        state_cell(call.floor),
        state_cell(attempt.committed.or(attempt.reported.namespace_committed)),
        {
            let outcome = attempt.outcome.as_ref().map(|o| o.as_str().to_string()).unwrap_or_default();
            let text = match &attempt.error_type {
                Some(error) => format!("{outcome}: {}", error.rsplit('.').next().unwrap_or(error)),
                None => outcome,
            };
            if matches!(attempt.outcome, Some(Outcome::Ok) | None) {
                Cell::text(text)
            } else {
                Cell::class(text, "warning")
            }
        },
        match (flag, floor_setter) {
            (Some((id, kind)), _) => {
                Cell { class: Some("critical".to_string()), ..Cell::link(kind, format!("/anomalies/{id}")) }
            }
            (None, Some(id)) => Cell::link("set the floor", format!("/anomalies/{id}")),
            (None, None) => Cell::text(""),
        },
    ]
}

/// The lanes in order, the client's, then routers, then servers (each sorted by name), with
/// each bar moved to its lane's new place.
pub(super) fn order_lanes(lanes: &[String], bars: &mut [Bar]) -> Vec<String> {
    let mut order: Vec<usize> = (0..lanes.len()).collect();
    let rank = |name: &str| {
        if name.starts_with("client ") {
            0
        } else if name.starts_with("router ") {
            1
        } else {
            2
        }
    };
    order.sort_by(|a, b| rank(&lanes[*a]).cmp(&rank(&lanes[*b])).then_with(|| lanes[*a].cmp(&lanes[*b])));
    let mut position = vec![0; lanes.len()];
    for (new, old) in order.iter().enumerate() {
        position[*old] = new;
    }
    for bar in bars.iter_mut() {
        bar.lane = position[bar.lane];
    }
    order.iter().map(|old| lanes[*old].clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::keep_calls_to_draw;

    fn kept(count: i64, focus: Option<i64>, max: usize) -> Vec<i64> {
        let mut calls: Vec<i64> = (0..count).map(|index| index * 10).collect();
        keep_calls_to_draw(&mut calls, |start| *start, focus, max);
        calls
    }

    #[test]
    fn a_page_draws_the_calls_around_its_focus_or_the_latest() {
        // Few enough: all of them, whatever the focus.
        assert_eq!(kept(3, Some(0), 4), [0, 10, 20]);
        // No focus: the most recent.
        assert_eq!(kept(10, None, 4), [60, 70, 80, 90]);
        // Half before the focus, half from it on.
        assert_eq!(kept(10, Some(50), 4), [30, 40, 50, 60]);
        // Near either end: shifted to keep as many.
        assert_eq!(kept(10, Some(0), 4), [0, 10, 20, 30]);
        assert_eq!(kept(10, Some(95), 4), [60, 70, 80, 90]);
        assert_eq!(kept(10, Some(-5), 4), [0, 10, 20, 30]);
    }
}
