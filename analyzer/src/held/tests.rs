use lagscope_model::{CallFields, Op, Outcome, SpanKind, StateFields};

use super::*;
use crate::build_timelines;
use crate::testing::{Numbers, call_spans, node_sample, span};

/// A second, in nanoseconds.
const SECOND: i64 = 1_000_000_000;

/// Attempt `number` of client-1's call `call` in ns1, begun `at` seconds in and half a second
/// long, alone in its trace, successful.
fn attempt_at(call: i64, number: i64, at: i64, op: Op, state: StateFields) -> Span {
    let mut span = span(SpanKind::Client, Component::Client, at * SECOND);
    span.end_unix_nano = at * SECOND + SECOND / 2;
    span.trace_id = Some(format!("{call:016x}{number:016x}"));
    span.span_id = Some(format!("{at:016x}"));
    span.call = CallFields {
        client_id: Some("client-1".to_string()),
        call_id: Some(format!("call-{call}")),
        attempt: Some(number),
        namespace: Some("ns1".to_string()),
        op: Some(op),
        state,
        outcome: Some(Outcome::Ok),
        ..CallFields::default()
    };
    span
}

/// Random rounds of spans added (new ones, copies sent again, a span's ids at another
/// start), the oldest let go and spans removed anywhere: after every refresh the held
/// timelines are exactly those built from scratch.
#[test]
fn settling_keeps_the_call_that_set_the_floor() {
    // A write returns state 100; for five minutes the client's reads are served at 50 (an
    // observer that stopped applying): each a stale read against that one write. Settled to
    // the last minute, the write stays, and the last read is judged as before.
    let attempt = |at: i64, op: Op, state: StateFields| attempt_at(at, 0, at, op, state);
    let mut held = HeldTimelines::new(90 * SECOND);
    held.insert(attempt(0, Op::Write, StateFields { returned: Some(100), ..StateFields::default() }));
    for at in 1..300 {
        held.insert(attempt(
            at,
            Op::Read,
            StateFields { served: Some(50), returned: Some(50), ..StateFields::default() },
        ));
    }
    let read_at = |held: &mut HeldTimelines, at: i64| {
        held.refresh();
        let input = crate::AnalysisInput::from_held_timelines(held.take_timelines(), Vec::new());
        let found = crate::analyze(&input, &crate::AnalyzerConfig::default());
        held.give_back(input.timelines);
        found.into_iter().filter(|anomaly| anomaly.start_unix_nano == at * SECOND).collect::<Vec<_>>()
    };
    let before = read_at(&mut held, 299);
    assert_eq!(before.len(), 1, "{before:?}");
    // Never cut before, the timeline is cut a step past its first call, then a step at a
    // time: four minutes of reads go over twelve settles.
    let mut let_go = 0;
    let mut cuts = Vec::new();
    for _ in 0..14 {
        let step = held.settle(240 * SECOND, |_| i64::MAX);
        assert!(step.len() <= 20, "a step's reads at most: {}", step.len());
        let_go += step.len();
        cuts.push(held.settled_from("client-1", Some("ns1")));
    }
    assert_eq!(cuts[0], SETTLE_STEP);
    assert!(cuts.windows(2).all(|pair| pair[1] - pair[0] <= SETTLE_STEP), "{cuts:?}");
    assert_eq!(cuts.last(), Some(&(240 * SECOND)));
    assert!(let_go > 200, "the settled reads go: {let_go}");
    assert!(held.spans().any(|span| span.start_unix_nano == 0), "the write that set the floor stays");
    assert_eq!(read_at(&mut held, 299), before);

    // Five more minutes of reads, settled as late as they allow at once (as when an
    // anomaly that held the cut ends): the cut moves on a step at a time, and the last
    // read is judged as before.
    for at in 300..600 {
        held.insert(attempt(
            at,
            Op::Read,
            StateFields { served: Some(50), returned: Some(50), ..StateFields::default() },
        ));
    }
    let last = read_at(&mut held, 599);
    assert_eq!(last.len(), 1, "{last:?}");
    let mut cuts = Vec::new();
    for _ in 0..20 {
        let let_go = held.settle(590 * SECOND, |_| i64::MAX);
        assert!(let_go.len() <= 20, "a step's reads at most: {}", let_go.len());
        cuts.push(held.settled_from("client-1", Some("ns1")));
    }
    assert_eq!(cuts[0], 240 * SECOND + SETTLE_STEP);
    assert!(cuts.windows(2).all(|pair| pair[1] - pair[0] <= SETTLE_STEP), "{cuts:?}");
    assert_eq!(cuts.last(), Some(&(590 * SECOND)));
    assert!(held.spans().any(|span| span.start_unix_nano == 0), "the write that set the floor stays");
    assert_eq!(read_at(&mut held, 599), last);
}

/// What arrives after a settle is late when what it belongs to was let go or judged:
/// a span naming a client before that client's cut, a hop naming none whose attempt is
/// no longer held and that starts before its namespace's latest cut. Nothing is late
/// before any settle, after the cut, or in a namespace never cut.
#[test]
fn spans_for_what_a_settle_let_go_are_late() {
    const SECOND: i64 = 1_000_000_000;
    let attempt = |client: &str, namespace: &str, at: i64| {
        let mut span = span(SpanKind::Client, Component::Client, at * SECOND);
        span.end_unix_nano = at * SECOND + SECOND / 2;
        span.trace_id = Some(format!("{client}-{namespace}-{at}"));
        span.span_id = Some(format!("{at:016x}"));
        span.call = CallFields {
            client_id: Some(client.to_string()),
            call_id: Some(format!("call-{at}")),
            attempt: Some(0),
            namespace: Some(namespace.to_string()),
            op: Some(Op::Read),
            state: StateFields { carried: Some(10), ..StateFields::default() },
            outcome: Some(Outcome::Ok),
            ..CallFields::default()
        };
        span
    };
    // A server's hop under an attempt: it names no client, only the namespace.
    let hop = |attempt: &Span| {
        let mut hop = span(SpanKind::Server, Component::Server, attempt.start_unix_nano + SECOND / 10);
        hop.trace_id = attempt.trace_id.clone();
        hop.span_id = Some("ffffffffffffffff".to_string());
        hop.parent_span_id = attempt.span_id.clone();
        hop.call.namespace = attempt.call.namespace.clone();
        hop.call.state.served = Some(5);
        hop
    };
    let mut held = HeldTimelines::new(90 * SECOND);
    for at in 0..60 {
        held.insert(attempt("client-1", "ns1", at));
        held.insert(attempt("client-2", "ns1", at));
    }
    held.insert(attempt("client-1", "ns2", 1));
    // A server's hop under a router's that has not come: it waits, joined to nothing.
    let waiting_for = |attempt: &Span| {
        let mut router = span(SpanKind::Server, Component::Router, attempt.start_unix_nano + SECOND / 20);
        router.trace_id = attempt.trace_id.clone();
        router.span_id = Some("eeeeeeeeeeeeeeee".to_string());
        router.parent_span_id = attempt.span_id.clone();
        router.call = attempt.call.clone();
        let mut server = hop(attempt);
        server.parent_span_id = router.span_id.clone();
        (router, server)
    };
    let (router, server) = waiting_for(&attempt("client-1", "ns1", 45));
    let server_end = server.end_unix_nano;
    held.insert(server);
    assert!(!held.is_late(&attempt("client-1", "ns1", 5)), "nothing is late before a settle");
    assert!(!held.is_late(&hop(&attempt("client-1", "ns1", 5))));
    assert!(!held.is_late(&router));
    held.settle(50 * SECOND, |_| i64::MAX);
    let cut = held.settled_from("client-1", Some("ns1"));
    assert_eq!(cut, SETTLE_STEP, "cut a step past the first call");
    let cut_at = cut / SECOND;
    // The client's own spans, and a hop naming it, by its cut.
    assert!(held.is_late(&attempt("client-1", "ns1", cut_at - 2)));
    // (The settle cut 9 s behind the newest span, 59 s; this starts 2 s before the cut.)
    let to_hold = held.settling_to_hold(&attempt("client-1", "ns1", cut_at - 2));
    assert_eq!(to_hold, Some(9 * SECOND + 2 * SECOND), "before the cut");
    assert!(!held.is_late(&attempt("client-1", "ns1", cut_at + 2)));
    assert_eq!(held.settling_to_hold(&attempt("client-1", "ns1", cut_at + 2)), None);
    let mut named = hop(&attempt("client-1", "ns1", cut_at - 2));
    named.call.client_id = Some("client-1".to_string());
    assert!(held.is_late(&named));
    // A hop naming no client: its attempt let go, or held.
    assert!(held.is_late(&hop(&attempt("client-1", "ns1", cut_at - 2))));
    let to_hold = held.settling_to_hold(&hop(&attempt("client-1", "ns1", cut_at - 2)));
    assert_eq!(to_hold, Some(9 * SECOND + 2 * SECOND - SECOND / 10), "before the namespace's cut");
    assert!(!held.is_late(&hop(&attempt("client-1", "ns1", cut_at + 2))));
    assert!(
        !held.spans().any(|span| span.start_unix_nano == (cut_at - 2) * SECOND),
        "the attempt of the late hop was let go"
    );
    // The router's hop the server's waits for, after its attempt's cut: the server's,
    // ended before the settle's cut-off, is held, waiting for it (the clients of its
    // namespace send their attempts): the router's is not late.
    assert!(held.spans().any(|span| span.parent_span_id == router.span_id), "the waiting hop is held");
    assert!(!held.is_late(&router));
    // Still not there a horizon after the hop ended: the hop goes, and the router's is late,
    // another router's of the attempt is not.
    held.settle(server_end + 90 * SECOND, |_| i64::MAX);
    assert!(held.spans().any(|span| span.parent_span_id == router.span_id), "held through the horizon");
    held.settle(server_end + 90 * SECOND + 1, |_| i64::MAX);
    assert!(!held.spans().any(|span| span.parent_span_id == router.span_id), "the waiting hop was let go");
    // (Late by its timeline's cut, now past it: what the hop would have joined is not
    // remembered past the horizon, after which an attempt begins another call.)
    let cut = held.settled_from("client-1", Some("ns1"));
    assert!(router.start_unix_nano < cut);
    assert_eq!(held.settling_to_hold(&router), Some(cut - router.start_unix_nano));
    // Where no client of the namespace sends its attempts, such a hop goes at the cut-off:
    // the router's it waited for is late (nothing was cut there: by the hop let go),
    // another router's of the attempt is not.
    let (unsent_router, unsent) = waiting_for(&attempt("client-9", "ns9", 200));
    held.insert(unsent.clone());
    held.settle(unsent.end_unix_nano + 1, |_| i64::MAX);
    assert!(!held.spans().any(|span| span == &unsent), "no client sends there: let go");
    assert!(held.is_late(&unsent_router));
    let mut other = unsent_router.clone();
    other.span_id = Some("dddddddddddddddd".to_string());
    other.call.call_id = Some("call-other".to_string());
    assert!(!held.is_late(&other));
    // A client with no timeline there yet, and a namespace never cut (one call: nothing
    // before it to let go).
    assert!(!held.is_late(&attempt("client-3", "ns1", cut_at - 2)));
    assert!(!held.is_late(&attempt("client-1", "ns2", 0)));
    assert!(!held.is_late(&hop(&attempt("client-1", "ns2", 0))));
}

/// Past [`MAX_WAITING_HOPS`] hops waiting for an ancestor, the oldest go, and what they
/// waited for is late; the newest wait, and what they wait for is not.
#[test]
fn hops_waiting_for_their_ancestors_are_bounded() {
    const SECOND: i64 = 1_000_000_000;
    let mut held = HeldTimelines::new(90 * SECOND);
    // A client that sends its attempts in the namespace.
    let mut attempt = span(SpanKind::Client, Component::Client, 0);
    (attempt.trace_id, attempt.span_id) = (Some("client-trace".to_string()), Some("a".to_string()));
    attempt.call = CallFields {
        client_id: Some("client-1".to_string()),
        call_id: Some("call-1".to_string()),
        namespace: Some("ns1".to_string()),
        op: Some(Op::Read),
        ..CallFields::default()
    };
    held.insert(attempt);
    // A server's span under a router's hop (`r`) of its own trace, not come.
    let hop = |component: Component, index: usize, id: &str, parent: &str| {
        let mut hop = span(SpanKind::Server, component, SECOND + index as i64);
        (hop.trace_id, hop.span_id) = (Some(format!("trace-{index}")), Some(id.to_string()));
        hop.parent_span_id = Some(parent.to_string());
        hop.call.namespace = Some("ns1".to_string());
        hop
    };
    let extra = 10;
    for index in 0..MAX_WAITING_HOPS + extra {
        held.insert(hop(Component::Server, index, "s", "r"));
    }
    held.settle(20 * SECOND, |_| i64::MAX);
    let waiting: Vec<usize> =
        held.spans().filter_map(|span| span.trace_id.as_deref()?.strip_prefix("trace-")?.parse().ok()).collect();
    assert_eq!(waiting, (extra..MAX_WAITING_HOPS + extra).collect::<Vec<_>>(), "the newest wait");
    assert!(held.is_late(&hop(Component::Router, extra - 1, "r", "x")), "its hop let go");
    assert!(!held.is_late(&hop(Component::Router, extra, "r", "x")), "its hop waits");
}

#[test]
fn a_timeline_whose_cluster_changes_is_told_again_whole() {
    // Call c1's attempts are numbered out of time order: the call starts at its attempt 0
    // (50), after c2 (10). The timeline's cluster is its first attempt's (5, in a); that
    // one let go, it is c2's (b), and every call's committed state is b's.
    let attempt = |at: i64, call: &str, number: i64, cluster: &str| {
        let mut span = span(SpanKind::Client, Component::Client, at);
        span.resource.cluster = Some(cluster.to_string());
        span.call = CallFields {
            client_id: Some("client-1".to_string()),
            call_id: Some(call.to_string()),
            attempt: Some(number),
            namespace: Some("ns1".to_string()),
            op: Some(Op::Read),
            outcome: Some(Outcome::Ok),
            ..CallFields::default()
        };
        span
    };
    let committed = |cluster: &str, value: f64| {
        use lagscope_model::conventions::{CLUSTER, METRIC_COMMITTED_STATE, NAMESPACE, NODE_ID};
        let labels = [(CLUSTER, cluster), (NAMESPACE, "ns1"), (NODE_ID, "nn-1")];
        lagscope_model::Sample {
            series: std::sync::Arc::new(lagscope_model::SeriesKey {
                name: METRIC_COMMITTED_STATE.to_string(),
                labels: labels.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect(),
            }),
            meta: std::sync::Arc::new(lagscope_model::SeriesMeta {
                kind: lagscope_model::MetricKind::Gauge,
                unit: None,
                description: None,
            }),
            time_unix_nano: 0,
            start_time_unix_nano: None,
            value: lagscope_model::PointValue::Number(value),
        }
    };
    let samples = vec![committed("a", 100.0), committed("b", 200.0)];
    let mut held = HeldTimelines::new(1_000);
    let first = held.insert(attempt(5, "c1", 1, "a"));
    held.insert(attempt(50, "c1", 0, "a"));
    held.insert(attempt(10, "c2", 0, "b"));
    held.refresh();
    let input = crate::AnalysisInput::from_held(&mut held, samples.clone());
    assert_eq!(input.timelines[0].cluster.as_deref(), Some("a"));
    held.give_back(input.timelines);
    held.remove(first);
    held.refresh();
    let input = crate::AnalysisInput::from_held(&mut held, samples.clone());
    let spans: Vec<Span> = held.spans().cloned().collect();
    let mut expected = build_timelines(&spans, 1_000);
    crate::enrich(&mut expected, &samples);
    assert_eq!(expected[0].cluster.as_deref(), Some("b"));
    assert_eq!(input.timelines, expected);
}

#[test]
fn an_attempt_that_leaves_and_joins_again_before_a_refresh_keeps_its_hops() {
    // A copy of an attempt read with an earlier order than the attempt (a store's ids read
    // late) displaces it from the join; the copy let go before the next refresh, the
    // attempt joins again, and its router hop with it.
    let mut attempt = span(SpanKind::Client, Component::Client, 10);
    attempt.end_unix_nano = 40;
    attempt.trace_id = Some("t1".to_string());
    attempt.span_id = Some("a1".to_string());
    attempt.call = CallFields {
        client_id: Some("client-1".to_string()),
        call_id: Some("call-1".to_string()),
        attempt: Some(0),
        namespace: Some("ns1".to_string()),
        op: Some(Op::Read),
        outcome: Some(Outcome::Ok),
        ..CallFields::default()
    };
    let mut router = span(SpanKind::Server, Component::Router, 12);
    router.trace_id = Some("t1".to_string());
    router.span_id = Some("r1".to_string());
    router.parent_span_id = Some("a1".to_string());
    router.resource.node_id = Some("router-1".to_string());
    router.call = attempt.call.clone();
    let mut held = HeldTimelines::new(1_000);
    held.insert_at(20, attempt.clone());
    held.insert_at(30, router);
    held.refresh();
    let before = held.take_timelines();
    assert_eq!(before[0].calls[0].attempts[0].router_node.as_deref(), Some("router-1"));
    held.give_back(before.clone());
    held.insert_at(5, attempt);
    held.remove((10, 5));
    held.refresh();
    let spans: Vec<Span> = held.spans().cloned().collect();
    assert_eq!(held.take_timelines(), build_timelines(&spans, 1_000));
    assert_eq!(build_timelines(&spans, 1_000), before);
}

#[test]
fn held_timelines_are_what_the_join_builds_from_scratch() {
    let config = crate::AnalyzerConfig::default();
    let (mut kept, mut settled_out) = (0, 0);
    let mut found_of_kinds = [
        (lagscope_model::AnomalyKind::StaleRead, 0),
        (lagscope_model::AnomalyKind::CarriedStateRegression, 0),
        (lagscope_model::AnomalyKind::RouterStateDropped, 0),
    ];
    for seed in 0..60 {
        let mut numbers = Numbers(seed * 7_919 + 1);
        // (Apart: the spans made are those of the test before verdicts were kept.)
        let mut verdict_numbers = Numbers(seed + 17);
        let mut samples: Vec<lagscope_model::Sample> = Vec::new();
        let horizon = [1_000, 30][numbers.below(2) as usize];
        let mut held = HeldTimelines::new(horizon);
        let by_order = seed % 2 == 1;
        let (mut next_id, mut sent): (u64, Vec<Span>) = (0, Vec::new());
        let mut keys: Vec<SpanKey> = Vec::new();
        for round in 0..30 {
            let now = round * 20;
            for _ in 0..numbers.below(6) {
                let mut spans = call_spans(&mut numbers, &mut next_id, now);
                if !sent.is_empty() && numbers.chance(20) {
                    let mut again = sent[numbers.below(sent.len() as u64) as usize].clone();
                    if numbers.chance(30) {
                        // The same ids at another start: another span.
                        again.start_unix_nano += 1 + numbers.below(5) as i64;
                    }
                    spans.push(again);
                }
                // Hops often arrive before their attempt.
                if numbers.chance(50) {
                    spans.reverse();
                }
                sent.extend(spans.iter().cloned());
                for span in spans {
                    if by_order {
                        // Orders out of arrival order (a store's ids, read late).
                        let order = numbers.below(1 << 20);
                        keys.push((span.start_unix_nano, order));
                        held.insert_at(order, span);
                    } else {
                        keys.push(held.insert(span));
                    }
                }
            }
            if numbers.chance(30) && !keys.is_empty() {
                let key = keys.swap_remove(numbers.below(keys.len() as u64) as usize);
                held.remove(key);
            }
            let limit = 40 + numbers.below(40) as usize;
            held.keep_newest(limit, numbers.chance(10).then_some(now - 100));
            if numbers.chance(15) {
                // Settling lets spans go as removing them does.
                let before = now - numbers.below(80) as i64;
                let let_go = held.settle(before, |_| i64::MAX);
                assert!(let_go.iter().all(|(key, _)| !held.contains(*key)), "seed {seed}, round {round}");
            }
            keys.retain(|key| held.contains(*key));
            assert!(held.loose_is_exact(), "seed {seed}, round {round}");
            // The metrics of the nodes move too (apart: the spans made are those of the
            // test before they were told).
            samples.retain(|sample| sample.time_unix_nano >= now - 60);
            for _ in 0..verdict_numbers.below(8) {
                samples.push(node_sample(&mut verdict_numbers, now));
            }
            samples.sort_by_key(|sample| sample.time_unix_nano);
            held.refresh();
            assert!(held.loose_is_exact(), "seed {seed}, round {round}");
            let spans: Vec<Span> = held.spans().cloned().collect();
            let mut expected = build_timelines(&spans, horizon);
            // Named by the first attempt a settle let go, when it was earlier than any held.
            for timeline in &mut expected {
                let group = &held.groups[&(timeline.client_id.clone(), timeline.namespace.clone())];
                if let Some((first, cluster, system)) = &group.first_let_go
                    && group.attempts.first().is_none_or(|held| first < held)
                {
                    (timeline.cluster, timeline.system) = (cluster.clone(), system.clone());
                }
            }
            crate::enrich(&mut expected, &samples);
            // Told what the metrics said where that may have changed: as told all of it.
            let mut input = crate::AnalysisInput::from_held(&mut held, samples.clone());
            assert_eq!(input.timelines, expected, "seed {seed}, round {round}");
            // The verdicts kept about the calls that did not change, and the calls that
            // did judged again: what judging every call finds.
            input.verdicts = held.take_verdicts();
            kept += input
                .verdicts
                .iter()
                .map(|verdicts| {
                    verdicts.found.iter().filter(|(_, start, _)| *start < verdicts.unchanged_before).count()
                })
                .sum::<usize>();
            let found = crate::analyze_held_kinds(&mut input, &config, |_| true);
            let all = crate::analyze(&input, &config);
            // Of the calls before a timeline's cut, the verdicts keep nothing (they are
            // reported no more); of the later ones, what was found with the whole history
            // is what judging what is left finds.
            let reported = |anomaly: &&Anomaly| {
                anomaly.client_id.as_deref().is_none_or(|client_id| {
                    anomaly.start_unix_nano >= held.settled_from(client_id, anomaly.namespace.as_deref())
                })
            };
            settled_out += all.iter().filter(|anomaly| !reported(anomaly)).count();
            assert_eq!(
                found.iter().map(|anomaly| &**anomaly).filter(reported).collect::<Vec<_>>(),
                all.iter().filter(reported).collect::<Vec<_>>(),
                "seed {seed}, round {round}"
            );
            for (kind, count) in &mut found_of_kinds {
                *count += all.iter().filter(|anomaly| anomaly.kind == *kind).count();
            }
            let (timelines, verdicts) = (input.timelines, input.verdicts);
            if numbers.chance(90) {
                held.give_back(timelines);
            }
            if verdict_numbers.chance(90) {
                held.give_back_verdicts(verdicts);
            }
        }
    }
    // Each kind judged from verdicts was found, and often; many were kept from a pass before.
    for (kind, count) in found_of_kinds {
        assert!(count > 100, "{kind:?}: {count}");
    }
    assert!(kept > 1_000, "{kept} kept");
    assert!(settled_out > 100, "{settled_out} about calls before a cut");
}

#[test]
fn a_settle_keeps_its_witnesses_whole_and_the_timeline_as_named() {
    // A client's first attempt (0 s) sent no cluster and failed; its write (1 s) went through
    // a span of no call (a proxy's) to the server that served it; five minutes of reads after
    // it, served at 50 below its 100. Settled to the last minute: the first attempt goes, the
    // write stays as the witness of the floor, with the span that joins it to its server.
    let client = |at: i64, op: Op, outcome: Outcome, state: StateFields| {
        let mut span = attempt_at(at, 0, at, op, state);
        span.call.outcome = Some(outcome);
        span.resource.cluster = (at > 0).then(|| "prod".to_string());
        span.attributes.insert("server.address".to_string(), serde_json::json!(if at == 1 { "east" } else { "west" }));
        span
    };
    let under = |parent: &Span, span_id: &str, component: Component| {
        let mut span = span(SpanKind::Server, component, parent.start_unix_nano + 1_000);
        span.end_unix_nano = parent.end_unix_nano - 1_000;
        span.trace_id.clone_from(&parent.trace_id);
        span.parent_span_id.clone_from(&parent.span_id);
        span.span_id = Some(span_id.to_string());
        span
    };
    let mut held = HeldTimelines::new(90 * SECOND);
    held.insert(client(0, Op::Read, Outcome::Error, StateFields::default()));
    let write = client(1, Op::Write, Outcome::Ok, StateFields { returned: Some(100), ..StateFields::default() });
    let proxy = under(&write, "00000000000000aa", Component::Other("proxy".to_string()));
    let mut server = under(&proxy, "00000000000000bb", Component::Server);
    server.resource.node_id = Some("nn-active".to_string());
    server.call.namespace = Some("ns1".to_string());
    server.call.state = StateFields { served: Some(100), returned: Some(100), ..StateFields::default() };
    for span in [write, proxy, server] {
        held.insert(span);
    }
    for at in 2..300 {
        let state = StateFields { served: Some(50), returned: Some(50), ..StateFields::default() };
        held.insert(client(at, Op::Read, Outcome::Ok, state));
    }
    let whole = {
        let spans: Vec<Span> = held.spans().cloned().collect();
        build_timelines(&spans, 90 * SECOND)
    };
    assert_eq!(whole[0].cluster, None, "named by its first attempt");
    assert_eq!(whole[0].calls[1].attempts[0].served_by.as_deref(), Some("nn-active"));
    for _ in 0..14 {
        held.settle(240 * SECOND, |_| i64::MAX);
    }
    assert!(held.settled_from("client-1", Some("ns1")) > 200 * SECOND);
    assert!(held.spans().all(|span| span.start_unix_nano > 0), "the first attempt went");
    held.refresh();
    let input = crate::AnalysisInput::from_held(&mut held, Vec::new());
    let timeline = &input.timelines[0];
    assert_eq!(timeline.cluster, None, "still named by the first attempt");
    let write = &timeline.calls[0];
    assert_eq!(write.start_unix_nano, SECOND, "the write stays");
    assert_eq!(write.attempts[0].served_by.as_deref(), Some("nn-active"), "joined to its server still");
    // What follows the cut starts at the last call before it: the write before that is a
    // witness, and no call the client made just before it (to another cluster).
    let (consecutive, cut) = (input.consecutive_calls(0), held.settled_from("client-1", Some("ns1")));
    assert!(consecutive.len() < timeline.calls.len() - 1, "the witnesses are not among them");
    assert!(consecutive[0].start_unix_nano < cut && consecutive[1].start_unix_nano >= cut);
    let found = crate::analyze(&input, &crate::AnalyzerConfig::default());
    assert!(
        found.iter().all(|anomaly| anomaly.kind != lagscope_model::AnomalyKind::FailoverFlapping),
        "no switches between a witness and the calls after it: {found:?}"
    );
}

#[test]
fn a_retry_of_a_call_a_settle_let_go_is_late() {
    // A client's calls once a second for two minutes, each one attempt; settled at 60 s. A
    // retry of the call of 5 s arriving then, begun at 70 s (after the cut, within the 90 s
    // horizon of its call), would be a call of its own held: it is late, to be read anew with
    // its call. A retry of it begun 91 s after it is another call by the horizon, and a new
    // call is none's.
    let attempt = |call: i64, number: i64, at: i64| attempt_at(call, number, at, Op::Read, StateFields::default());
    let mut held = HeldTimelines::new(90 * SECOND);
    for at in 0..120 {
        held.insert(attempt(at, 0, at));
    }
    for _ in 0..10 {
        held.settle(60 * SECOND, |_| i64::MAX);
    }
    let cut = held.settled_from("client-1", Some("ns1"));
    assert!((10 * SECOND..=60 * SECOND).contains(&cut), "the call of 5 s went: {cut}");
    assert!(held.spans().all(|span| span.start_unix_nano != 5 * SECOND));
    let retry = attempt(5, 1, 70);
    assert!(held.is_late(&retry), "a retry of a call let go");
    // (The settle cut 59 s behind the newest span, at 60 s, and the timeline at `cut`.)
    assert_eq!(held.settling_to_hold(&retry), Some(59 * SECOND + cut - 5 * SECOND), "to hold its call");
    assert!(!held.is_late(&attempt(5, 1, 96)), "begun past its call's horizon: another call");
    assert!(!held.is_late(&attempt(70, 1, 75)), "a retry of a call held");
    assert!(!held.is_late(&attempt(500, 0, 119)), "a new call");
}
