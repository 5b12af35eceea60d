//! The simulator's output reaches the collector over real protocols: OTLP/HTTP, OTLP/gRPC,
//! and JSON lines read by `lagscope analyze`; every span, sample and log line arrives.

mod support;

use std::path::Path;
use std::process::Command;

use lagscope::progress::Progress;
use lagscope::sim_cmd::{Sending, Target, run, run_with_native};
use lagscope_sim::{SECOND, SimConfig, Truth};
use support::{get_json, start_server, wait_until_analyzed};

fn short(scenario: &str) -> SimConfig {
    let mut config = SimConfig::new(scenario);
    config.duration = Some(15 * SECOND);
    config
}

/// Runs the simulator on its own thread (it drives its own runtime for the network).
fn simulate(config: SimConfig, target: Target) -> (Truth, u64) {
    simulate_in_flight(config, target, 1)
}

/// [`simulate`], with up to `in_flight` export requests sent at once.
fn simulate_in_flight(config: SimConfig, target: Target, in_flight: usize) -> (Truth, u64) {
    std::thread::spawn(move || {
        let sending = Sending { in_flight, ..Sending::default() };
        run_with_native(&config, &target, &sending, None, Progress::Off)
    })
    .join()
    .expect("sim thread")
    .expect("sim delivers")
}

fn spans_of(truth: &Truth) -> u64 {
    truth.figures["spans"].as_u64().expect("span count")
}

async fn delivered(target_of: impl Fn(&lagscope::Server) -> Target, in_flight: usize) {
    let directory = tempfile::tempdir().expect("temp dir");
    // Sent as fast as they are answered (in_flight > 1), 15 s of telemetry arrive in about a
    // second: a request answered late or refused and sent again (after the 1 s the receiver
    // asks for) arrives several seconds of telemetry behind the rest, later than the live
    // analyzer's settling waits for. What it brings is judged all the same (the client or
    // scope is read anew: see
    // `hops_arriving_after_their_calls_were_settled_are_judged_and_counted`).
    let config = support::local_config(directory.path());
    let server = lagscope::Server::start(&config).await.expect("server starts");
    let target = target_of(&server);
    let (truth, requests) =
        tokio::task::spawn_blocking(move || simulate_in_flight(short("hdfs-pool-not-advanced"), target, in_flight))
            .await
            .expect("join");
    assert!(requests > 0);
    wait_until_analyzed(&server).await;
    let (_, health) = get_json(&server, "/api/v1/health").await;
    assert_eq!(health["store"]["spans"].as_u64(), Some(spans_of(&truth)), "{health}");
    assert!(health["store"]["samples"].as_u64().unwrap_or(0) > 0, "{health}");
    // Every stale read the truth names is found live.
    let expected = truth.count("stale_read");
    assert!(expected > 0, "the scenario must produce stale reads in 15 s");
    let (_, listed) = get_json(&server, "/api/v1/anomalies?kind=stale_read&limit=1000").await;
    assert_eq!(listed["anomalies"].as_array().map(Vec::len), Some(expected), "live stale reads vs truth");
    if in_flight == 1 {
        assert_eq!(health["analysis"]["late_spans_total"], 0, "{health}");
    }
    // The timeline says what the metrics said about the serving node at each attempt.
    let (status, timeline) = get_json(&server, "/api/v1/clients/client-2/timeline").await;
    assert_eq!(status, 200, "{timeline}");
    let attempts: Vec<&serde_json::Value> = timeline["timelines"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|timeline| timeline["calls"].as_array().into_iter().flatten())
        .flat_map(|call| call["attempts"].as_array().into_iter().flatten())
        .collect();
    assert!(!attempts.is_empty());
    assert!(
        attempts.iter().any(|attempt| attempt["reported"]["node_role"] == "observer"
            && attempt["reported"]["namespace_committed"].is_i64()),
        "no attempt carries the metrics' view: {:#}",
        attempts[0]
    );
    server.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_otlp_http_everything_arrives_and_is_analyzed() {
    delivered(|server| Target::OtlpHttp(format!("http://{}", server.otlp_http_addr)), 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_otlp_grpc_everything_arrives_and_is_analyzed() {
    delivered(|server| Target::OtlpGrpc(format!("http://{}", server.otlp_grpc_addr)), 1).await;
}

// Several exports at once, as a collector's senders send them: requests answered out of
// order lose nothing, and the live analysis finds what the truth says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_otlp_http_with_exports_in_flight_everything_arrives_and_is_analyzed() {
    delivered(|server| Target::OtlpHttp(format!("http://{}", server.otlp_http_addr)), 8).await;
}

// (16 over gRPC: more than the 8 requests the server receives at once by default; those it
// refuses with RESOURCE_EXHAUSTED and a RetryInfo are sent again after its delay.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_otlp_grpc_with_exports_in_flight_everything_arrives_and_is_analyzed() {
    delivered(|server| Target::OtlpGrpc(format!("http://{}", server.otlp_grpc_addr)), 16).await;
}

/// `eval --stored` scores what the live analyzer stored, as it is (not the store's telemetry
/// analyzed again): exact on a run sent to `serve`, and one missed once a stored anomaly is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_scores_what_the_live_analyzer_stored() {
    let directory = tempfile::tempdir().expect("temp dir");
    let data_dir = directory.path().join("data");
    let server = start_server(&data_dir).await;
    let target = Target::OtlpHttp(format!("http://{}", server.otlp_http_addr));
    let (truth, _) =
        tokio::task::spawn_blocking(move || simulate(short("hdfs-pool-not-advanced"), target)).await.expect("join");
    wait_until_analyzed(&server).await;
    server.shutdown().await.expect("clean shutdown");
    let truth_path = directory.path().join("truth.json");
    std::fs::write(&truth_path, serde_json::to_string(&truth).expect("truth")).expect("written");
    let eval = || {
        let output = Command::new(env!("CARGO_BIN_EXE_lagscope"))
            .args(["eval", "--format", "json", "--stored", "--truth"])
            .arg(&truth_path)
            .arg("--data-dir")
            .arg(&data_dir)
            .output()
            .expect("lagscope runs");
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        let scores: serde_json::Value = serde_json::from_slice(&output.stdout).expect("scores");
        (output.status.success(), scores, stderr)
    };
    let (ok, scores, stderr) = eval();
    assert!(ok, "{stderr}\n{scores:#}");
    let expected = truth.anomalies.len();
    assert!(expected > 10, "{expected}");
    assert!(stderr.contains(&format!("eval: {expected} anomalies stored in ")), "{stderr}");
    assert_eq!(scores[0]["anomalies_found"], expected);

    // One stored stale read gone: the telemetry still shows it, what was stored does not.
    let file = data_dir.join(lagscope_store::sqlite_database_file());
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", file.display())).await.expect("the store");
    let deleted =
        sqlx::query("DELETE FROM anomalies WHERE id = (SELECT MIN(id) FROM anomalies WHERE kind = 'stale_read')")
            .execute(&pool)
            .await
            .expect("deleted");
    assert_eq!(deleted.rows_affected(), 1);
    pool.close().await;
    let (ok, scores, stderr) = eval();
    assert!(!ok, "{scores:#}");
    assert!(stderr.contains("1 of 1 scenarios have missed or false anomalies"), "{stderr}");
    let rows = scores[0]["kinds"].as_array().expect("kinds");
    let stale = rows.iter().find(|row| row["kind"] == "stale_read").expect("a stale_read row");
    assert_eq!((stale["missed"].as_u64(), stale["false_positives"].as_u64()), (Some(1), Some(0)), "{stale:#}");

    // Without a store there is nothing stored to score.
    let output = Command::new(env!("CARGO_BIN_EXE_lagscope"))
        .args(["eval", "--stored", "--truth"])
        .arg(&truth_path)
        .output()
        .expect("lagscope runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--stored scores what a store holds: give --data-dir or --database-url"), "{stderr}");
}

/// The starts of the anomalies of `kind` the server lists (at most 100), in order, with the
/// listing.
async fn starts_of(server: &lagscope::Server, kind: &str) -> (Vec<u64>, serde_json::Value) {
    let (_, listed) = get_json(server, &format!("/api/v1/anomalies?kind={kind}&limit=100")).await;
    let mut starts: Vec<u64> = listed["anomalies"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|anomaly| anomaly["start_unix_nano"].as_u64())
        .collect();
    starts.sort_unstable();
    (starts, listed)
}

/// Posts one OTLP/HTTP request with each component's spans (a resource per component, node
/// `{component}-1`), and waits until the live analyzer has taken it.
async fn post_components(
    server: &lagscope::Server,
    parts: Vec<(&str, Vec<opentelemetry_proto::tonic::trace::v1::Span>)>,
) {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};
    use prost::Message;
    let resource_spans = parts.into_iter().map(|(component, spans)| ResourceSpans {
        resource: Some(support::resource(component, &format!("{component}-1"))),
        scope_spans: vec![ScopeSpans { spans, ..ScopeSpans::default() }],
        ..ResourceSpans::default()
    });
    let request = ExportTraceServiceRequest { resource_spans: resource_spans.collect() };
    let response = reqwest::Client::new()
        .post(format!("http://{}/v1/traces", server.otlp_http_addr))
        .header("content-type", "application/x-protobuf")
        .body(request.encode_to_vec())
        .send()
        .await
        .expect("post");
    assert!(response.status().is_success(), "{}", response.status());
    wait_until_analyzed(server).await;
}

/// What [`delivered_behind`] saw: the late spans (client cache, scope cache) after each
/// round, the settling at the end, the starts of the `router_state_dropped` anomalies listed,
/// and those of the states the router dropped.
struct Behind {
    late: Vec<(Option<u64>, Option<u64>)>,
    settle_seconds: u64,
    dropped: Vec<u64>,
    expected: Vec<u64>,
}

/// Rounds of a read a second through a router to a server (every tenth passing on less than
/// the client carried), each round ten seconds of the clients' and the servers' spans, with
/// the `behind` components' spans (of "client", "router") of three rounds before: their
/// exporters deliver 30 s behind everyone else's. `max_settle_seconds` 0 fixes the settling.
/// With `behind` holding "none", the clients send no spans at all.
async fn delivered_behind(max_settle_seconds: i64, behind: &[&str]) -> Behind {
    use support::{int, span, text};
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock");
    let base = now.as_nanos() as u64 - 300 * SECOND as u64;
    let at = |index: u64| base + index * SECOND as u64;
    let call = |index: u64, carried: i64| {
        vec![
            text("lagscope.client.id", "slow-router-1"),
            text("lagscope.call.id", &format!("call-{index}")),
            text("lagscope.namespace", "ns1"),
            text("lagscope.op", "read"),
            int("lagscope.state.carried", carried),
        ]
    };
    // A read a second, its server span under the router's hop; every tenth hop passes on
    // less than the client carried.
    let client = |index: u64| span(index + 1, 10 * index + 1, 0, at(index), at(index) + 1_000_000, call(index, 1000));
    let router = |index: u64| {
        let carried = if index % 10 == 5 { 500 } else { 1000 };
        span(index + 1, 10 * index + 2, 10 * index + 1, at(index) + 100_000, at(index) + 900_000, call(index, carried))
    };
    let server = |index: u64| {
        let attributes = vec![text("lagscope.namespace", "ns1"), int("lagscope.state.served", 1000)];
        span(index + 1, 10 * index + 3, 10 * index + 2, at(index) + 200_000, at(index) + 800_000, attributes)
    };
    const ROUNDS: u64 = 12;
    let directory = tempfile::tempdir().expect("temp dir");
    let mut config = support::local_config(directory.path());
    config.live.max_settle_seconds = max_settle_seconds;
    let lagscope = lagscope::Server::start(&config).await.expect("server starts");
    let mut late = Vec::new();
    for round in 0..ROUNDS + 3 {
        let now: Vec<u64> = (round * 10..(round * 10 + 10)).filter(|_| round < ROUNDS).collect();
        let before: Vec<u64> =
            (round.saturating_sub(3) * 10..(round.saturating_sub(3) * 10 + 10)).filter(|_| round >= 3).collect();
        let of = |component: &str| if behind.contains(&component) { before.clone() } else { now.clone() }.into_iter();
        post_components(
            &lagscope,
            vec![
                ("client", of("client").filter(|_| !behind.contains(&"none")).map(client).collect()),
                ("server", now.iter().copied().map(server).collect()),
                ("router", of("router").map(router).collect()),
            ],
        )
        .await;
        let (_, health) = get_json(&lagscope, "/api/v1/health").await;
        let analysis = &health["analysis"];
        late.push((analysis["late_spans_total"].as_u64(), analysis["scope_late_spans_total"].as_u64()));
    }
    let (_, health) = get_json(&lagscope, "/api/v1/health").await;
    let settle_seconds = health["analysis"]["settle_seconds"].as_u64().expect("settle_seconds");
    let (dropped, _) = starts_of(&lagscope, "router_state_dropped").await;
    lagscope.shutdown().await.expect("clean shutdown");
    let expected = (0..ROUNDS * 10).filter(|index| index % 10 == 5).map(at).collect();
    Behind { late, settle_seconds, dropped, expected }
}

/// A router whose exporter delivers 30 s of telemetry behind everyone else, where no client
/// sends its spans: the server spans under its hops wait the default settling (10 s) and are
/// let go, and then its hops come. With the settling fixed, each delivery's hops are late, and
/// their scope read anew, for as long as it lasts; widened by what the first late hops missed
/// it by, the settling holds the server spans until their hops come, and the hops join on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_delivering_late_widens_the_settling_until_its_hops_join_on_time() {
    let Behind { late, settle_seconds, .. } = delivered_behind(0, &["router", "none"]).await;
    assert_eq!(settle_seconds, 10, "fixed");
    // Every round's hops after the first few are late: the count grows to the end.
    let (halfway, last) = (late[late.len() / 2], late[late.len() - 1]);
    assert!(last.1 > halfway.1, "{late:?}");

    let Behind { late, settle_seconds, .. } = delivered_behind(120, &["router", "none"]).await;
    // Widened to hold hops 30-39 s late (the last of a round's ten calls is 9 s newer than the
    // first), not to the most allowed.
    assert!((31..=60).contains(&settle_seconds), "widened to hold 30 s late hops: {settle_seconds} s");
    // Some hops were late before it widened, none after.
    let (halfway, last) = (late[late.len() / 2], late[late.len() - 1]);
    assert!(halfway.1 > Some(0), "{late:?}");
    assert_eq!(last, halfway, "{late:?}");
}

/// Where the clients send their spans, a router's exporter 30 s behind everyone else's, or
/// the clients' and the router's both (as calls exported when they end, long after the server
/// spans under their first attempts): the server spans wait, held, for the hops and attempts
/// above them, which come on time. With the settling fixed at 10 s, nothing is late (but, the
/// clients' 30 s behind, the first delivery's router hops, before any client of the namespace
/// had sent: their server spans had gone), and every dropped state is found. (Let go at the
/// settling, the server spans made every router hop late: read anew, or the settling widened.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_spans_wait_for_the_calls_above_them_exported_late() {
    let Behind { late, settle_seconds, dropped, expected } = delivered_behind(0, &["router"]).await;
    assert_eq!(settle_seconds, 10, "fixed");
    assert_eq!(dropped, expected, "{late:?}");
    assert!(late.iter().all(|late| *late == (Some(0), Some(0))), "nothing late: {late:?}");

    let Behind { late, settle_seconds, dropped, expected } = delivered_behind(0, &["client", "router"]).await;
    assert_eq!(settle_seconds, 10, "fixed");
    assert_eq!(dropped, expected, "{late:?}");
    // The first delivery behind: at most its ten router hops late, and none after it.
    let first = late[3];
    assert!(late[..3].iter().all(|late| *late == (Some(0), Some(0))), "{late:?}");
    assert!(first.0 == Some(0) && first.1 <= Some(10), "{late:?}");
    assert!(late[3..].iter().all(|late| *late == first), "{late:?}");
}

/// A hop that arrives after its client's live timeline was settled past it (the call was let
/// go `live.settle_seconds` behind the client's newest span) is still judged live: the client
/// (and the scope) holding that timeline is read anew from the store. Such hops are counted,
/// on `/api/v1/health` and `/metrics`, so that operators see what came late; a hop of a call
/// still held is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hops_arriving_after_their_calls_were_settled_are_judged_and_counted() {
    use support::{int, span, text};
    let directory = tempfile::tempdir().expect("temp dir");
    // The settling fixed: every late span here is to be read anew (what widens it is below).
    let mut config = support::local_config(directory.path());
    config.live.max_settle_seconds = 0;
    let server = lagscope::Server::start(&config).await.expect("server starts");
    let http = reqwest::Client::new();
    let post = async |parts: Vec<(&str, Vec<_>)>| post_components(&server, parts).await;
    // (Recent: the live caches hold nothing older than the retention.)
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock");
    let base = now.as_nanos() as u64 - 300 * SECOND as u64;
    let call = |index: u64| {
        vec![
            text("lagscope.client.id", "late-1"),
            text("lagscope.call.id", &format!("call-{index}")),
            text("lagscope.namespace", "ns1"),
            text("lagscope.op", "read"),
            int("lagscope.state.carried", 1000),
        ]
    };
    // 40 reads 5 s apart, each with its server span (sent together: on time): the client and
    // its scope are held and settled (what the detectors may still reach, a minute or so
    // behind the newest, is not). A server span names no client: it joins its client's
    // attempt by trace. The 3rd read's comes later.
    let at = |index: u64| base + index * 5 * SECOND as u64;
    let served = |index: u64, state: i64| {
        let attributes = vec![text("lagscope.namespace", "ns1"), int("lagscope.state.served", state)];
        span(index + 1, 10 * index + 3, 10 * index + 1, at(index) + 200_000, at(index) + 800_000, attributes)
    };
    let client = |index: u64| span(index + 1, 10 * index + 1, 0, at(index), at(index) + 1_000_000, call(index));
    post(vec![
        ("server", (0..40).filter(|index| *index != 2).map(|index| served(index, 1000)).collect()),
        ("client", (0..40).map(client).collect()),
    ])
    .await;
    let (_, health) = get_json(&server, "/api/v1/health").await;
    assert_eq!(health["analysis"]["late_spans_total"], 0, "{health:#}");

    let (_, listed) = get_json(&server, "/api/v1/anomalies?limit=100").await;
    assert_eq!(listed["anomalies"].as_array().map(Vec::len), Some(0), "{listed:#}");

    // The router hops of the 2nd call (settled long since) and of the 39th (still held), each
    // passing on less than the client carried.
    let hop = |index: u64| {
        let mut attributes = call(index);
        attributes.pop();
        attributes.push(int("lagscope.state.carried", 500));
        span(index + 1, 10 * index + 2, 10 * index + 1, at(index) + 100_000, at(index) + 900_000, attributes)
    };
    post(vec![("router", vec![hop(1), hop(38)])]).await;
    let (_, health) = get_json(&server, "/api/v1/health").await;
    assert_eq!(health["analysis"]["late_spans_total"], 1, "{health:#}");
    assert_eq!(health["analysis"]["scope_late_spans_total"], 1, "{health:#}");
    let metrics = http.get(format!("http://{}/metrics", server.api_addr)).send().await.expect("get");
    let metrics = metrics.text().await.expect("text");
    assert!(metrics.contains("\nlagscope_analysis_late_spans_total 1\n"), "{metrics}");
    assert!(metrics.contains("\nlagscope_analysis_scope_late_spans_total 1\n"), "{metrics}");
    // Both dropped states are found, the late hop's as well.
    let (starts, listed) = starts_of(&server, "router_state_dropped").await;
    assert_eq!(starts, [at(1), at(38)], "{listed:#}");

    // The 3rd read's server span, long after its call was settled, served below what the
    // reads before it saw: the client is found by the span's trace, read anew, and the stale
    // read is found.
    post(vec![("server", vec![served(2, 900)])]).await;
    let (_, health) = get_json(&server, "/api/v1/health").await;
    assert_eq!(health["analysis"]["late_spans_total"], 2, "{health:#}");
    assert_eq!(health["analysis"]["scope_late_spans_total"], 2, "{health:#}");
    let (_, listed) = get_json(&server, "/api/v1/anomalies?kind=stale_read&limit=100").await;
    let stale: Vec<(u64, &str)> = listed["anomalies"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|anomaly| Some((anomaly["start_unix_nano"].as_u64()?, anomaly["evidence"]["guarantee"].as_str()?)))
        .collect();
    assert_eq!(stale, [(at(2), "monotonic_reads")], "{listed:#}");

    // Forty more reads, on time, but the 42nd's server span is under a router's span that has
    // not come: it waits for it, joined to nothing (held, as the client sends its spans),
    // for a horizon (90 s) after it ended, and then a settle lets it go. The router's span
    // then comes, naming no client (its trace does), too late for what waited for it: the
    // client and the scope are read anew and the read judged with its served state.
    let router_id: u64 = 10 * 41 + 2;
    let mut waiting = served(41, 900);
    waiting.parent_span_id = router_id.to_be_bytes().to_vec();
    let servers = (40..46).filter(|index| *index != 41).map(|index| served(index, 1000));
    post(vec![("server", servers.chain([waiting]).collect()), ("client", (40..46).map(client).collect())]).await;
    for reads in (46..82).collect::<Vec<u64>>().chunks(4) {
        let servers = reads.iter().map(|index| served(*index, 1000)).collect();
        post(vec![("server", servers), ("client", reads.iter().copied().map(client).collect())]).await;
    }
    let (_, health) = get_json(&server, "/api/v1/health").await;
    assert_eq!(health["analysis"]["late_spans_total"], 2, "{health:#}");
    let (_, listed) = get_json(&server, "/api/v1/anomalies?kind=stale_read&limit=100").await;
    assert_eq!(listed["anomalies"].as_array().map(Vec::len), Some(1), "not judged yet: {listed:#}");
    let unchanged = async || {
        let metrics = http.get(format!("http://{}/metrics", server.api_addr)).send().await.expect("get");
        let metrics = metrics.text().await.expect("text");
        let line =
            metrics.lines().find(|line| line.starts_with("lagscope_anomalies_unchanged_total ")).expect("metric");
        line.rsplit(' ').next().and_then(|count| count.parse::<u64>().ok()).expect("count")
    };
    let unchanged_before = unchanged().await;
    let router = vec![text("lagscope.namespace", "ns1"), int("lagscope.state.carried", 1000)];
    post(vec![("router", vec![span(42, router_id, 10 * 41 + 1, at(41) + 100_000, at(41) + 900_000, router)])]).await;
    // Read anew, the client reports again only what the late span may have changed: from two
    // horizons (180 s) before it. The 39th call's dropped state is found again as stored; the
    // 2nd's and the stale 3rd read, long before, are not reported again (a read anew, cut at
    // its span limit, may judge them with less history than the passes that reported them).
    assert_eq!(unchanged().await - unchanged_before, 1);
    let (_, health) = get_json(&server, "/api/v1/health").await;
    assert_eq!(health["analysis"]["late_spans_total"], 3, "{health:#}");
    assert_eq!(health["analysis"]["scope_late_spans_total"], 3, "{health:#}");
    let (starts, listed) = starts_of(&server, "stale_read").await;
    assert!(starts.contains(&at(41)), "{listed:#}");
    server.shutdown().await.expect("clean shutdown");
}

/// A client that calls a namespace again after a minute away carries a state beyond what its
/// own earlier calls saw reported, but not beyond what the namespace's servers reported
/// meanwhile: not an untrusted state. Its client pass knows only its own calls' servers, and
/// found one (live only, in a live sweep: this seed, load and scenario); the scope pass, which
/// reads every server's reports, judges that kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_back_in_a_namespace_is_judged_by_every_server_s_reports() {
    let directory = tempfile::tempdir().expect("temp dir");
    let data_dir = directory.path().join("data");
    let server = start_server(&data_dir).await;
    let target = Target::OtlpHttp(format!("http://{}", server.otlp_http_addr));
    let mut config = SimConfig::new("hdfs-observer-lag-storm");
    (config.seed, config.clients, config.rate, config.duration) = (6230, Some(12), Some(32.0), Some(80 * SECOND));
    let (truth, _) = tokio::task::spawn_blocking(move || simulate(config, target)).await.expect("join");
    wait_until_analyzed(&server).await;
    server.shutdown().await.expect("clean shutdown");
    let truth_path = directory.path().join("truth.json");
    std::fs::write(&truth_path, serde_json::to_string(&truth).expect("truth")).expect("written");
    let output = Command::new(env!("CARGO_BIN_EXE_lagscope"))
        .args(["eval", "--stored", "--truth"])
        .arg(&truth_path)
        .arg("--data-dir")
        .arg(&data_dir)
        .output()
        .expect("lagscope runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_sent_over_http_are_stored() {
    let directory = tempfile::tempdir().expect("temp dir");
    let server = start_server(directory.path()).await;
    let target = Target::OtlpHttp(format!("http://{}", server.otlp_http_addr));
    // The no-namenodes scenario logs the router's "Cannot get available namenode" lines.
    tokio::task::spawn_blocking(move || simulate(short("hdfs-no-namenodes"), target)).await.expect("join");
    let (_, health) = get_json(&server, "/api/v1/health").await;
    assert!(health["store"]["logs"].as_u64().unwrap_or(0) > 0, "{health}");
    server.shutdown().await.expect("clean shutdown");
}

#[test]
fn json_lines_from_sim_are_read_by_analyze_with_the_same_stale_reads() {
    let directory = tempfile::tempdir().expect("temp dir");
    let out = directory.path().join("capture.jsonl");
    let truth_path = directory.path().join("truth.json");
    let binary = env!("CARGO_BIN_EXE_lagscope");
    let status = Command::new(binary)
        .args(["sim", "--scenario", "hdfs-publish-race", "--duration", "10s", "--seed", "3"])
        .arg("--out")
        .arg(&out)
        .arg("--truth")
        .arg(&truth_path)
        .status()
        .expect("sim runs");
    assert!(status.success());
    let truth: Truth = serde_json::from_str(&std::fs::read_to_string(&truth_path).expect("truth")).expect("truth JSON");
    let output = Command::new(binary).args(["analyze", "--format", "json"]).arg(&out).output().expect("analyze runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let found = report["anomalies"]
        .as_array()
        .map_or(0, |anomalies| anomalies.iter().filter(|anomaly| anomaly["kind"] == "stale_read").count());
    assert!(truth.count("stale_read") > 0);
    assert_eq!(found, truth.count("stale_read"));
    assert!(Path::new(&out).metadata().expect("file").len() > 0);
}

/// `sim --export-delay` (and the other delivery options `eval` takes) sends the same requests
/// held back, so out of order; `--lose` sends fewer; a delay the live analyzer takes but the
/// streaming engine would not is accepted; a fraction out of range is refused by name.
#[test]
fn sim_delivers_its_requests_late_as_asked() {
    let directory = tempfile::tempdir().expect("temp dir");
    let binary = env!("CARGO_BIN_EXE_lagscope");
    let sim = |name: &str, delivery: &[&str]| {
        let out = directory.path().join(name);
        let output = Command::new(binary)
            .args(["sim", "--scenario", "hdfs-publish-race", "--duration", "60s", "--seed", "3", "--out"])
            .arg(&out)
            .args(delivery)
            .output()
            .expect("sim runs");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let text = std::fs::read_to_string(&out).expect("capture");
        text.lines().map(str::to_string).collect::<Vec<String>>()
    };
    let in_order = sim("in-order.jsonl", &[]);
    let delayed = sim("delayed.jsonl", &["--export-delay", "30s"]);
    assert_ne!(delayed, in_order, "held back: out of order");
    let sorted = |mut lines: Vec<String>| {
        lines.sort();
        lines
    };
    assert_eq!(sorted(delayed), sorted(in_order.clone()), "the same requests");
    let lost = sim("lost.jsonl", &["--lose", "0.3"]);
    assert!(lost.len() < in_order.len() && lost.iter().all(|line| in_order.contains(line)), "{}", lost.len());
    let output = Command::new(binary)
        .args(["sim", "--scenario", "hdfs-publish-race", "--out"])
        .arg(directory.path().join("refused.jsonl"))
        .args(["--redeliver", "1.5"])
        .output()
        .expect("sim runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--redeliver 1.5: must be a fraction between 0 and 1"), "{stderr}");
}

#[test]
fn realtime_paces_the_run_on_the_wall_clock() {
    let directory = tempfile::tempdir().expect("temp dir");
    let mut config = SimConfig::new("hdfs-observer-healthy");
    config.duration = Some(2 * SECOND);
    let started = std::time::Instant::now();
    run(&config, &Target::JsonLines(directory.path().join("paced.jsonl")), true).expect("paced run");
    // Batches are flushed every simulated second: the last one is due at 2 s of wall time.
    assert!(started.elapsed() >= std::time::Duration::from_millis(1900), "took {:?}", started.elapsed());
    let paced = std::fs::read(directory.path().join("paced.jsonl")).expect("paced output");
    run(&config, &Target::JsonLines(directory.path().join("fast.jsonl")), false).expect("fast run");
    let fast = std::fs::read(directory.path().join("fast.jsonl")).expect("fast output");
    assert_eq!(paced, fast, "pacing changes when, not what");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_anomalies_open_live_and_resolve_when_the_condition_ends() {
    let directory = tempfile::tempdir().expect("temp dir");
    let server = start_server(directory.path()).await;
    let url = format!("http://{}", server.otlp_http_addr);
    // The first 30 s: router-1's NoNamenodesAvailable window (from 8 s) is still going on.
    let mut first = SimConfig::new("hdfs-no-namenodes");
    first.duration = Some(30 * SECOND);
    let target = Target::OtlpHttp(url.clone());
    tokio::task::spawn_blocking(move || simulate(first, target)).await.expect("join");
    wait_until_analyzed(&server).await;
    let (_, open) = get_json(&server, "/api/v1/anomalies?kind=no_namenodes_window").await;
    let open = open["anomalies"].as_array().cloned().unwrap_or_default();
    assert_eq!(open.len(), 1, "{open:#?}");
    assert_eq!(open[0]["open"], true, "{:#}", open[0]);
    assert_eq!(open[0]["node_id"], "router-1");
    assert_eq!(open[0]["evidence"]["active_reported_by"], "nn6001", "{:#}", open[0]);

    // The same run to its end (the first 30 s are the same bytes and are stored once): the
    // cache reload at 68 s ends the window.
    let target = Target::OtlpHttp(url);
    tokio::task::spawn_blocking(move || simulate(SimConfig::new("hdfs-no-namenodes"), target)).await.expect("join");
    wait_until_analyzed(&server).await;
    let (_, resolved) = get_json(&server, "/api/v1/anomalies?kind=no_namenodes_window&status=resolved").await;
    let resolved = resolved["anomalies"].as_array().cloned().unwrap_or_default();
    assert_eq!(resolved.len(), 1, "{resolved:#?}");
    assert_eq!(resolved[0]["id"], open[0]["id"], "the same incident, resolved");
    let seconds = resolved[0]["evidence"]["window_seconds"].as_f64().unwrap_or(0.0);
    assert!((55.0..=67.0).contains(&seconds), "window {seconds} s");
    let (status, bad) = get_json(&server, "/api/v1/anomalies?status=maybe").await;
    assert_eq!(status, 400, "{bad}");
    server.shutdown().await.expect("clean shutdown");
}

/// Kinds whose evidence lies outside one client's spans are found live too: `pinned_retry`
/// (another node served other clients meanwhile) and `unfair_rejection` (another shard of the
/// node held the bytes), exactly as the truth names them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_finds_what_other_clients_and_shards_show() {
    // Also a client's own history read whole, probes included: a probe that stayed up while
    // sends failed, and a switch back that did not wait (judged once, by the client pass).
    for scenario in
        ["ozone-pinned-retry", "es-node-level-pressure", "pulsar-tcp-probe-half-dead", "pulsar-switch-back-delay-lost"]
    {
        let directory = tempfile::tempdir().expect("temp dir");
        let server = start_server(directory.path()).await;
        let target = Target::OtlpHttp(format!("http://{}", server.otlp_http_addr));
        let sending = tokio::task::spawn_blocking(move || simulate(SimConfig::new(scenario), target));
        // Every cause the API gave while the data arrived: what each pass wrote in turn.
        let mut causes = std::collections::BTreeSet::new();
        let mut note_causes = async || {
            let (_, listed) = get_json(&server, "/api/v1/anomalies?limit=1000").await;
            for anomaly in listed["anomalies"].as_array().into_iter().flatten() {
                causes.insert((anomaly["kind"].to_string(), anomaly["cause"].to_string()));
            }
            listed
        };
        while !sending.is_finished() {
            note_causes().await;
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let (truth, _) = sending.await.expect("join");
        // (Tens of thousands of spans, analysed by a debug build.)
        support::wait_until_analyzed_within(&server, std::time::Duration::from_secs(180)).await;
        let listed = note_causes().await;
        let found: Vec<lagscope_sim::score::Found> = listed["anomalies"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|anomaly| lagscope_sim::score::Found {
                kind: anomaly["kind"].as_str().unwrap_or_default().to_string(),
                cluster: anomaly["cluster"].as_str().map(str::to_string),
                namespace: anomaly["namespace"].as_str().map(str::to_string),
                client_id: anomaly["client_id"].as_str().map(str::to_string),
                node_id: anomaly["node_id"].as_str().map(str::to_string),
                start_unix_nano: anomaly["start_unix_nano"].as_i64().unwrap_or_default(),
                end_unix_nano: anomaly["end_unix_nano"].as_i64().unwrap_or_default(),
            })
            .collect();
        let scores = lagscope_sim::score::score(&truth, &found);
        assert!(!truth.anomalies.is_empty() && !scores.is_empty(), "{scenario}: {scores:#?}");
        for row in &scores {
            assert_eq!((row.missed, row.false_positives), (0, 0), "{scenario}: {row:#?}");
        }
        if scenario == "pulsar-switch-back-delay-lost" {
            let flapping: Vec<&String> =
                causes.iter().filter(|(kind, _)| kind == "\"failover_flapping\"").map(|(_, cause)| cause).collect();
            assert!(!flapping.is_empty(), "{listed:#}");
            assert!(
                flapping.iter().all(|cause| cause.contains("apache/pulsar#14442")),
                "a pass wrote another cause over the client pass's: {flapping:#?}"
            );
        }
        server.shutdown().await.expect("clean shutdown");
    }
}

#[test]
fn exports_in_flight_are_refused_where_nothing_is_sent() {
    let directory = tempfile::tempdir().expect("temp dir");
    let out = directory.path().join("run.jsonl");
    let sim = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_lagscope"))
            .args(["sim", "--scenario", "hdfs-publish-race", "--duration", "5s"])
            .args(args)
            .output()
            .expect("lagscope runs");
        (output.status.success(), String::from_utf8_lossy(&output.stderr).into_owned())
    };
    let path = out.to_str().expect("utf-8 path");
    let (ok, stderr) = sim(&["--out", path, "--in-flight", "4"]);
    assert!(!ok && stderr.contains("--in-flight 4 applies to exports sent with --otlp-http"), "{stderr}");
    assert!(!out.exists(), "nothing written");
    let (ok, stderr) = sim(&["--out", path, "--in-flight", "0"]);
    assert!(!ok && stderr.contains("--in-flight"), "{stderr}");
    // One at a time is what a file gets anyway.
    let (ok, stderr) = sim(&["--out", path, "--in-flight", "1"]);
    assert!(ok && out.exists(), "{stderr}");
}
