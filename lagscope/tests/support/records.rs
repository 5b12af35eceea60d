//! Simulator runs as the records they export, and the two ways of analysing them: the
//! batch analysis and the streaming engine (directly, or through the `lscap` codec).

use lagscope_analyzer::stream::{Engine, Interner, SpanRec, codec};
use lagscope_analyzer::{AnalysisInput, AnalyzerConfig, analyze};
use lagscope_collector::otlp::{logs_from_request, samples_from_request, spans_from_request};
use lagscope_model::{Anomaly, AnomalyKind, PointValue, Sample, Span};
use lagscope_sim::{Request, SimConfig};

/// A scenario's telemetry in the order it was exported.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub enum Record {
    Span(Span),
    Sample(Sample),
}

impl Record {
    /// The span, if this record is one.
    pub fn span(&self) -> Option<&Span> {
        match self {
            Record::Span(span) => Some(span),
            Record::Sample(_) => None,
        }
    }
}

pub fn records_of(config: &SimConfig) -> Vec<Record> {
    records_delivered(config, |_| true)
}

/// A scenario's telemetry in the order it was exported, of the requests `delivered` keeps (by
/// their index in the run).
pub fn records_delivered(config: &SimConfig, delivered: impl Fn(usize) -> bool) -> Vec<Record> {
    records_and_logs_delivered(config, delivered).0
}

/// [`records_delivered`], and the log records of those requests, each with how many records
/// had been exported before it.
pub fn records_and_logs_delivered(
    config: &SimConfig,
    delivered: impl Fn(usize) -> bool,
) -> (Vec<Record>, Vec<(usize, lagscope_model::LogRecord)>) {
    let mut requests: Vec<Request> = Vec::new();
    lagscope_sim::run(config, &mut requests).expect("scenario runs");
    let (mut records, mut logs) = (Vec::new(), Vec::new());
    for (_, request) in requests.iter().enumerate().filter(|(index, _)| delivered(*index)) {
        match request {
            Request::Traces(request) => records.extend(spans_from_request(request).items.into_iter().map(Record::Span)),
            Request::Metrics(request) => {
                records.extend(samples_from_request(request).items.into_iter().map(Record::Sample))
            }
            Request::Logs(request) => {
                let at = records.len();
                logs.extend(logs_from_request(request).items.into_iter().map(|log| (at, log)));
            }
        }
    }
    (records, logs)
}

pub fn batch(records: &[Record], config: &AnalyzerConfig) -> Vec<Anomaly> {
    analyze(&batch_input(records, config), config)
}

/// What the batch analysis reads of `records`: their timelines and samples.
pub fn batch_input(records: &[Record], config: &AnalyzerConfig) -> AnalysisInput {
    let mut spans = Vec::new();
    let mut samples = Vec::new();
    for record in records {
        match record {
            Record::Span(span) => spans.push(span.clone()),
            Record::Sample(sample) => samples.push(sample.clone()),
        }
    }
    AnalysisInput::from_telemetry(&spans, samples, config.stream.horizon())
}

pub fn streamed(records: &[Record], config: &AnalyzerConfig) -> Vec<Anomaly> {
    streamed_kinds(records, config, |_| true)
}

pub fn streamed_kinds(
    records: &[Record],
    config: &AnalyzerConfig,
    wanted: impl Fn(AnomalyKind) -> bool,
) -> Vec<Anomaly> {
    let mut engine = Engine::new(config, wanted);
    for record in records {
        match record {
            Record::Span(span) => {
                let record = SpanRec::from_span(span, &mut engine.interner);
                engine.push_span(&record);
            }
            Record::Sample(sample) => engine.push_model_sample(sample),
        }
    }
    engine.finish().0
}

pub fn streamed_through_codec(records: &[Record], config: &AnalyzerConfig) -> Vec<Anomaly> {
    let mut writer_interner = Interner::default();
    let mut encoder = codec::Encoder::default();
    let mut blocks = Vec::new();
    for record in records {
        match record {
            Record::Span(span) => {
                let record = SpanRec::from_span(span, &mut writer_interner);
                encoder.span(&record, &writer_interner);
            }
            Record::Sample(sample) => {
                let PointValue::Number(value) = sample.value else { continue };
                let labels: Vec<(&str, &str)> =
                    sample.series.labels.iter().map(|(key, value)| (key.as_str(), value.as_str())).collect();
                let (name, kind, time) = (&sample.series.name, sample.meta.kind, sample.time_unix_nano);
                encoder.sample(name, kind, &labels, time, value, &mut writer_interner);
            }
        }
        blocks.extend(encoder.take_block(false));
    }
    blocks.extend(encoder.take_block(true));
    let mut engine = Engine::new(config, |_| true);
    let mut decoder = codec::Decoder::new();
    let mut series = Vec::new();
    for block in &blocks {
        let mut items = Vec::new();
        decoder.decode_block(&block[4..], &mut engine.interner, |item| items.push(item)).expect("block decodes");
        for item in items {
            match item {
                codec::Item::Span(span) => engine.push_span(&span),
                codec::Item::LogEvent(event) => engine.push_log_event(&event),
                codec::Item::Series(definition) => series.push(engine.define_series(&definition)),
                codec::Item::Sample(mut sample) => {
                    sample.series = series[sample.series as usize];
                    engine.push_sample(sample);
                }
            }
        }
    }
    engine.finish().0
}

/// The anomalies live passes find over `records` (a pass every `per_pass` of them, the latest
/// version of each by fingerprint), holding the spans between passes as the live analyzer's
/// caches do, with every log line exported so far (the live analyzer holds a cluster's lines
/// for its whole window, not settled with the spans); with `settle_after`, each pass then
/// lets go of the calls settled that long before the newest span (and the detectors' reach
/// before that; anomalies still growing hold their namespace), as `live.settle_seconds` does,
/// and a pass with a late span ([`lagscope_analyzer::HeldTimelines::is_late`]) holds every
/// span so far anew, as the live analyzer reads the late span's client anew from its store.
/// Returns them and the spans let go.
pub fn live_passes(
    records: &[Record],
    logs: &[(usize, lagscope_model::LogRecord)],
    config: &AnalyzerConfig,
    per_pass: usize,
    settle_after: Option<i64>,
) -> (std::collections::BTreeMap<String, Anomaly>, usize) {
    let mut held = lagscope_analyzer::HeldTimelines::new(config.stream.horizon());
    let mut samples = Vec::new();
    let (mut found, mut let_go) = (std::collections::BTreeMap::new(), 0);
    let mut lines: Vec<std::sync::Arc<lagscope_analyzer::log_events::LogEvent>> = Vec::new();
    let mut next_log = 0;
    let passes = records.len().div_ceil(per_pass);
    for (index, pass) in records.chunks(per_pass).enumerate() {
        // (The last pass takes the lines exported after the last record.)
        let exported = if index + 1 == passes { usize::MAX } else { index * per_pass + pass.len() };
        while let Some((_, log)) = logs.get(next_log).filter(|(at, _)| *at <= exported) {
            lines.extend(lagscope_analyzer::log_events::classify(log).map(std::sync::Arc::new));
            next_log += 1;
        }
        lines.sort_by_key(|line| line.time_unix_nano);
        let mut late = false;
        for record in pass {
            match record {
                Record::Span(span) => {
                    late |= held.is_late(span);
                    held.insert(span.clone());
                }
                Record::Sample(sample) => samples.push(sample.clone()),
            }
        }
        if late {
            // What a late span belongs to was let go: read anew (here, everything so far), as
            // the live analyzer reads its client from the store.
            held = lagscope_analyzer::HeldTimelines::new(config.stream.horizon());
            for span in records[..index * per_pass + pass.len()].iter().filter_map(Record::span) {
                held.insert(span.clone());
            }
        }
        held.refresh();
        // (As the live analyzer builds its input: what the metrics said told again where it may
        // have changed, and where each timeline was cut.)
        let mut input = AnalysisInput::from_held(&mut held, samples.clone());
        input.log_events.clone_from(&lines);
        let anomalies: Vec<Anomaly> = lagscope_analyzer::analyze_kinds(&input, config, |_| true)
            .into_iter()
            .filter(|anomaly| !held.is_settled(anomaly))
            .collect();
        held.give_back(input.into_parts().0);
        if let Some(settle_after) = settle_after {
            let newest = held.spans().map(|span| span.start_unix_nano).max().unwrap_or_default();
            let before = newest - settle_after;
            let_go += held.settle(before, lagscope_analyzer::growing(&anomalies, before, config)).len();
        }
        found.extend(anomalies.into_iter().map(|anomaly| (anomaly.fingerprint.clone(), anomaly)));
    }
    (found, let_go)
}
