//! `lagscope eval`: runs scenarios, feeds their telemetry to the analyzer through the same
//! path as `lagscope analyze` (OTLP JSON lines → request decoder → streaming engine), as the
//! simulator makes it, and scores the anomalies against each run's ground truth.

use std::collections::BTreeSet;
use std::io::Write;

use anyhow::bail;
use lagscope_analyzer::stream::Engine;
use lagscope_analyzer::{AnalyzerConfig, detectors};
use lagscope_collector::capture::stream_requests;
use lagscope_sim::score::{Found, KindScore, score};
use lagscope_sim::{Nanos, Request, SimConfig, Sink, Truth};
use serde::Serialize;

use crate::analyze::push_decoded;
use crate::sim_cmd::json_line;

/// One scenario's evaluation.
#[derive(Debug, Serialize)]
pub struct ScenarioScore {
    pub scenario: String,
    pub spans: usize,
    pub anomalies_expected: usize,
    pub anomalies_found: usize,
    pub kinds: Vec<KindScore>,
    pub figures: serde_json::Map<String, serde_json::Value>,
}

impl ScenarioScore {
    pub fn clean(&self) -> bool {
        self.kinds.iter().all(|row| row.missed == 0 && row.false_positives == 0)
    }
}

/// Runs one scenario through the analyzer and scores it.
pub fn evaluate(config: &SimConfig, analyzer: &AnalyzerConfig) -> anyhow::Result<ScenarioScore> {
    let mut sink = EngineSink {
        source_name: format!("{}.jsonl", config.scenario),
        engine: Engine::new(analyzer, |_| true),
        error: None,
    };
    let truth: Truth = lagscope_sim::run(config, &mut sink)?;
    if let Some(error) = sink.error {
        bail!("{error}");
    }
    let (anomalies, stats) = sink.engine.finish();
    let found: Vec<Found> = anomalies
        .iter()
        .map(|anomaly| Found {
            kind: anomaly.kind.as_str().to_string(),
            cluster: anomaly.cluster.clone(),
            namespace: anomaly.namespace.clone(),
            client_id: anomaly.client_id.clone(),
            node_id: anomaly.node_id.clone(),
            start_unix_nano: anomaly.start_unix_nano,
            end_unix_nano: anomaly.end_unix_nano,
        })
        .collect();
    Ok(ScenarioScore {
        scenario: config.scenario.clone(),
        spans: stats.spans as usize,
        anomalies_expected: truth.anomalies.len(),
        anomalies_found: found.len(),
        kinds: score(&truth, &found),
        figures: truth.figures.into_iter().collect(),
    })
}

/// Takes the simulator's export requests through the path `lagscope analyze` reads captures
/// by (OTLP JSON lines, decoded one request at a time) into the streaming engine, as they
/// are made: nothing of the run is held but the engine's state.
struct EngineSink<'c> {
    source_name: String,
    engine: Engine<'c>,
    error: Option<String>,
}

impl Sink for EngineSink<'_> {
    fn export(&mut self, _at: Nanos, request: Request) {
        if self.error.is_some() {
            return;
        }
        let line = json_line(&request);
        let engine = &mut self.engine;
        let read = stream_requests(&self.source_name, line.as_bytes(), |decoded| {
            push_decoded(engine, &decoded);
            Ok(())
        });
        if let Err(error) = read {
            self.error = Some(error.to_string());
        }
    }
}

/// The kinds the analyzer has a detector for today.
pub fn detected_kinds() -> BTreeSet<&'static str> {
    detectors::REGISTRY.iter().map(|detector| detector.kind.as_str()).collect()
}

pub fn write_table(out: &mut impl Write, scores: &[ScenarioScore]) -> anyhow::Result<()> {
    let detected = detected_kinds();
    writeln!(
        out,
        "{:<36} {:<26} {:>8} {:>6} {:>6} {:>6}  {:>17}  {:>17}  note",
        "SCENARIO", "KIND", "EXPECTED", "FOUND", "MISSED", "FALSE", "START ERR p50/max", "END ERR p50/max"
    )?;
    for scenario in scores {
        if scenario.kinds.is_empty() {
            writeln!(
                out,
                "{:<36} {:<26} {:>8} {:>6} {:>6} {:>6}  {:>17}  {:>17}  no anomaly expected, none found",
                scenario.scenario, "-", 0, 0, 0, 0, "-", "-"
            )?;
            continue;
        }
        for row in &scenario.kinds {
            let note = if !detected.contains(row.kind.as_str()) { "no detector yet" } else { "" };
            writeln!(
                out,
                "{:<36} {:<26} {:>8} {:>6} {:>6} {:>6}  {:>17}  {:>17}  {note}",
                scenario.scenario,
                row.kind,
                row.expected,
                row.found,
                row.missed,
                row.false_positives,
                errors(row.start_error_ms),
                errors(row.end_error_ms),
            )?;
        }
    }
    Ok(())
}

fn errors(value: Option<(f64, f64)>) -> String {
    value.map_or_else(|| "-".to_string(), |(median, max)| format!("{median:.0}/{max:.0} ms"))
}

/// Runs the named scenarios (or all), prints the table or JSON, and fails if anything was
/// missed or falsely reported.
pub fn run(runs: &[SimConfig], json: bool, analyzer: &AnalyzerConfig) -> anyhow::Result<()> {
    let mut scores = Vec::new();
    for config in runs {
        eprintln!("eval: running {}", config.scenario);
        scores.push(evaluate(config, analyzer)?);
    }
    let mut stdout = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut stdout, &scores)?;
        writeln!(stdout)?;
    } else {
        write_table(&mut stdout, &scores)?;
    }
    let failing: Vec<&str> =
        scores.iter().filter(|score| !score.clean()).map(|score| score.scenario.as_str()).collect();
    if !failing.is_empty() {
        bail!("{} of {} scenarios have missed or false anomalies: {}", failing.len(), scores.len(), failing.join(", "));
    }
    Ok(())
}
