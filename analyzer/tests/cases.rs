//! Data-driven analyzer tests: each `cases/NAME.spans` is a history of spans written one per
//! line; `cases/NAME.expected` is the timelines and anomalies the analyzer must produce,
//! compared whole. Regenerate with `UPDATE_EXPECT=1 cargo test -p lagscope-analyzer` and
//! review the diff.
//!
//! A metric line: `metric NAME NODE AT_SECONDS VALUE [gauge|counter] label=value ...` (the
//! cluster is `prod`; `ns=` sets the namespace label). A span line:
//! `COMPONENT NODE START..END key=value ...` (times in milliseconds). Keys:
//! client ns call attempt op method target target_role role consistency follower_read
//! carried returned served committed router outcome error requeues trace span parent cluster.

use std::fmt::Write;
use std::path::Path;

use lagscope_analyzer::stream::{Engine, SpanRec};
use lagscope_analyzer::{AnalysisInput, AnalyzerConfig, analyze};
use std::collections::BTreeMap;

use lagscope_model::{
    CallFields, Component, MetricKind, Op, Outcome, PointValue, ResourceFields, Sample, SeriesKey, SeriesMeta, Span,
    SpanKind, StateFields,
};

const BASE_MS: i64 = 1_764_435_600_000;

#[test]
fn every_case_matches_its_expected_output() {
    let directory = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cases");
    let mut cases: Vec<_> = std::fs::read_dir(&directory)
        .expect("cases directory")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "spans"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 8, "expected the case files, found {}", cases.len());
    for case in cases {
        let text = std::fs::read_to_string(&case).expect("case readable");
        let (spans, samples) = parse_case(&case.display().to_string(), &text);
        let streamed = streamed(&spans, &samples);
        let batch = analyze(
            &AnalysisInput::from_telemetry(&spans, samples.clone(), AnalyzerConfig::default().stream.horizon()),
            &AnalyzerConfig::default(),
        );
        assert_eq!(streamed, batch, "{}: the streaming engine differs from the batch analysis", case.display());
        for anomaly in &batch {
            // The live analyzer's client passes run only the kinds that name a client.
            assert_eq!(
                anomaly.client_id.is_some(),
                anomaly.kind.names_client(),
                "{}: {} names client {:?}",
                case.display(),
                anomaly.kind.as_str(),
                anomaly.client_id
            );
        }
        let actual = render(&spans, samples);
        expect_test::expect_file![case.with_extension("expected")].assert_eq(&actual);
    }
}

/// The streaming engine over the case, spans and samples in the order they would arrive
/// (by end time).
fn streamed(spans: &[Span], samples: &[Sample]) -> Vec<lagscope_model::Anomaly> {
    let config = AnalyzerConfig::default();
    let mut engine = Engine::new(&config, |_| true);
    let mut order: Vec<(i64, usize, bool)> =
        spans.iter().enumerate().map(|(index, span)| (span.end_unix_nano, index, true)).collect();
    order.extend(samples.iter().enumerate().map(|(index, sample)| (sample.time_unix_nano, index, false)));
    order.sort();
    for (_, index, is_span) in order {
        if is_span {
            let record = SpanRec::from_span(&spans[index], &mut engine.interner);
            engine.push_span(&record);
        } else {
            engine.push_model_sample(&samples[index]);
        }
    }
    engine.finish().0
}

fn parse_case(name: &str, text: &str) -> (Vec<Span>, Vec<Sample>) {
    let mut spans = Vec::new();
    let mut samples = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let location = format!("{name}:{}", index + 1);
        if let Some(rest) = line.strip_prefix("metric ") {
            samples.push(parse_sample(rest).unwrap_or_else(|error| panic!("{location}: {error}")));
        } else {
            spans.push(parse_span(line).unwrap_or_else(|error| panic!("{location}: {error}")));
        }
    }
    (spans, samples)
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let mut words = line.split_whitespace();
    let name = words.next().ok_or("missing metric name")?;
    let node = words.next().ok_or("missing node")?;
    let at: f64 = words.next().ok_or("missing time")?.parse().map_err(|_| "bad time")?;
    let value: f64 = words.next().ok_or("missing value")?.parse().map_err(|_| "bad value")?;
    let kind = match words.next().ok_or("missing kind")? {
        "gauge" => MetricKind::Gauge,
        "counter" => MetricKind::CumulativeCounter,
        other => return Err(format!("unknown metric kind {other:?}")),
    };
    let mut labels = BTreeMap::from([
        ("lagscope.cluster".to_string(), "prod".to_string()),
        ("lagscope.node.id".to_string(), node.to_string()),
    ]);
    for word in words {
        let (key, value) = word.split_once('=').ok_or_else(|| format!("{word:?} is not label=value"))?;
        let key = if key == "ns" { "lagscope.namespace" } else { key };
        labels.insert(key.to_string(), value.to_string());
    }
    Ok(Sample {
        series: SeriesKey { name: name.to_string(), labels }.into(),
        meta: SeriesMeta { kind, unit: None, description: None }.into(),
        time_unix_nano: (BASE_MS * 1_000_000) + (at * 1e9) as i64,
        start_time_unix_nano: None,
        value: PointValue::Number(value),
    })
}

fn parse_span(line: &str) -> Result<Span, String> {
    let mut words = line.split_whitespace();
    let component = Component::parse(words.next().ok_or("missing component")?);
    let node = words.next().ok_or("missing node")?;
    let times = words.next().ok_or("missing START..END")?;
    let (start, end) = times.split_once("..").ok_or("times must be START..END")?;
    let millis = |text: &str| text.parse::<i64>().map_err(|_| format!("bad time {text:?}"));
    let mut span = Span {
        trace_id: None,
        span_id: None,
        parent_span_id: None,
        name: "call".to_string(),
        kind: match component {
            Component::Client => SpanKind::Client,
            _ => SpanKind::Server,
        },
        start_unix_nano: (BASE_MS + millis(start)?) * 1_000_000,
        end_unix_nano: (BASE_MS + millis(end)?) * 1_000_000,
        status_code: 0,
        status_message: None,
        resource: ResourceFields {
            service_name: Some(format!("test-{component}")),
            system: Some("hdfs-rbf".to_string()),
            cluster: Some("prod".to_string()),
            component: Some(component),
            node_id: (node != "-").then(|| node.to_string()),
            attributes: Default::default(),
        },
        scope_name: None,
        scope_version: None,
        scope_attributes: Default::default(),
        call: CallFields::default(),
        attributes: Default::default(),
        events: Vec::new(),
        links: Vec::new(),
    };
    for word in words {
        let (key, value) = word.split_once('=').ok_or_else(|| format!("{word:?} is not key=value"))?;
        let int = || value.parse::<i64>().map_err(|_| format!("{key}: {value:?} is not an integer"));
        let text = Some(value.to_string());
        let call = &mut span.call;
        let state: &mut StateFields = &mut call.state;
        match key {
            "client" => call.client_id = text,
            "ns" => call.namespace = text,
            "call" => call.call_id = text,
            "attempt" => call.attempt = Some(int()?),
            "op" => call.op = Some(Op::parse(value)),
            "method" => {
                call.rpc_method = text;
                span.name = value.to_string();
            }
            "target" => call.target_node = text,
            "target_role" => call.target_role = text,
            "role" => call.node_role = text,
            "consistency" => call.consistency = text,
            "follower_read" => call.follower_read = Some(value == "true"),
            "carried" => state.carried = Some(int()?),
            "returned" => state.returned = Some(int()?),
            "served" => state.served = Some(int()?),
            "committed" => state.committed = Some(int()?),
            "router" => state.router = Some(int()?),
            "outcome" => call.outcome = Some(Outcome::parse(value)),
            "error" => call.error_type = text,
            "requeues" => call.requeues = Some(int()?),
            "trace" => span.trace_id = Some(format!("{:032x}", int()?)),
            "span" => span.span_id = Some(format!("{:016x}", int()?)),
            "parent" => span.parent_span_id = Some(format!("{:016x}", int()?)),
            "cluster" => span.resource.cluster = text,
            "address" => {
                span.attributes.insert("server.address".to_string(), serde_json::Value::String(value.to_string()));
            }
            other => return Err(format!("unknown key {other:?}")),
        }
    }
    Ok(span)
}

fn render(spans: &[Span], samples: Vec<Sample>) -> String {
    let input = AnalysisInput::from_telemetry(spans, samples, AnalyzerConfig::default().stream.horizon());
    let mut out = String::new();
    for timeline in input.timelines() {
        let _ = writeln!(
            out,
            "timeline client={} ns={} cluster={}",
            timeline.client_id,
            timeline.namespace.as_deref().unwrap_or("-"),
            timeline.cluster.as_deref().unwrap_or("-")
        );
        for call in &timeline.calls {
            let _ = writeln!(
                out,
                "  call {} {} floor={}",
                call.call_id.as_deref().unwrap_or("-"),
                call.op.as_ref().map_or("-", |op| op.as_str()),
                show(call.floor)
            );
            for attempt in &call.attempts {
                let reported = &attempt.reported;
                let reported_text = if reported.node_role.is_some()
                    || reported.node_applied.is_some()
                    || reported.namespace_committed.is_some()
                {
                    format!(
                        " reported(role={} applied={} committed={})",
                        reported.node_role.as_deref().unwrap_or("-"),
                        show(reported.node_applied),
                        show(reported.namespace_committed)
                    )
                } else {
                    String::new()
                };
                let _ = writeln!(
                    out,
                    "    #{} {} {:?} target={} router={} served_by={} carried={} router_carried={} served={} returned={}{reported_text}",
                    show(attempt.attempt),
                    attempt.outcome.as_ref().map_or("-", |outcome| outcome.as_str()),
                    attempt.join,
                    attempt.target_node.as_deref().unwrap_or("-"),
                    attempt.router_node.as_deref().unwrap_or("-"),
                    attempt.served_by.as_deref().unwrap_or("-"),
                    show(attempt.carried),
                    show(attempt.router_carried),
                    show(attempt.served),
                    show(attempt.returned),
                );
            }
        }
    }
    let anomalies = analyze(&input, &AnalyzerConfig::default());
    let _ = writeln!(out, "anomalies: {}", anomalies.len());
    for anomaly in anomalies {
        // The evidence without the bulky span and operation references (their count stays).
        let mut evidence = anomaly.evidence.value().clone();
        let n_spans = evidence["spans"].as_array().map_or(0, Vec::len);
        if let Some(object) = evidence.as_object_mut() {
            for bulky in ["spans", "read", "floor_set_by", "seen_from", "request"] {
                object.remove(bulky);
            }
        }
        let _ = writeln!(
            out,
            "{} {}{} client={} ns={} node={} t={}..{}ms\n  summary: {}\n  cause: {}\n  evidence: {} spans={}",
            anomaly.kind,
            anomaly.severity.as_str(),
            // A window is open or resolved at the end of the case; a per-read anomaly neither.
            if !anomaly.kind.is_window() {
                ""
            } else if anomaly.open {
                " open"
            } else {
                " resolved"
            },
            anomaly.client_id.as_deref().unwrap_or("-"),
            anomaly.namespace.as_deref().unwrap_or("-"),
            anomaly.node_id.as_deref().unwrap_or("-"),
            anomaly.start_unix_nano / 1_000_000 - BASE_MS,
            anomaly.end_unix_nano / 1_000_000 - BASE_MS,
            anomaly.summary,
            anomaly.cause,
            evidence,
            n_spans,
        );
    }
    out
}

fn show(value: Option<i64>) -> String {
    value.map_or_else(|| "-".to_string(), |value| value.to_string())
}
