//! Log lines as the analyzer's events: a router that only logs its NoNamenodesAvailable
//! answers (`Cannot get available namenode for ...`) gets its `no_namenodes_window` from the
//! lines, the same through the batch detectors and the streaming engine; lines with trace
//! context (their router span counts), lines logged by clients, and scattered lines do not
//! make a window.

use lagscope_analyzer::log_events::{LogEventKind, classify};
use lagscope_analyzer::stream::{Engine, SpanRec};
use lagscope_analyzer::{AnalysisInput, AnalyzerConfig, analyze, sort_anomalies};
use lagscope_model::{
    Anomaly, AnomalyKind, CallFields, Component, LogRecord, MetricKind, Op, PointValue, ResourceFields, Sample,
    SeriesKey, SeriesMeta, Span, SpanKind,
};
use serde_json::json;

const SECOND: i64 = 1_000_000_000;
const T0: i64 = 1_764_435_600 * SECOND;

fn line(at: i64, text: &str, component: &str, node: &str, traced: bool) -> LogRecord {
    LogRecord {
        time_unix_nano: at,
        observed_time_unix_nano: None,
        severity_number: 13,
        severity_text: Some("WARN".to_string()),
        body: json!(text),
        event_name: None,
        trace_id: traced.then(|| "0af7651916cd43dd8448eb211c80319c".to_string()),
        span_id: traced.then(|| "b7ad6b7169203331".to_string()),
        resource: ResourceFields {
            service_name: Some("hdfs-router".to_string()),
            system: Some("hdfs-rbf".to_string()),
            cluster: Some("prod-east".to_string()),
            component: Some(Component::parse(component)),
            node_id: Some(node.to_string()),
            attributes: serde_json::Map::new(),
        },
        scope_name: None,
        scope_version: None,
        attributes: serde_json::Map::new(),
    }
}

/// A router's lines: every `every` seconds from `from` to `to` (seconds after T0).
fn router_lines(from: i64, to: i64, every: i64, node: &str, component: &str, traced: bool) -> Vec<LogRecord> {
    (from..=to)
        .step_by(every as usize)
        .map(|second| {
            line(
                T0 + second * SECOND,
                "Cannot get available namenode for ns1 nn1.example:8020 error: \
                 No namenodes available under nameservice ns1",
                component,
                node,
                traced,
            )
        })
        .collect()
}

fn batch(logs: &[LogRecord]) -> Vec<Anomaly> {
    let config = AnalyzerConfig::default();
    analyze(&AnalysisInput::from_telemetry(&[], Vec::new(), config.stream.horizon()).with_logs(logs), &config)
}

fn streamed(logs: &[LogRecord]) -> Vec<Anomaly> {
    let config = AnalyzerConfig::default();
    let mut engine = Engine::new(&config, |_| true);
    for event in logs.iter().filter_map(classify) {
        engine.push_log_event(&event);
    }
    let (mut anomalies, stats) = engine.finish();
    assert_eq!(stats.log_events, logs.iter().filter_map(classify).count() as u64);
    sort_anomalies(&mut anomalies);
    anomalies
}

#[test]
fn a_router_that_only_logs_its_answers_gets_its_window_from_the_lines() {
    // 40 s of answers, one every 2 s, then (after more than the 10 s gap) a short blip.
    let mut logs = router_lines(0, 40, 2, "router-1", "router", false);
    logs.extend(router_lines(100, 102, 1, "router-1", "router", false));
    let anomalies = batch(&logs);
    assert_eq!(anomalies.len(), 1, "{anomalies:#?}");
    let window = &anomalies[0];
    assert_eq!(window.kind, AnomalyKind::NoNamenodesWindow);
    assert_eq!(window.node_id.as_deref(), Some("router-1"));
    assert_eq!(window.namespace.as_deref(), Some("ns1"));
    assert_eq!(window.cluster.as_deref(), Some("prod-east"));
    assert_eq!((window.start_unix_nano, window.end_unix_nano), (T0, T0 + 40 * SECOND));
    assert_eq!(window.evidence["attempts"], 21, "{}", window.evidence);
    assert_eq!(window.evidence["namenode_tried_first"], "nn1.example:8020", "{}", window.evidence);
    assert_eq!(streamed(&logs), anomalies, "the streaming engine finds the same window");
}

#[test]
fn lines_sent_twice_count_once() {
    // Every line of the window comes again a few lines later (the router's exporter retried
    // requests whose acknowledgements were lost): 21 answers, not 42. A line logged twice at
    // different times is two answers.
    let once = router_lines(0, 40, 2, "router-1", "router", false);
    let mut twice = Vec::new();
    for (index, line) in once.iter().enumerate() {
        twice.push(line.clone());
        if index >= 3 {
            twice.push(once[index - 3].clone());
        }
    }
    let expected = batch(&once);
    assert_eq!(expected[0].evidence["attempts"], 21, "{}", expected[0].evidence);
    assert_eq!(batch(&twice), expected, "batch");
    assert_eq!(streamed(&twice), expected, "streaming engine");
    let mut again_later = once.clone();
    again_later.push(line(T0 + 41 * SECOND, once[0].body.as_str().expect("text"), "router", "router-1", false));
    assert_eq!(batch(&again_later)[0].evidence["attempts"], 22);
}

#[test]
fn traced_client_and_scattered_lines_make_no_window() {
    let cases = [
        ("traced: the router span counts instead", router_lines(0, 40, 2, "router-1", "router", true)),
        ("logged by a client, not the router", router_lines(0, 40, 2, "client-1", "client", false)),
        ("further apart than the gap", router_lines(0, 60, 12, "router-1", "router", false)),
        ("shorter than the minimum window", router_lines(0, 4, 1, "router-1", "router", false)),
    ];
    for (case, logs) in cases {
        assert_eq!(batch(&logs), Vec::new(), "{case}");
        assert_eq!(streamed(&logs), Vec::new(), "{case}");
    }
}

#[test]
fn the_other_failure_lines_are_recognised_with_who_logged_them() {
    let mut ozone = line(
        T0,
        "Encountered OMNotLeaderException from om2. Disable OM follower read and retry OM leader directly.",
        "client",
        "app-host-1",
        false,
    );
    ozone.attributes.insert("lagscope.client.id".to_string(), json!("ozone-client-7"));
    let event = classify(&ozone).expect("recognised");
    assert_eq!(event.kind, LogEventKind::FollowerReadDisabled);
    assert_eq!(event.client_id.as_deref(), Some("ozone-client-7"));
    assert_eq!(event.fields["peer"], "om2");
    assert_eq!(event.router_answer(), None);
    let long = "x".repeat(5000) + " Observer Node is too far behind: serverStateId = 1 clientStateId = 2";
    assert_eq!(classify(&line(T0, &long, "server", "nn3", false)).map(|event| event.text.len()), Some(1024));
    assert_eq!(classify(&line(T0, "all good", "router", "router-1", false)), None);
}

fn switch_line(at_second: i64, from: &str, to: &str, back: bool, client: Option<&str>) -> LogRecord {
    let text = if back {
        format!(
            "Current Pulsar service is secondary: {from}, the primary service: {to} has been recover for 1000 ms, \
             switch back to the primary service"
        )
    } else {
        format!(
            "Current Pulsar service is {from}, it has been down for 31000 ms, switch to the service {to}. \
             The current service down at 1764435600000"
        )
    };
    let mut record = line(T0 + at_second * SECOND, &text, "client", "app-1", false);
    record.resource.cluster = Some("pulsar-global".to_string());
    if let Some(client) = client {
        record.attributes.insert("lagscope.client.id".to_string(), json!(client));
    }
    record
}

#[test]
fn a_client_that_logs_its_switches_is_judged_by_them() {
    let (a, b) = ("pulsar://a:6650", "pulsar://b:6650");
    let logs = vec![
        switch_line(0, a, b, false, Some("producer-1")),
        switch_line(20, b, a, true, Some("producer-1")),
        switch_line(40, a, b, false, Some("producer-1")),
        // Another client's single switch, and lines that name no client: not flapping.
        switch_line(10, a, b, false, Some("producer-2")),
        switch_line(12, a, b, false, None),
        switch_line(14, b, a, true, None),
    ];
    let anomalies = batch(&logs);
    assert_eq!(anomalies.len(), 1, "{anomalies:#?}");
    let flapping = &anomalies[0];
    assert_eq!(flapping.kind, AnomalyKind::FailoverFlapping);
    assert_eq!(flapping.client_id.as_deref(), Some("producer-1"));
    assert_eq!(flapping.cluster.as_deref(), Some("pulsar-global"));
    assert_eq!(flapping.evidence["switches"], 3);
    assert_eq!(flapping.evidence["path"], json!([a, b, a, b]));
    assert_eq!((flapping.start_unix_nano, flapping.end_unix_nano), (T0, T0 + 40 * SECOND));
    assert_eq!(streamed(&logs), anomalies, "the streaming engine finds the same");

    // Switches further apart than the switch-back delay (60 s) are settled failovers.
    let settled = vec![
        switch_line(0, a, b, false, Some("producer-1")),
        switch_line(70, b, a, true, Some("producer-1")),
        switch_line(140, a, b, false, Some("producer-1")),
    ];
    assert_eq!(batch(&settled), Vec::new());
    assert_eq!(streamed(&settled), Vec::new());
}

/// A send of `client` from `node` to the cluster at `address`, at `second` after T0.
fn send(client: &str, node: &str, sequence: u64, second: i64, address: &str) -> Span {
    let start = second * SECOND;
    let mut span =
        span_of(("pulsar", "pulsar-global"), "client", node, (sequence, sequence), (start, start + SECOND / 100));
    span.name = "send orders".to_string();
    span.call.client_id = Some(client.to_string());
    span.call.namespace = Some("orders".to_string());
    span.call.call_id = Some(format!("{client}-{sequence}"));
    span.call.op = Some(Op::Write);
    span.call.rpc_method = Some("send".to_string());
    span.attributes.insert("server.address".to_string(), json!(address));
    span
}

/// Unnamed switch lines logged by `node`: east → west at 0 s, back at 20 s, away at 40 s.
fn unnamed_switches(node: &str) -> Vec<LogRecord> {
    let (east, west) = ("pulsar://pulsar-east:6650", "pulsar://pulsar-west:6650");
    let mut lines = vec![
        switch_line(0, east, west, false, None),
        switch_line(20, west, east, true, None),
        switch_line(40, east, west, false, None),
    ];
    for line in &mut lines {
        line.resource.node_id = Some(node.to_string());
    }
    lines
}

#[test]
fn switch_lines_naming_no_client_are_the_switches_of_the_one_client_that_calls_from_their_node() {
    // Its sends show one switch (none went out between 0 s and 40 s but one to the west at
    // 25 s): its calls' addresses alone do not show the flapping its lines tell.
    let sends = |client: &str, node: &str, first: u64| -> Vec<Span> {
        [(-10, "pulsar-east"), (25, "pulsar-east"), (45, "pulsar-west"), (50, "pulsar-west")]
            .into_iter()
            .enumerate()
            .map(|(index, (second, address))| send(client, node, first + index as u64, second, address))
            .collect()
    };
    let lines = unnamed_switches("app-1");
    let found = analyzed_both_ways(&sends("producer-1", "app-1", 1), &lines);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].kind, AnomalyKind::FailoverFlapping);
    assert_eq!(found[0].client_id.as_deref(), Some("producer-1"));
    assert_eq!(found[0].evidence["source"], "client log");
    assert_eq!(found[0].evidence["switches"], 3);
    assert_eq!((found[0].start_unix_nano, found[0].end_unix_nano), (T0, T0 + 40 * SECOND));

    // The lines of another node, or of a node of that name in another cluster, are not its.
    assert_eq!(analyzed_both_ways(&sends("producer-1", "app-2", 1), &lines), Vec::new());
    let mut elsewhere = lines.clone();
    for line in &mut elsewhere {
        line.resource.cluster = Some("pulsar-other".to_string());
    }
    assert_eq!(analyzed_both_ways(&sends("producer-1", "app-1", 1), &elsewhere), Vec::new());

    // Two clients calling from the node: whose the lines are is not known, and neither is
    // judged by them.
    let mut two = sends("producer-1", "app-1", 1);
    two.extend(sends("producer-2", "app-1", 11));
    assert_eq!(analyzed_both_ways(&two, &lines), Vec::new());
}

/// `client`'s TCP probe verdict on `host` (1 up, 0 down) at `second` after T0.
fn probe(client: &str, host: &str, second: i64, up: f64) -> Sample {
    let labels = [
        ("lagscope.cluster", "pulsar-global"),
        ("lagscope.node.id", "app-1"),
        ("server.address", host),
        ("lagscope.probe.kind", "tcp"),
        ("lagscope.client.id", client),
    ];
    Sample {
        series: SeriesKey {
            name: "lagscope.probe.up".to_string(),
            labels: labels.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect(),
        }
        .into(),
        meta: SeriesMeta { kind: MetricKind::Gauge, unit: None, description: None }.into(),
        time_unix_nano: T0 + second * SECOND,
        start_time_unix_nano: None,
        value: PointValue::Number(up),
    }
}

/// producer-1's sends from app-1, at (second after T0, cluster address) each.
fn sends_at(at: &[(i64, &str)]) -> Vec<Span> {
    (at.iter().enumerate())
        .map(|(index, (second, address))| send("producer-1", "app-1", index as u64 + 1, *second, address))
        .collect()
}

#[test]
fn a_logged_switch_back_that_did_not_wait_is_named_from_the_probes() {
    // The lines of `unnamed_switches`: east → west at 0 s, back at 20 s, away at 40 s. The probe
    // saw east down at -10 s and up again at 15 s, west up throughout: the switch back at 20 s
    // came 5 s after east recovered, with west still up (apache/pulsar#14442).
    let sends = sends_at(&[(-10, "pulsar-east"), (25, "pulsar-east"), (45, "pulsar-west"), (50, "pulsar-west")]);
    let mut probes = Vec::new();
    for second in (-20..=60).step_by(5) {
        probes.push(probe("producer-1", "pulsar-east", second, if (-10..15).contains(&second) { 0.0 } else { 1.0 }));
        probes.push(probe("producer-1", "pulsar-west", second, 1.0));
    }
    let lines = unnamed_switches("app-1");
    let found = analyzed_with_samples(&sends, &probes, &lines);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].evidence["source"], "client log");
    assert!(found[0].cause.contains("apache/pulsar#14442"), "{}", found[0].cause);
    let early = &found[0].evidence["early_switch_back"];
    assert_eq!(early["at_unix_nano"], T0 + 20 * SECOND, "{early}");
    assert_eq!(early["probe_up_seconds"], 5.0, "{early}");
    // Without the probes: the general cause.
    let found = analyzed_with_samples(&sends, &[], &lines);
    assert!(!found[0].cause.contains("apache/pulsar#14442"), "{}", found[0].cause);
}

#[test]
fn a_logged_switch_back_is_judged_before_its_probes_are_pruned() {
    // As above, and the client sends on for 25 minutes: the streaming engine forgets probe
    // verdicts older than its retention (10 minutes), long before its end.
    let mut sends: Vec<Span> = Vec::new();
    for (index, second) in (-10..1500).step_by(5).enumerate() {
        let address = if (0..20).contains(&second) || second >= 40 { "pulsar-west" } else { "pulsar-east" };
        sends.push(send("producer-1", "app-1", index as u64 + 1, second, address));
    }
    let mut probes = Vec::new();
    for second in (-20..1500).step_by(5) {
        probes.push(probe("producer-1", "pulsar-east", second, if (-10..15).contains(&second) { 0.0 } else { 1.0 }));
        probes.push(probe("producer-1", "pulsar-west", second, 1.0));
    }
    let lines = unnamed_switches("app-1");
    let config = AnalyzerConfig::default();
    let input = AnalysisInput::from_telemetry(&sends, probes.clone(), config.stream.horizon()).with_logs(&lines);
    let batch = analyze(&input, &config);
    assert_eq!(batch.len(), 1, "{batch:#?}");
    assert!(batch[0].cause.contains("apache/pulsar#14442"), "{}", batch[0].cause);
    // The engine is given everything in time order, as a capture holds it.
    let mut engine = Engine::new(&config, |_| true);
    let events: Vec<_> = lines.iter().filter_map(classify).collect();
    let mut order: Vec<(i64, usize, usize)> = Vec::new();
    order.extend(probes.iter().enumerate().map(|(index, sample)| (sample.time_unix_nano, 0, index)));
    order.extend(sends.iter().enumerate().map(|(index, span)| (span.end_unix_nano, 1, index)));
    order.extend(events.iter().enumerate().map(|(index, event)| (event.time_unix_nano, 2, index)));
    order.sort_unstable();
    for (_, source, index) in order {
        match source {
            0 => engine.push_model_sample(&probes[index]),
            1 => {
                let record = SpanRec::from_span(&sends[index], &mut engine.interner);
                engine.push_span(&record);
            }
            _ => engine.push_log_event(&events[index]),
        }
    }
    let (mut streamed, _) = engine.finish();
    sort_anomalies(&mut streamed);
    assert_eq!(streamed, batch, "the streaming engine judged the line before it forgot the probes");
}

#[test]
fn a_client_whose_lines_come_after_its_calls_is_judged_by_the_lines_alone() {
    // Its sends show two switches within the delay (east, west at 10 s, east at 30 s); its
    // lines, pushed after every span, tell three: one anomaly, from the lines.
    let spans = sends_at(&[(-10, "pulsar-east"), (10, "pulsar-west"), (30, "pulsar-east"), (45, "pulsar-west")]);
    let by_address = analyzed_both_ways(&spans, &[]);
    assert_eq!(by_address.len(), 1, "{by_address:#?}");
    assert_eq!(by_address[0].evidence.get("source"), None);
    let found = analyzed_both_ways(&spans, &unnamed_switches("app-1"));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].evidence["source"], "client log");
}

/// A span of `node` (a `component` of `system` in `cluster`), `start..end` nanoseconds after T0.
fn span_of(
    (system, cluster): (&str, &str),
    component: &str,
    node: &str,
    (trace, span_id): (u64, u64),
    (start, end): (i64, i64),
) -> Span {
    Span {
        trace_id: Some(format!("{trace:032x}")),
        span_id: Some(format!("{span_id:016x}")),
        parent_span_id: None,
        name: "call".to_string(),
        kind: if component == "client" { SpanKind::Client } else { SpanKind::Server },
        start_unix_nano: T0 + start,
        end_unix_nano: T0 + end,
        status_code: 0,
        status_message: None,
        resource: ResourceFields {
            service_name: Some(format!("{system}-{component}")),
            system: Some(system.to_string()),
            cluster: Some(cluster.to_string()),
            component: Some(Component::parse(component)),
            node_id: Some(node.to_string()),
            attributes: serde_json::Map::new(),
        },
        scope_name: None,
        scope_version: None,
        scope_attributes: serde_json::Map::new(),
        call: CallFields::default(),
        attributes: serde_json::Map::new(),
        events: Vec::new(),
        links: Vec::new(),
    }
}

/// A client read attempt and the server span under it (times in seconds after T0).
fn read(trace: u64, call: &str, start: i64, server: &str, role: &str, consistency: &str, follower: bool) -> [Span; 2] {
    let base = |component: &str, node: &str, start: i64, end: i64, span_id: u64| {
        let mut span = span_of(("ozone", "ozone-1"), component, node, (trace, span_id), (start, end));
        span.name = "LookupKey".to_string();
        span
    };
    let mut client = base("client", "s3g", start * SECOND, start * SECOND + SECOND / 2, trace * 2);
    client.call.client_id = Some("ozone-client-9".to_string());
    client.call.namespace = Some("omservice".to_string());
    client.call.call_id = Some(call.to_string());
    client.call.op = Some(Op::Read);
    client.call.rpc_method = Some("LookupKey".to_string());
    client.call.consistency = Some(consistency.to_string());
    client.call.follower_read = Some(follower);
    let mut server = base("server", server, start * SECOND + 1_000, start * SECOND + SECOND / 4, trace * 2 + 1);
    server.parent_span_id = client.span_id.clone();
    server.call.namespace = Some("omservice".to_string());
    server.call.node_role = Some(role.to_string());
    server.call.state.served = Some(100 + trace as i64);
    [client, server]
}

fn disable_line(at_second: i64) -> LogRecord {
    let mut record = line(
        T0 + at_second * SECOND,
        "Encountered OMNotLeaderException from om2. Disable OM follower read and retry OM leader directly.",
        "client",
        "s3g",
        false,
    );
    record.attributes.insert("lagscope.client.id".to_string(), json!("ozone-client-9"));
    record
}

fn analyzed_both_ways(spans: &[Span], logs: &[LogRecord]) -> Vec<Anomaly> {
    analyzed_with_samples(spans, &[], logs)
}

/// The batch detectors' anomalies, the streaming engine's held equal to them (samples first,
/// then spans, then lines: lines later than everything they bear on).
fn analyzed_with_samples(spans: &[Span], samples: &[Sample], logs: &[LogRecord]) -> Vec<Anomaly> {
    let config = AnalyzerConfig::default();
    let input = AnalysisInput::from_telemetry(spans, samples.to_vec(), config.stream.horizon()).with_logs(logs);
    let batch = analyze(&input, &config);
    let mut engine = Engine::new(&config, |_| true);
    for sample in samples {
        engine.push_model_sample(sample);
    }
    for span in spans {
        let record = SpanRec::from_span(span, &mut engine.interner);
        engine.push_span(&record);
    }
    for event in logs.iter().filter_map(classify) {
        engine.push_log_event(&event);
    }
    let (mut streamed, _) = engine.finish();
    sort_anomalies(&mut streamed);
    assert_eq!(streamed, batch, "the streaming engine reports what the batch detectors report");
    batch
}

#[test]
fn a_client_that_logs_turning_follower_read_off_is_caught_without_a_rejected_span() {
    // Follower reads on om2; the rejection was retried inside the client (no span of its
    // own), which logged the switch; every later read goes to the leader.
    let mut spans: Vec<Span> = Vec::new();
    spans.extend(read(1, "r1", 0, "om2", "follower", "LINEARIZABLE_ALLOW_FOLLOWER", true));
    spans.extend(read(2, "r2", 30, "om1", "leader", "LOCAL_LEASE", false));
    for (index, start) in [50, 70, 90].into_iter().enumerate() {
        spans.extend(read(3 + index as u64, &format!("r{}", 3 + index), start, "om1", "leader", "DEFAULT", false));
    }
    let logs = vec![disable_line(25)];
    let anomalies = analyzed_both_ways(&spans, &logs);
    let disabled: Vec<&Anomaly> =
        anomalies.iter().filter(|anomaly| anomaly.kind == AnomalyKind::FollowerReadDisabled).collect();
    assert_eq!(disabled.len(), 1, "{anomalies:#?}");
    let anomaly = disabled[0];
    assert_eq!(anomaly.client_id.as_deref(), Some("ozone-client-9"));
    assert_eq!(anomaly.node_id.as_deref(), Some("om2"));
    assert_eq!(anomaly.evidence["reads_after"], 4);
    assert_eq!(anomaly.evidence["source"], "client log");
    assert_eq!(anomaly.evidence["consistency_before"], "LINEARIZABLE_ALLOW_FOLLOWER");
    assert_eq!(anomaly.evidence["consistencies_after"], json!(["DEFAULT", "LOCAL_LEASE"]));
    assert_eq!(anomaly.start_unix_nano, T0 + 25 * SECOND);

    // Without the line there is nothing to go on; with a later follower read, it was not for good.
    let without = analyzed_both_ways(&spans, &[]);
    assert!(without.iter().all(|anomaly| anomaly.kind != AnomalyKind::FollowerReadDisabled), "{without:#?}");
    let mut back_on_followers = spans.clone();
    back_on_followers.extend(read(9, "r9", 110, "om3", "follower", "LINEARIZABLE_ALLOW_FOLLOWER", true));
    let found = analyzed_both_ways(&back_on_followers, &logs);
    assert!(found.iter().all(|anomaly| anomaly.kind != AnomalyKind::FollowerReadDisabled), "{found:#?}");
}

/// A client call that router-1 answered NoNamenodesAvailable after trying nn1 (traced: client,
/// router and server spans), at `second` after T0.
fn traced_no_namenodes_answer(second: i64) -> [Span; 3] {
    let trace = 1000 + second as u64;
    let span = |component: &str, node: &str, span_id: u64, parent: Option<u64>, offset: i64| {
        let at = second * SECOND;
        let times = (at + offset, at + 10_000_000 - offset);
        let mut span = span_of(("hdfs-rbf", "prod-east"), component, node, (trace, span_id), times);
        span.parent_span_id = parent.map(|parent| format!("{parent:016x}"));
        span.status_code = 2;
        span.call.namespace = Some("ns1".to_string());
        span
    };
    let mut client = span("client", "app-1", trace * 4, None, 0);
    client.call.client_id = Some("client-1".to_string());
    client.call.call_id = Some(format!("call-{second}"));
    client.call.attempt = Some(1);
    client.call.op = Some(Op::Read);
    client.call.error_type =
        Some("org.apache.hadoop.hdfs.server.federation.router.NoNamenodesAvailableException".to_string());
    let router = span("router", "router-1", trace * 4 + 1, Some(trace * 4), 1_000_000);
    let mut server = span("server", "nn1", trace * 4 + 2, Some(trace * 4 + 1), 2_000_000);
    server.call.node_role = Some("standby".to_string());
    [client, router, server]
}

#[test]
fn a_router_that_traces_and_logs_its_answers_has_each_counted_once() {
    // Every answer is in a trace and in a line without trace context (a router whose log
    // lines are shipped apart from its spans): 21 answers, not 42.
    let spans: Vec<Span> = (0..=40).step_by(2).flat_map(traced_no_namenodes_answer).collect();
    let logs = router_lines(0, 40, 2, "router-1", "router", false);
    let window = |anomalies: &[Anomaly]| -> Anomaly {
        let windows: Vec<&Anomaly> =
            anomalies.iter().filter(|anomaly| anomaly.kind == AnomalyKind::NoNamenodesWindow).collect();
        assert_eq!(windows.len(), 1, "{anomalies:#?}");
        windows[0].clone()
    };
    let both = window(&analyzed_both_ways(&spans, &logs));
    assert_eq!(both.evidence["attempts"], 21, "{}", both.evidence);
    assert_eq!(both.evidence["namenode_tried_first"], "nn1", "the spans name the node: {}", both.evidence);
    assert_eq!(both.evidence["clients_affected"], json!(["client-1"]));
    let spans_only = window(&analyzed_both_ways(&spans, &[]));
    assert_eq!(spans_only.evidence["attempts"], 21, "{}", spans_only.evidence);
    let lines_only = window(&analyzed_both_ways(&[], &logs));
    assert_eq!(lines_only.evidence["attempts"], 21, "{}", lines_only.evidence);
    assert_eq!(lines_only.evidence["namenode_tried_first"], "nn1.example:8020");
    // Lines the spans do not have (more answers logged than traced): the lines' count.
    let more_lines = router_lines(0, 40, 1, "router-1", "router", false);
    assert_eq!(window(&analyzed_both_ways(&spans, &more_lines)).evidence["attempts"], 41);
}
