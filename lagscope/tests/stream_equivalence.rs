//! The streaming engine against the batch analyzer: on every simulator scenario, the kinds
//! the engine streams come out identical (every field of every anomaly), fed span by span
//! in capture order, directly and through the `lscap` codec.

use lagscope::sim_cmd::json_line;
use lagscope_analyzer::stream::{Engine, Interner, SpanRec, codec};
use lagscope_analyzer::{AnalysisInput, AnalyzerConfig, analyze_kinds};
use lagscope_collector::capture::Capture;
use lagscope_model::Anomaly;
use lagscope_sim::{Request, SimConfig, scenarios};

fn capture_of(config: &SimConfig) -> Capture {
    let mut requests: Vec<Request> = Vec::new();
    lagscope_sim::run(config, &mut requests).expect("scenario runs");
    let lines: String = requests.iter().map(|request| json_line(request) + "\n").collect();
    let mut capture = Capture::default();
    capture.read_str(&config.scenario, &lines).expect("capture reads");
    capture
}

fn streamed(capture: &Capture, config: &AnalyzerConfig) -> Vec<Anomaly> {
    let mut engine = Engine::new(config, |_| true);
    for span in &capture.spans {
        let record = SpanRec::from_span(span, &mut engine.interner);
        engine.push_span(record);
    }
    engine.finish().0
}

fn streamed_through_codec(capture: &Capture, config: &AnalyzerConfig) -> Vec<Anomaly> {
    let mut writer_interner = Interner::default();
    let mut encoder = codec::Encoder::default();
    let mut blocks = Vec::new();
    for span in &capture.spans {
        let record = SpanRec::from_span(span, &mut writer_interner);
        encoder.span(&record, &writer_interner);
        blocks.extend(encoder.take_block(false));
    }
    blocks.extend(encoder.take_block(true));
    let mut engine = Engine::new(config, |_| true);
    let mut decoder = codec::Decoder::new();
    for block in &blocks {
        let mut spans = Vec::new();
        decoder
            .decode_block(&block[4..], &mut engine.interner, |item| {
                if let codec::Item::Span(span) = item {
                    spans.push(span);
                }
            })
            .expect("block decodes");
        for span in spans {
            engine.push_span(span);
        }
    }
    engine.finish().0
}

fn compare(name: &str, expected: &[Anomaly], actual: &[Anomaly], failures: &mut Vec<String>) {
    if expected == actual {
        return;
    }
    let first_difference = expected.iter().zip(actual).position(|(left, right)| left != right);
    failures.push(format!(
        "{name}: batch {} anomalies, stream {}; first difference at {first_difference:?}:\nbatch  {}\nstream {}",
        expected.len(),
        actual.len(),
        first_difference
            .and_then(|index| expected.get(index))
            .map_or("-".to_string(), |anomaly| format!("{anomaly:?}")),
        first_difference.and_then(|index| actual.get(index)).map_or("-".to_string(), |anomaly| format!("{anomaly:?}")),
    ));
}

#[test]
fn streamed_kinds_equal_the_batch_analysis_on_every_scenario() {
    let config = AnalyzerConfig::default();
    let mut failures = Vec::new();
    let mut total = 0;
    for info in scenarios().into_iter().filter(|info| info.name != "mixed") {
        let capture = capture_of(&SimConfig::new(info.name));
        let input = AnalysisInput::from_telemetry(&capture.spans, capture.samples.clone());
        let expected = analyze_kinds(&input, &config, |kind| lagscope_analyzer::stream::STREAMED_KINDS.contains(&kind));
        total += expected.len();
        compare(info.name, &expected, &streamed(&capture, &config), &mut failures);
        compare(
            &format!("{} (lscap)", info.name),
            &expected,
            &streamed_through_codec(&capture, &config),
            &mut failures,
        );
    }
    assert!(total > 100, "the scenarios raise streamed kinds: {total}");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
