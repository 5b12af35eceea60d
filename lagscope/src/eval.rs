//! `lagscope eval`: runs scenarios, feeds their telemetry to the analyzer through the same
//! path as `lagscope analyze` (OTLP JSON lines → request decoder → streaming engine), as the
//! simulator makes it, and scores the anomalies against each run's ground truth.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use lagscope_analyzer::stream::Engine;
use lagscope_analyzer::{AnalyzerConfig, detectors};
use lagscope_collector::capture::stream_requests;
use lagscope_model::Anomaly;
use lagscope_sim::score::{Found, KindScore, score};
use lagscope_sim::{Nanos, Request, SimConfig, Sink, Truth};
use lagscope_store::{AnomalyFilter, TimeRange};
use serde::Serialize;

use crate::analyze::{StoreSource, analyze_paths_emitting, analyze_store_emitting, push_decoded};
use crate::progress::Progress;
use crate::sim_cmd::json_line;

/// One scenario's evaluation.
#[derive(Debug, Serialize)]
pub struct ScenarioScore {
    pub scenario: String,
    /// When the run started: the table gives the missed and false anomalies' times from it.
    pub start_unix_nano: i64,
    pub spans: usize,
    pub anomalies_expected: usize,
    pub anomalies_found: usize,
    pub kinds: Vec<KindScore>,
    pub figures: serde_json::Map<String, serde_json::Value>,
    /// What the analyzer found, in the order it reported them.
    #[serde(skip)]
    pub anomalies: Vec<Anomaly>,
}

use crate::delivery::Delivered;
pub use crate::delivery::Delivery;

impl ScenarioScore {
    /// Nothing missed and nothing false: what every run delivered whole must give.
    pub fn clean(&self) -> bool {
        self.kinds.iter().all(|row| row.missed == 0 && row.false_positives == 0)
    }

    /// Nothing reported that the run did not have: what a run that lost telemetry must give
    /// (it may miss what the lost requests were the evidence of).
    pub fn nothing_false(&self) -> bool {
        self.kinds.iter().all(|row| row.false_positives == 0)
    }
}

/// Runs one scenario through the analyzer and scores it.
pub fn evaluate(config: &SimConfig, analyzer: &AnalyzerConfig, delivery: Delivery) -> anyhow::Result<ScenarioScore> {
    let sink = EngineSink {
        source_name: format!("{}.jsonl", config.scenario),
        engine: Engine::new(analyzer, |_| true),
        error: None,
    };
    let mut delivered = Delivered::new(sink, delivery, config.seed);
    let truth: Truth = lagscope_sim::run(config, &mut delivered)?;
    let sink = delivered.finish();
    if let Some(error) = sink.error {
        bail!("{error}");
    }
    let (anomalies, stats) = sink.engine.finish();
    Ok(ScenarioScore::of(truth, anomalies, stats.spans as usize))
}

impl ScenarioScore {
    /// What was found (`anomalies`, from `spans` spans) scored against the run's `truth`.
    pub fn of(truth: Truth, anomalies: Vec<Anomaly>, spans: usize) -> Self {
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
        ScenarioScore {
            scenario: truth.scenario.clone(),
            start_unix_nano: truth.start_unix_nano,
            spans,
            anomalies_expected: truth.anomalies.len(),
            anomalies_found: found.len(),
            kinds: score(&truth, &found),
            figures: truth.figures.into_iter().collect(),
            anomalies,
        }
    }
}

/// Takes the simulator's export requests through the path `lagscope analyze` reads captures
/// by (OTLP JSON lines, decoded one request at a time) into the streaming engine, as they
/// are delivered: nothing of the run is held but the engine's state.
struct EngineSink<'c> {
    source_name: String,
    engine: Engine<'c>,
    error: Option<String>,
}

impl Sink for EngineSink<'_> {
    fn export(&mut self, _at: Nanos, request: Request) {
        self.deliver(&request);
    }
}

impl EngineSink<'_> {
    fn deliver(&mut self, request: &Request) {
        if self.error.is_some() {
            return;
        }
        let line = json_line(request);
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
            let note = if !detected.contains(row.kind.as_str()) {
                "no detector yet".to_string()
            } else if row.tolerated > 0 {
                format!("{} borderline found (right either way)", row.tolerated)
            } else {
                String::new()
            };
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
            for missed in &row.missed_examples {
                let scope = [&missed.client_id, &missed.namespace, &missed.node_id];
                let line = example("missed:", scope, (missed.start_unix_nano, missed.end_unix_nano), scenario);
                writeln!(out, "{line}: {}", missed.detail)?;
            }
            for found in &row.false_examples {
                let scope = [&found.client_id, &found.namespace, &found.node_id];
                writeln!(out, "{}", example("false: ", scope, (found.start_unix_nano, found.end_unix_nano), scenario))?;
            }
        }
    }
    Ok(())
}

/// A missed or false anomaly under its row: its client, namespace and node, and its window
/// in seconds from the start of the run.
fn example(label: &str, scope: [&Option<String>; 3], (start, end): (i64, i64), scenario: &ScenarioScore) -> String {
    let [client, namespace, node] = scope.map(|name| name.as_deref().unwrap_or("-"));
    let at = |nanos: i64| (nanos - scenario.start_unix_nano) as f64 / 1e9;
    format!("    {label} client={client} ns={namespace} node={node} {:.3}..{:.3} s", at(start), at(end))
}

fn errors(value: Option<(f64, f64)>) -> String {
    value.map_or_else(|| "-".to_string(), |(median, max)| format!("{median:.0}/{max:.0} ms"))
}

/// Runs the named scenarios (or all), prints the table or JSON, and fails if anything was
/// missed or falsely reported (with requests lost, only if anything was falsely reported).
pub fn run(runs: &[SimConfig], delivery: Delivery, json: bool, analyzer: &AnalyzerConfig) -> anyhow::Result<()> {
    delivery.validate(analyzer)?;
    let mut scores = Vec::new();
    for config in runs {
        eprintln!("eval: running {}", config.scenario);
        scores.push(evaluate(config, analyzer, delivery)?);
    }
    report(&scores, delivery.lose, json)
}

/// Where a recorded run's telemetry is: what `sim --out` wrote, or the store that `sim
/// --otlp-http`/`--otlp-grpc` sent it to through `serve`.
#[derive(Debug, Clone)]
pub enum Recorded {
    Captures(Vec<PathBuf>),
    /// A store; a bound of its range left open (not given) is the run's.
    Store(StoreSource),
    /// The anomalies `serve`'s live analyzer stored in a store (those whose windows meet the
    /// range; a bound left open is the run's), scored as they are: the live mode held to the
    /// run's truth.
    Stored(StoreSource),
}

/// Scores a recorded run against the ground truth `sim --truth` wrote of it, through the same
/// analysis as `lagscope analyze`; prints and fails as [`run`] does. A store is read over the
/// run's time range unless told otherwise: anything else it holds from that time (other
/// traffic) is scored as found without being expected.
pub fn run_recorded(
    truth_path: &Path,
    recorded: Recorded,
    json: bool,
    analyzer: &AnalyzerConfig,
    progress: Progress,
) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(truth_path).with_context(|| format!("cannot read {}", truth_path.display()))?;
    let truth: Truth = serde_json::from_str(&text).map_err(|error| {
        anyhow::anyhow!(
            "{}:{}: not a truth file as `lagscope sim --truth` writes: {error}",
            truth_path.display(),
            error.line()
        )
    })?;
    eprintln!("eval: {} against {}", truth.scenario, truth_path.display());
    let (anomalies, spans) = match recorded {
        Recorded::Captures(paths) => {
            let analyzed = analyze_paths_emitting(
                &paths,
                analyzer,
                &[],
                None,
                crate::analyze::default_decode_threads(),
                progress,
            )?;
            (analyzed.anomalies, analyzed.spans)
        }
        Recorded::Store(mut source) => {
            // What started within the run, up to its end.
            source.range = run_range(&truth, source.range);
            let analyzed = analyze_store_emitting(&source, analyzer, &[], None, progress)?;
            (analyzed.anomalies, analyzed.spans)
        }
        Recorded::Stored(mut source) => {
            source.range = run_range(&truth, source.range);
            stored_anomalies(&source)?
        }
    };
    report(&[ScenarioScore::of(truth, anomalies, spans)], 0.0, json)
}

/// `range` with a bound left open (not given) made the run's: from its start to just past its
/// end.
fn run_range(truth: &Truth, mut range: TimeRange) -> TimeRange {
    if range.from == TimeRange::ALL.from {
        range.from = truth.start_unix_nano;
    }
    if range.to == TimeRange::ALL.to {
        range.to = truth.end_unix_nano.saturating_add(1);
    }
    range
}

/// The anomalies a store holds whose windows meet `source.range` (newest first, a page at a
/// time, without their evidence), and how many spans the store holds.
fn stored_anomalies(source: &StoreSource) -> anyhow::Result<(Vec<Anomaly>, usize)> {
    anyhow::ensure!(source.range.from < source.range.to, "--from must be before --to");
    crate::stored::runtime()?.block_on(async {
        let (name, store) = source.open().await?;
        let mut filter = AnomalyFilter {
            since: Some(source.range.from),
            until: Some(source.range.to),
            limit: crate::stored::PAGE,
            skip_evidence: true,
            ..AnomalyFilter::default()
        };
        let mut anomalies = Vec::new();
        loop {
            let page =
                store.anomalies(&filter).await.with_context(|| format!("cannot read the anomalies of {name}"))?;
            let Some(last) = page.last() else { break };
            filter.before_id = Some(last.id);
            anomalies.extend(page.into_iter().map(|stored| stored.anomaly));
        }
        let spans = store.stats().await.with_context(|| format!("cannot read {name}"))?.spans;
        eprintln!("eval: {} anomalies stored in {name}", anomalies.len());
        anyhow::Ok((anomalies, spans as usize))
    })
}

/// Prints the scores as a table or JSON; fails if anything was missed or falsely reported
/// (with a fraction `lose` of the requests lost, only if anything was falsely reported).
fn report(scores: &[ScenarioScore], lose: f64, json: bool) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut stdout, scores)?;
        writeln!(stdout)?;
    } else {
        write_table(&mut stdout, scores)?;
    }
    // With requests lost, what they were the evidence of may be missed; nothing may be false.
    let (passes, failure): (fn(&ScenarioScore) -> bool, &str) = if lose > 0.0 {
        let missed: usize = scores.iter().flat_map(|score| &score.kinds).map(|row| row.missed).sum();
        let expected: usize = scores.iter().flat_map(|score| &score.kinds).map(|row| row.expected).sum();
        eprintln!(
            "eval: {:.0}% of the export requests lost: {missed} of {expected} expected anomalies missed \
             (their evidence may be lost); anomalies reported that the runs did not have fail the run",
            lose * 100.0
        );
        (ScenarioScore::nothing_false, "false")
    } else {
        (ScenarioScore::clean, "missed or false")
    };
    let failing: Vec<&str> =
        scores.iter().filter(|score| !passes(score)).map(|score| score.scenario.as_str()).collect();
    if !failing.is_empty() {
        bail!("{} of {} scenarios have {failure} anomalies: {}", failing.len(), scores.len(), failing.join(", "));
    }
    Ok(())
}
