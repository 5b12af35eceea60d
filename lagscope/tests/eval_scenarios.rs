//! The analyzer against the simulator's ground truth: every scenario, every kind, nothing
//! missed and nothing false. (`mixed`, every scenario at once, runs in `lagscope eval --scenario
//! all`; here each scenario runs on its own to keep the suite quick.)

use std::process::Command;

use lagscope::eval::{Delivery, evaluate};
use lagscope_analyzer::AnalyzerConfig;
use lagscope_sim::{SimConfig, scenarios};

#[test]
fn every_scenario_is_found_exactly_as_its_truth_says() {
    let mut failures = Vec::new();
    let mut rows = 0;
    for info in scenarios().into_iter().filter(|info| info.name != "mixed") {
        let score = evaluate(&SimConfig::new(info.name), &AnalyzerConfig::default(), Delivery::default())
            .expect("scenario runs");
        for row in &score.kinds {
            rows += 1;
            if row.missed > 0 || row.false_positives > 0 {
                failures.push(format!(
                    "{}: {} expected {} found {} missed {} false {}",
                    info.name, row.kind, row.expected, row.found, row.missed, row.false_positives
                ));
            }
        }
    }
    assert!(rows >= 17, "every bug scenario contributes its kinds: {rows} rows");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_second_seed_is_found_exactly_too() {
    // Not tuned to seed 1: the same mechanisms with other random draws.
    for name in ["hdfs-publish-race", "hdfs-pool-not-advanced", "hdfs-observer-lag-storm", "es-node-level-pressure"] {
        let mut config = SimConfig::new(name);
        config.seed = 42;
        let score = evaluate(&config, &AnalyzerConfig::default(), Delivery::default()).expect("scenario runs");
        assert!(score.clean(), "{name} seed 42: {:?}", score.kinds);
    }
}

#[test]
fn a_rejection_counted_just_after_the_release_is_not_unfair() {
    // Found by a sweep of seeds 100-160 (`lagscope eval --seed N`): with seed 103, a rejection
    // of the hot shard counted by the sample just after its pressure dropped was raised as
    // unfair, though it happened while the shard was at its own limit.
    clean_run("es-shard-level-pressure", 103, None);
}

/// A run a sweep found faults in (seed, and clients and operations/s if not the scenario's),
/// scored: it must be found exactly.
fn clean_run(name: &str, seed: u64, load: Option<(usize, f64)>) -> lagscope::eval::ScenarioScore {
    let mut config = SimConfig::new(name);
    config.seed = seed;
    config.clients = load.map(|(clients, _)| clients);
    config.rate = load.map(|(_, rate)| rate);
    let score = evaluate(&config, &AnalyzerConfig::default(), Delivery::default()).expect("scenario runs");
    assert!(score.clean(), "{name} seed {seed} load {load:?}: {:?}", score.kinds);
    score
}

/// `lagscope eval` with the scenario's run options, as JSON.
fn eval_cli(args: &[&str]) -> (bool, serde_json::Value, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_lagscope"))
        .args(["eval", "--format", "json"])
        .args(args)
        .output()
        .expect("lagscope runs");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let parsed = serde_json::from_slice(&output.stdout).unwrap_or(serde_json::Value::Null);
    (output.status.success(), parsed, stderr)
}

#[test]
fn eval_holds_the_detectors_to_runs_at_other_loads() {
    // Fewer clients, another rate and length than the scenario's: the truth changes with them,
    // and what is found must still match it.
    let run = ["--scenario", "hdfs-publish-race", "--seed", "5", "--clients", "7", "--duration", "90s"];
    let (ok, slow, stderr) = eval_cli(&[&run[..], &["--rate", "150"]].concat());
    assert!(ok, "{stderr}");
    let (ok, fast, stderr) = eval_cli(&[&run[..], &["--rate", "300"]].concat());
    assert!(ok, "{stderr}");
    for score in [&slow[0], &fast[0]] {
        assert_eq!(score["scenario"], "hdfs-publish-race");
        let rows = score["kinds"].as_array().expect("kinds");
        assert!(rows.iter().any(|row| row["kind"] == "stale_read" && row["expected"].as_u64() > Some(0)), "{score}");
        for row in rows {
            assert_eq!((row["missed"].as_u64(), row["false_positives"].as_u64()), (Some(0), Some(0)), "{row}");
        }
    }
    let spans = |score: &serde_json::Value| score["spans"].as_u64().expect("spans");
    // Seven clients wait on their calls: twice the rate asks for more than they can send, but
    // they send more.
    assert!(
        spans(&fast[0]) > spans(&slow[0]),
        "--rate 300 against 150: {} and {} spans",
        spans(&fast[0]),
        spans(&slow[0])
    );

    let (ok, _, stderr) = eval_cli(&["--scenario", "hdfs-publish-race", "--duration", "ninety"]);
    assert!(!ok && stderr.contains("invalid duration \"ninety\""), "{stderr}");
}

/// Scenarios with spans, metrics and log lines, and a bug of each system, to deliver otherwise
/// than in order.
const DELIVERY_SCENARIOS: [&str; 9] = [
    "hdfs-publish-race",
    "hdfs-stale-router-merge",
    "hdfs-no-namenodes",
    "hdfs-observer-lag-storm",
    "ozone-follower-read-disabled",
    "ozone-pinned-retry",
    "es-node-level-pressure",
    "es-shard-level-pressure",
    "pulsar-tcp-probe-half-dead",
];

/// Runs each scenario delivered in order and as `delivery` says: both clean, the same
/// anomalies in the same order, whole. Returns the spans each run took (in order, `delivery`).
fn same_as_in_order(delivery: Delivery, names: &[&str]) -> Vec<(usize, usize)> {
    let analyzer = AnalyzerConfig::default();
    delivery.validate(&analyzer).expect("a delivery the lateness absorbs");
    let mut spans = Vec::new();
    for name in names {
        let config = SimConfig::new(name);
        let in_order = evaluate(&config, &analyzer, Delivery::default()).expect("scenario runs");
        let other = evaluate(&config, &analyzer, delivery).expect("scenario runs");
        assert!(other.clean(), "{name} delivered as {delivery:?}: {:?}", other.kinds);
        assert!(!in_order.anomalies.is_empty(), "{name}: a bug scenario finds something");
        assert_eq!(other.anomalies, in_order.anomalies, "{name}: {delivery:?} changed what was found");
        spans.push((in_order.spans, other.spans));
    }
    spans
}

#[test]
fn batches_arriving_out_of_order_within_the_lateness_change_nothing() {
    // Every export request held back up to 5 s, as through a collector that many batch
    // exporters feed on their own schedules.
    let delayed = Delivery { max_delay: 5_000_000_000, ..Delivery::default() };
    same_as_in_order(delayed, &DELIVERY_SCENARIOS);
    let too_late = Delivery { max_delay: 9_500_000_000, ..Delivery::default() };
    let refused =
        too_late.validate(&AnalyzerConfig::default()).expect_err("past the lateness less the export interval");
    assert!(refused.to_string().contains("--export-delay 9.500 s"), "{refused}");
}

#[test]
fn requests_delivered_twice_change_nothing() {
    // A third of the export requests come again (an exporter retrying a request whose
    // acknowledgement was lost), the copies up to 3 s later and every request up to 3 s late:
    // spans, samples and log lines sent twice must be taken once. Before they were, copied
    // attempts made false pinned retries and carried-state regressions, and copied router log
    // lines counted twice in a window's attempts.
    let twice = Delivery { max_delay: 3_000_000_000, redeliver: 0.3, ..Delivery::default() };
    for (name, (once, copied)) in DELIVERY_SCENARIOS.iter().zip(same_as_in_order(twice, &DELIVERY_SCENARIOS)) {
        assert!(copied > once, "{name}: some spans came twice ({copied} against {once})");
    }
    let refused = Delivery { redeliver: 1.5, ..Delivery::default() }
        .validate(&AnalyzerConfig::default())
        .expect_err("not a fraction");
    assert!(refused.to_string().contains("--redeliver 1.5"), "{refused}");
}

#[test]
fn telemetry_lost_on_the_way_makes_nothing_false() {
    // A quarter of the export requests never arrive (an exporter that gave up after its
    // retries, a collector shedding load), the rest up to 3 s late and a tenth of them twice:
    // whole spans, samples and log lines are missing from every scenario. What their evidence
    // was lost may be missed; nothing may be reported that the run did not have, and the
    // scenarios without a bug must stay quiet.
    let lossy = Delivery { max_delay: 3_000_000_000, redeliver: 0.1, lose: 0.25, ..Delivery::default() };
    lossy.validate(&AnalyzerConfig::default()).expect("a delivery the lateness absorbs");
    let (mut found, mut missed) = (0, 0);
    for info in scenarios().into_iter().filter(|info| info.name != "mixed") {
        let score = evaluate(&SimConfig::new(info.name), &AnalyzerConfig::default(), lossy).expect("scenario runs");
        assert!(score.nothing_false(), "{} with requests lost: {:?}", info.name, score.kinds);
        found += score.anomalies.len();
        missed += score.kinds.iter().map(|row| row.missed).sum::<usize>();
    }
    assert!(
        found > 1_000 && missed > 100,
        "the bugs are still found, and the loss showed: {found} found, {missed} missed"
    );
    for refused in [1.0, -0.1] {
        let error = Delivery { lose: refused, ..Delivery::default() }
            .validate(&AnalyzerConfig::default())
            .expect_err("not a fraction below 1");
        assert!(error.to_string().contains(&format!("--lose {refused}")), "{error}");
    }
    // The command says what was missed, and succeeds with nothing false.
    let (ok, scores, stderr) = eval_cli(&["--scenario", "ozone-pinned-retry", "--lose", "0.5", "--seed", "3"]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("50% of the export requests lost: "), "{stderr}");
    assert!(scores[0]["kinds"].as_array().is_some_and(|rows| !rows.is_empty()), "{scores}");
    // Found by a sweep: seed 27 loses the server span of one of app-rpc-1's seven attempts
    // pinned to om2; the run was split in two, one of them reported as a pinned retry the run
    // did not have.
    for seed in ["27", "40"] {
        let (ok, _, stderr) = eval_cli(&["--scenario", "ozone-pinned-retry", "--lose", "0.1", "--seed", seed]);
        assert!(ok, "seed {seed}: {stderr}");
    }
}

#[test]
fn hosts_whose_clocks_disagree_are_still_found_exactly() {
    // Every process's clock off by up to 250 ms either way: the per-call kinds come out
    // hundreds of milliseconds from the truth's times, and must still all be matched.
    let skewed = Delivery { max_skew: 250_000_000, ..Delivery::default() };
    for name in ["hdfs-publish-race", "hdfs-pool-not-advanced", "hdfs-no-namenodes", "ozone-pinned-retry"] {
        let score = evaluate(&SimConfig::new(name), &AnalyzerConfig::default(), skewed).expect("scenario runs");
        assert!(score.clean(), "{name} with clocks 250 ms apart: {:?}", score.kinds);
    }
    // Clocks apart take from the lateness as a delay does: a span from the slowest clock may
    // come twice the skew behind the fastest one's data (a sweep found `mixed` seed 908 with
    // 800 ms and 9 s missing three stale reads whose hops came too late to join).
    let analyzer = AnalyzerConfig::default();
    let skewed_and_late = Delivery { max_skew: 800_000_000, max_delay: 9_000_000_000, ..Delivery::default() };
    let refused = skewed_and_late.validate(&analyzer).expect_err("9 s + 1 s + 2 x 0.8 s is past the 10 s lateness");
    assert!(refused.to_string().contains("--export-delay 9.000 s with --clock-skew 0.800 s"), "{refused}");
    assert!(refused.to_string().contains("11.600 s behind"), "{refused}");
    let within = Delivery { max_skew: 800_000_000, max_delay: 7_400_000_000, ..Delivery::default() };
    within.validate(&analyzer).expect("7.4 s + 1 s + 2 x 0.8 s is the lateness");
}

#[test]
fn a_follower_stalled_at_a_low_commit_rate_is_one_anomaly() {
    // Found by running ozone-apply-lag with 3 clients at 60 operations/s: the stalled
    // follower's lag stayed under the 1 000 states that count as caught up, and its stall was
    // reported four times, each from the same start.
    let score = clean_run("ozone-apply-lag", 21, Some((3, 60.0)));
    assert_eq!(score.anomalies.len(), 1, "{:#?}", score.anomalies);
}

#[test]
fn one_client_s_requeue_storm_is_found_through_its_dips() {
    // Found by running hdfs-observer-lag-storm with one client at 10 operations/s: the stalled
    // observer requeued ~200 calls/s for 40 s but dipped under 100/s for a second whenever the
    // client's call gave up, and each dip ended the storm before it had lasted 30 s.
    clean_run("hdfs-observer-lag-storm", 41, Some((1, 10.0)));
}

#[test]
fn a_stalled_observer_serving_data_older_than_the_refresh_period_is_a_stale_refresh() {
    // Found by `eval --seed 300` (mixed): the stalled observer served one read 19.8 s after a
    // newer state was committed, beyond RBF's 15 s refresh period. The detector raised it as a
    // cross-client stale read and the simulator's truth had no such kind: counted false. The
    // truth now expects cross-client staleness beyond the bound (within the telemetry's
    // resolution of it, either answer is right).
    let mut config = SimConfig::new("hdfs-observer-lag-storm");
    config.seed = 55_733;
    config.duration = Some(200 * lagscope_sim::SECOND);
    let truth = lagscope_sim::run(&config, &mut Vec::<lagscope_sim::Request>::new()).expect("scenario runs");
    let expected: Vec<_> =
        truth.anomalies.iter().filter(|anomaly| anomaly.detail.starts_with("cross_client")).collect();
    assert_eq!(expected.len(), 1, "{expected:#?}");
    assert!(!expected[0].optional, "19.8 s is well past the bound: {:?}", expected[0]);
    let score = evaluate(&config, &AnalyzerConfig::default(), Delivery::default()).expect("scenario runs");
    assert!(score.clean(), "{:?}", score.kinds);
    let found: Vec<_> = score
        .anomalies
        .iter()
        .filter(|anomaly| anomaly.evidence.get("guarantee").and_then(|value| value.as_str()) == Some("cross_client"))
        .collect();
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].node_id.as_deref(), Some("nn-obs2"));
}

#[test]
fn a_failing_eval_says_which_anomalies_it_missed() {
    // Thresholds no scenario can meet: every stale read is missed, and the table shows the
    // first few with their client, node, times and why the truth expected them.
    let directory = tempfile::tempdir().expect("temporary directory");
    let config = directory.path().join("strict.toml");
    std::fs::write(&config, "[analyzer.stale_read]\nmin_states_behind = 1000000000\n").expect("config written");
    let output = Command::new(env!("CARGO_BIN_EXE_lagscope"))
        .args(["eval", "--scenario", "hdfs-publish-race", "--duration", "20s", "--config"])
        .arg(&config)
        .output()
        .expect("lagscope runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(!output.status.success(), "{stdout}");
    assert!(stderr.contains("1 of 1 scenarios have missed or false anomalies: hdfs-publish-race"), "{stderr}");
    let missed: Vec<&str> = stdout.lines().filter(|line| line.trim_start().starts_with("missed:")).collect();
    assert_eq!(missed.len(), lagscope_sim::score::EXAMPLES, "{stdout}");
    assert!(missed[0].contains("client=") && missed[0].contains(" s: "), "{}", missed[0]);
    assert!(!stdout.contains("false:"), "nothing is found, so nothing is false: {stdout}");
}

#[test]
fn a_recorded_run_is_scored_against_the_truth_written_with_it() {
    let directory = tempfile::tempdir().expect("temporary directory");
    let (capture, truth) = (directory.path().join("race.jsonl"), directory.path().join("race.truth.json"));
    let output = Command::new(env!("CARGO_BIN_EXE_lagscope"))
        .args(["sim", "--scenario", "hdfs-publish-race", "--duration", "20s", "--seed", "5", "--out"])
        .arg(&capture)
        .arg("--truth")
        .arg(&truth)
        .output()
        .expect("lagscope runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let (capture, truth_path) = (capture.to_str().expect("utf-8"), truth.to_str().expect("utf-8"));
    let (ok, scores, stderr) = eval_cli(&["--truth", truth_path, capture]);
    assert!(ok, "{stderr}");
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&truth).expect("truth")).expect("json");
    let expected_count = expected["anomalies"].as_array().expect("anomalies").len();
    assert!(expected_count > 10, "the run has anomalies to find: {expected_count}");
    assert_eq!(scores[0]["scenario"], "hdfs-publish-race");
    assert_eq!(scores[0]["anomalies_expected"], expected_count);
    assert_eq!(scores[0]["anomalies_found"], expected_count);

    // A truth that expects one anomaly fewer and one that never happened: one false, one
    // missed, and the run fails.
    let mut tampered = expected.clone();
    let anomalies = tampered["anomalies"].as_array_mut().expect("anomalies");
    let mut invented = anomalies.remove(0);
    invented["client_id"] = "nobody".into();
    anomalies.push(invented);
    let tampered_path = directory.path().join("tampered.truth.json");
    std::fs::write(&tampered_path, tampered.to_string()).expect("written");
    let (ok, scores, stderr) = eval_cli(&["--truth", tampered_path.to_str().expect("utf-8"), capture]);
    assert!(!ok);
    assert!(stderr.contains("1 of 1 scenarios have missed or false anomalies: hdfs-publish-race"), "{stderr}");
    let kinds = scores[0]["kinds"].as_array().expect("kinds");
    let sum = |field: &str| kinds.iter().map(|row| row[field].as_u64().expect("count")).sum::<u64>();
    assert_eq!((sum("missed"), sum("false_positives")), (1, 1), "{kinds:#?}");

    // What is wrong with the arguments or the truth is said by name.
    let not_truth = directory.path().join("not.truth.json");
    std::fs::write(&not_truth, "{\"scenario\": 3}").expect("written");
    let (ok, _, stderr) = eval_cli(&["--truth", not_truth.to_str().expect("utf-8"), capture]);
    assert!(!ok);
    assert!(stderr.contains("not.truth.json:1: not a truth file as `lagscope sim --truth` writes"), "{stderr}");
    let (ok, _, stderr) = eval_cli(&["--truth", truth_path]);
    assert!(!ok);
    assert!(stderr.contains("give the run's capture files, or --data-dir or --database-url"), "{stderr}");
    let (ok, _, stderr) = eval_cli(&["--truth", truth_path, "--scenario", "mixed", capture]);
    assert!(!ok);
    assert!(stderr.contains("'--truth <FILE>' cannot be used with '--scenario <SCENARIO>'"), "{stderr}");
}

/// Two runs back to back, as the demo's rounds (`serve --demo`): the second a new seed
/// starting where the first ended, each `seconds` long (the scenario's length if `None`) and
/// with `prefix(round)` before its names. Analyzed together and scored against both truths.
fn two_rounds(
    scenario: &str,
    seconds: Option<i64>,
    prefix: impl Fn(u64) -> Option<String>,
) -> Vec<lagscope_sim::score::KindScore> {
    use lagscope_collector::otlp::{logs_from_request, samples_from_request, spans_from_request};
    use lagscope_sim::Request;
    let (mut spans, mut samples, mut logs) = (Vec::new(), Vec::new(), Vec::new());
    let mut truth: Option<lagscope_sim::Truth> = None;
    for round in 1..=2 {
        let mut config = SimConfig::new(scenario);
        config.seed = round;
        config.name_prefix = prefix(round);
        config.duration = seconds.map(|seconds| seconds * 1_000_000_000);
        if let Some(first) = &truth {
            config.start_unix_nano = first.end_unix_nano + 1_000_000_000;
        }
        let mut requests: Vec<Request> = Vec::new();
        let run = lagscope_sim::run(&config, &mut requests).expect("scenario runs");
        for request in &requests {
            match request {
                Request::Traces(request) => spans.extend(spans_from_request(request).items),
                Request::Metrics(request) => samples.extend(samples_from_request(request).items),
                Request::Logs(request) => logs.extend(logs_from_request(request).items),
            }
        }
        match &mut truth {
            None => truth = Some(run),
            Some(first) => {
                first.end_unix_nano = run.end_unix_nano;
                first.anomalies.extend(run.anomalies);
            }
        }
    }
    let config = AnalyzerConfig::default();
    let input =
        lagscope_analyzer::AnalysisInput::from_telemetry(&spans, samples, config.stream.horizon()).with_logs(&logs);
    let found = lagscope_analyzer::analyze(&input, &config);
    lagscope::eval::ScenarioScore::of(truth.expect("two rounds ran"), found, spans.len()).kinds
}

#[test]
fn the_demos_rounds_under_names_of_their_own_are_found_exactly() {
    // Each round of the demo starts its clusters' state ids over and its clients afresh (a
    // restarted Pulsar client goes back to its primary). Under the round's own names that is
    // nothing; under the first round's names it is state going back (apply lag against the
    // first round's commits) and sessions that forgot what they saw (stale reads below the first
    // round's floors): what the demo showed from its second round on before its rounds were
    // named. The Pulsar client's restart at its primary, 20 s after its failover, read as a
    // switch back from the addresses of its calls (flapping) until its logged switches, which
    // name no client, were taken as its own: a restart logs no switch, and misleads nothing now.
    // (The Pulsar client as long as in `mixed`, as the demo runs it: 200 s, ending 20 s after
    // its failover to the secondary.)
    for (scenario, seconds, misleads) in [
        ("hdfs-publish-race", None, true),
        ("ozone-apply-lag", None, true),
        ("pulsar-switch-back-delay-lost-fixed", Some(200), false),
    ] {
        let named = two_rounds(scenario, seconds, |round| Some(format!("round-{round}")));
        assert!(named.iter().any(|row| row.expected > 0) || scenario.ends_with("-fixed"), "{scenario}: {named:?}");
        for row in &named {
            assert!(row.missed == 0 && row.false_positives == 0, "{scenario} in named rounds: {row:?}");
        }
        let unnamed = two_rounds(scenario, seconds, |_| None);
        let false_positives: usize = unnamed.iter().map(|row| row.false_positives).sum();
        assert_eq!(false_positives > 0, misleads, "{scenario}: the same names in both rounds: {unnamed:?}");
    }
}
