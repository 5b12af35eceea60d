//! Several `lagscope serve` processes on one PostgreSQL database: the live analysis is split
//! between them by leases, an instance killed mid-run has its shards taken over within the
//! lease time, and every anomaly the simulator's truth expects is reported exactly once.

mod support;

#[path = "../../store/tests/support/postgres.rs"]
mod postgres_support;

use std::time::{Duration, Instant};

use lagscope_sim::score::{Found, score};
use lagscope_sim::{Request, SECOND, SimConfig, Truth};
use prost::Message;
use serde_json::Value;
use support::ServeProcess;

const LEASE_SECONDS: u64 = 2;

fn serve_config(database_url: &str, instance: &str) -> String {
    format!(
        "[server]\ndatabase_url = {database_url:?}\n\n[cluster]\ninstance_id = {instance:?}\n\
         lease_seconds = {LEASE_SECONDS}\npoll_interval_ms = 100\n"
    )
}

async fn get(api: &str, path: &str) -> Value {
    let response = reqwest::get(format!("http://{api}{path}")).await.unwrap_or_else(|error| panic!("{path}: {error}"));
    assert!(response.status().is_success(), "{path} answered {}", response.status());
    response.json().await.expect("JSON body")
}

/// The shards `instance` holds, as `api` reports them.
async fn shards_of(api: &str, instance: &str) -> usize {
    let cluster = get(api, "/api/v1/cluster").await;
    cluster["instances"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|entry| entry["instance"] == instance)
        .and_then(|entry| entry["shards"].as_array())
        .map_or(0, Vec::len)
}

async fn wait_for(what: &str, limit: Duration, mut done: impl AsyncFnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !done().await {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

/// Sends one simulator request over OTLP/HTTP protobuf; `false` if the instance is gone.
async fn send(client: &reqwest::Client, otlp: &str, request: &Request) -> bool {
    let (path, body) = match request {
        Request::Traces(request) => ("/v1/traces", request.encode_to_vec()),
        Request::Metrics(request) => ("/v1/metrics", request.encode_to_vec()),
        Request::Logs(request) => ("/v1/logs", request.encode_to_vec()),
    };
    match client
        .post(format!("http://{otlp}{path}"))
        .header("content-type", "application/x-protobuf")
        .body(body)
        .send()
        .await
    {
        Ok(response) => {
            assert!(response.status().is_success(), "{otlp}{path} answered {}", response.status());
            true
        }
        Err(error) if error.is_connect() => false,
        Err(error) => panic!("{otlp}{path}: {error}"),
    }
}

/// The cluster a request's first resource names (requests of one cluster must arrive in order).
fn cluster_of(request: &Request) -> Option<String> {
    let resource = match request {
        Request::Traces(request) => request.resource_spans.first().and_then(|first| first.resource.as_ref()),
        Request::Metrics(request) => request.resource_metrics.first().and_then(|first| first.resource.as_ref()),
        Request::Logs(request) => request.resource_logs.first().and_then(|first| first.resource.as_ref()),
    }?;
    resource
        .attributes
        .iter()
        .find(|attribute| attribute.key == lagscope_model::conventions::CLUSTER)
        .map(|attribute| format!("{:?}", attribute.value))
}

/// Sends every request, spread over `targets` one request each in turn: the requests of one
/// cluster one after another, acknowledged before the next (as one exporter sends), the
/// clusters concurrently.
async fn send_all(client: &reqwest::Client, requests: &[Request], targets: &[&str]) {
    let mut by_cluster: std::collections::BTreeMap<Option<String>, Vec<(usize, &Request)>> = Default::default();
    for (index, request) in requests.iter().enumerate() {
        by_cluster.entry(cluster_of(request)).or_default().push((index, request));
    }
    let senders = by_cluster.into_values().map(|group| async move {
        for (index, request) in group {
            let target = targets[index % targets.len()];
            assert!(send(client, target, request).await, "{target} is up");
        }
    });
    futures::future::join_all(senders).await;
}

/// The simulator's run of `sim`: its truth and its requests (on a blocking thread).
async fn simulate(sim: SimConfig) -> (Truth, Vec<Request>) {
    tokio::task::spawn_blocking(move || {
        let mut requests = Vec::new();
        let truth = lagscope_sim::run(&sim, &mut requests).expect("the simulator runs");
        (truth, requests)
    })
    .await
    .expect("sim thread")
}

/// Every anomaly the API lists, page by page.
async fn all_anomalies(api: &str) -> Vec<Value> {
    let mut anomalies = Vec::new();
    let mut before: Option<i64> = None;
    loop {
        let page = match before {
            Some(id) => get(api, &format!("/api/v1/anomalies?limit=1000&before={id}")).await,
            None => get(api, "/api/v1/anomalies?limit=1000").await,
        };
        anomalies.extend(page["anomalies"].as_array().cloned().unwrap_or_default());
        match page["next_before"].as_i64() {
            Some(id) => before = Some(id),
            None => return anomalies,
        }
    }
}

fn found(anomaly: &Value) -> Found {
    let text = |field: &str| anomaly[field].as_str().map(str::to_string);
    Found {
        kind: text("kind").expect("kind"),
        cluster: text("cluster"),
        namespace: text("namespace"),
        client_id: text("client_id"),
        node_id: text("node_id"),
        start_unix_nano: anomaly["start_unix_nano"].as_i64().expect("start"),
        end_unix_nano: anomaly["end_unix_nano"].as_i64().expect("end"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_split_the_analysis_and_survive_one_being_killed() {
    let database_url = postgres_support::fresh_database().await;
    let directory = tempfile::tempdir().expect("temp dir");
    let a = ServeProcess::start(&directory.path().join("a"), &serve_config(&database_url, "a"));
    let b = ServeProcess::start(&directory.path().join("b"), &serve_config(&database_url, "b"));
    let b_api = b.api.clone();
    // They split the shards between them.
    let half = (lagscope_store::SHARDS / 2) as usize;
    wait_for("the shards split between a and b", Duration::from_secs(30), async || {
        shards_of(&b_api, "a").await == half && shards_of(&b_api, "b").await == half
    })
    .await;

    let mut sim = SimConfig::new("mixed");
    sim.duration = Some(40 * SECOND);
    let (truth, requests) = simulate(sim).await;
    assert!(truth.anomalies.len() > 20, "the run must expect anomalies of many kinds");
    let run_started = Instant::now();
    eprintln!("{} requests, {} anomalies expected", requests.len(), truth.anomalies.len());

    // A load balancer spreads the requests over both, request by request; each cluster's
    // senders send in order, the clusters side by side. a is killed halfway (SIGKILL: no
    // release, its leases must run out) and b receives the rest.
    let client = reqwest::Client::new();
    let middle = requests.len() / 2;
    send_all(&client, &requests[..middle], &[a.otlp_http.as_str(), b.otlp_http.as_str()]).await;
    assert_eq!(shards_of(&b_api, "a").await, half, "a holds its shards when it dies");
    let pending_at_kill = get(&b_api, "/api/v1/cluster").await["pending_marks"].as_u64().unwrap_or(0);
    a.kill();
    let killed_at = Instant::now();
    let b_otlp = b.otlp_http.clone();
    let rest = requests[middle..].to_vec();
    let sender = tokio::spawn(async move { send_all(&client, &rest, &[b_otlp.as_str()]).await });
    wait_for("b takes over a's shards", Duration::from_secs(LEASE_SECONDS * 5), async || {
        shards_of(&b_api, "b").await == lagscope_store::SHARDS as usize
    })
    .await;
    let takeover = killed_at.elapsed();
    eprintln!(
        "a killed with {pending_at_kill} marks pending; b held every shard {} ms later (lease {LEASE_SECONDS} s)",
        takeover.as_millis()
    );
    // Within the lease (plus one renewal round of b, a third of it) and scheduling slack.
    assert!(
        takeover
            <= Duration::from_secs(LEASE_SECONDS) + Duration::from_secs(LEASE_SECONDS) / 3 + Duration::from_secs(2),
        "takeover took {takeover:?}"
    );
    sender.await.expect("the rest is sent");
    eprintln!("everything sent after {:?}", run_started.elapsed());
    let cluster = get(&b_api, "/api/v1/cluster").await;
    let a_entry = cluster["instances"].as_array().into_iter().flatten().find(|entry| entry["instance"] == "a");
    assert_eq!(a_entry.map(|entry| entry["alive"].clone()), Some(Value::Bool(false)), "{cluster}");

    // Everything committed is analysed: no mark waits anywhere.
    wait_for("every mark analysed", Duration::from_secs(180), async || {
        get(&b_api, "/api/v1/cluster").await["pending_marks"].as_u64() == Some(0)
    })
    .await;
    eprintln!("everything analysed after {:?}", run_started.elapsed());
    let anomalies = all_anomalies(&b_api).await;
    let mut fingerprints: Vec<&str> =
        anomalies.iter().map(|anomaly| anomaly["fingerprint"].as_str().expect("fingerprint")).collect();
    fingerprints.sort_unstable();
    fingerprints.dedup();
    assert_eq!(fingerprints.len(), anomalies.len(), "one row per fingerprint");
    let found: Vec<Found> = anomalies.iter().map(found).collect();
    let scores = score(&truth, &found);
    for row in &scores {
        eprintln!(
            "{:<28} expected {:>4} found {:>4} missed {:>3} false {:>3}",
            row.kind, row.expected, row.found, row.missed, row.false_positives
        );
    }
    let failing: Vec<_> = scores.iter().filter(|row| row.missed > 0 || row.false_positives > 0).collect();
    assert!(failing.is_empty(), "every expected anomaly once, nothing else: {failing:#?}");
    b.stop();
}

/// The instance holding `shard`, as `api` reports it.
/// Instances `names` on one database, started one after another, each once the ones before
/// hold their share of the shards: the shards then split in ranges, in start order.
/// Each keeps its data in `directory`, named by its name and `tag`.
async fn start_in_turn(
    database_url: &str,
    directory: &std::path::Path,
    tag: &str,
    names: &[&str],
) -> Vec<ServeProcess> {
    let mut instances: Vec<ServeProcess> = Vec::new();
    for (count, name) in names.iter().enumerate() {
        let data_dir = directory.join(format!("{name}{tag}"));
        instances.push(ServeProcess::start(&data_dir, &serve_config(database_url, name)));
        let api = instances[0].api.clone();
        let fair = (lagscope_store::SHARDS as usize).div_ceil(count + 1);
        wait_for("each instance holding its share", Duration::from_secs(30), async || {
            let mut held = 0;
            for other in &names[..=count] {
                let shards = shards_of(&api, other).await;
                if shards > fair {
                    return false;
                }
                held += shards;
            }
            held == lagscope_store::SHARDS as usize
        })
        .await;
    }
    instances
}

/// Sends `requests` spread over `instances` ([`send_all`]), waits until every mark is
/// analysed and returns every anomaly listed.
async fn send_and_analyse(instances: &[ServeProcess], requests: &[Request]) -> Vec<Value> {
    let client = reqwest::Client::new();
    let targets: Vec<&str> = instances.iter().map(|instance| instance.otlp_http.as_str()).collect();
    send_all(&client, requests, &targets).await;
    let api = &instances[0].api;
    wait_for("every mark analysed", Duration::from_secs(180), async || {
        get(api, "/api/v1/cluster").await["pending_marks"].as_u64() == Some(0)
    })
    .await;
    all_anomalies(api).await
}

async fn holder_of(api: &str, shard: i32) -> String {
    let cluster = get(api, "/api/v1/cluster").await;
    let holder = cluster["instances"].as_array().into_iter().flatten().find(|entry| {
        entry["shards"].as_array().is_some_and(|shards| shards.iter().any(|held| held.as_i64() == Some(shard.into())))
    });
    holder.and_then(|entry| entry["instance"].as_str()).map(str::to_string).expect("every shard is held")
}

/// Log lines are marked by their cluster, clients by their id, scopes by (cluster, namespace):
/// with several instances, the instance that reads a cluster's new lines is often not the one
/// that analyses the clients they name or the scopes they tell of. Three instances, started
/// one after another (so that the shards split in ranges: checked below, not assumed), each
/// scenario's lines held by another instance than their client or scope: what only the lines
/// tell is in the anomalies (a Pulsar client's logged switches, named or not, found "from the
/// client log"; the observers' "too far behind" lines attached to the untrusted state's
/// evidence), and the simulator's truth is found exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_are_read_by_whichever_instance_analyses_their_clients_and_scopes() {
    use lagscope_store::Mark;
    let directory = tempfile::tempdir().expect("temp dir");
    let mut failing = Vec::new();
    // (scenario, the cluster of its lines, the mark analysed with them, the kind, what only
    // the lines put in its evidence).
    let cases = [
        (
            "pulsar-switch-back-delay-lost",
            "pulsar-east",
            Mark::Client("orders-producer-1".into()),
            "failover_flapping",
            "source",
        ),
        (
            "hdfs-future-state",
            "hdfs-prod",
            Mark::Scope(Some("hdfs-prod".into()), Some("ns1".into())),
            "untrusted_state",
            "log_lines",
        ),
    ];
    for (round, (scenario, line_cluster, analysed, kind, from_lines)) in cases.into_iter().enumerate() {
        let database_url = postgres_support::fresh_database().await;
        let instances = start_in_turn(&database_url, directory.path(), &round.to_string(), &["a", "b", "c"]).await;
        let api = instances[0].api.clone();
        let lines_at = holder_of(&api, Mark::LogCluster(Some(line_cluster.into())).shard()).await;
        let analysed_at = holder_of(&api, analysed.shard()).await;
        assert_ne!(lines_at, analysed_at, "{scenario}: the lines and {analysed:?} must be held apart for this test");
        let sim = SimConfig::new(scenario);
        let (truth, requests) = simulate(sim).await;
        let anomalies = send_and_analyse(&instances, &requests).await;
        let found: Vec<Found> = anomalies.iter().map(found).collect();
        for row in score(&truth, &found) {
            eprintln!(
                "{scenario}: {:<24} expected {:>3} found {:>3} missed {:>2} false {:>2}",
                row.kind, row.expected, row.found, row.missed, row.false_positives
            );
            if row.missed > 0 || row.false_positives > 0 {
                failing.push(format!("{scenario}: {row:?}"));
            }
        }
        let of_kind: Vec<&Value> = anomalies.iter().filter(|anomaly| anomaly["kind"] == kind).collect();
        eprintln!("{scenario}: lines held by {lines_at}, {analysed:?} by {analysed_at}; {kind}: {of_kind:?}");
        if of_kind.is_empty() || of_kind.iter().any(|anomaly| anomaly["evidence"][from_lines].is_null()) {
            failing.push(format!("{scenario}: {kind} without the lines' {from_lines:?}: {of_kind:?}"));
        }
        for instance in instances {
            instance.stop();
        }
    }
    assert!(failing.is_empty(), "every expected anomaly, with what the lines tell, nothing else: {failing:#?}");
}

/// `requests` with, after each of traces, a copy of its spans from `node` as the calls of
/// another client of that process, `client`: to the same cluster URL throughout
/// (`pulsar://pulsar-west`), each answered: a client that never switches.
fn with_a_second_client(requests: Vec<Request>, node: &str, client: &str) -> Vec<Request> {
    use lagscope_model::conventions::{CALL_ID, CLIENT_ID, NODE_ID, OUTCOME};
    use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
    let text = |value: &str| Some(AnyValue { value: Some(any_value::Value::StringValue(value.to_string())) });
    let mut out = Vec::with_capacity(requests.len() * 2);
    for request in requests {
        let Request::Traces(traces) = &request else {
            out.push(request);
            continue;
        };
        let mut copy = traces.clone();
        copy.resource_spans.retain(|resource_spans| {
            resource_spans.resource.as_ref().is_some_and(|resource| {
                resource.attributes.iter().any(|attribute| attribute.key == NODE_ID && attribute.value == text(node))
            })
        });
        for span in copy.resource_spans.iter_mut().flat_map(|r| &mut r.scope_spans).flat_map(|s| &mut s.spans) {
            // Its own trace and span ids, its own calls, no failover events, every call answered.
            span.trace_id[0] ^= 0xff;
            span.span_id[0] ^= 0xff;
            span.events.clear();
            span.status = None;
            span.attributes.retain(|attribute| attribute.key != "error.type");
            for attribute in &mut span.attributes {
                match attribute.key.as_str() {
                    CLIENT_ID => attribute.value = text(client),
                    CALL_ID => {
                        let call = match attribute.value.as_ref().and_then(|value| value.value.as_ref()) {
                            Some(any_value::Value::StringValue(call)) => call.rsplit('-').next().unwrap_or_default(),
                            _ => "",
                        };
                        attribute.value = text(&format!("{client}-{call}"));
                    }
                    "server.address" => attribute.value = text("pulsar-west"),
                    "lagscope.target.node" => attribute.value = text("broker-west-1"),
                    OUTCOME => attribute.value = text("ok"),
                    _ => {}
                }
            }
        }
        out.push(request);
        if !copy.resource_spans.is_empty() {
            out.push(Request::Traces(copy));
        }
    }
    out
}

/// A process's switch lines that name no client are its one client's (`failover_flapping`),
/// and no one's when several clients call cluster URLs from it. With the two clients of one
/// process held by different instances, each instance sees only its own: which clients a
/// process has is kept in the database, and neither instance takes the lines for its
/// client's. The Pulsar scenario's client flaps (found from where its calls went); its
/// neighbour, which never switched, has no flapping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_with_clients_on_two_instances_owns_no_unnamed_switch_lines() {
    use lagscope_store::Mark;
    let directory = tempfile::tempdir().expect("temp dir");
    let database_url = postgres_support::fresh_database().await;
    let instances = start_in_turn(&database_url, directory.path(), "", &["a", "b"]).await;
    let api = instances[0].api.clone();
    let first = "orders-producer-1";
    let first_at = holder_of(&api, Mark::Client(first.into()).shard()).await;
    let mut second = None;
    for n in 2..64 {
        let candidate = format!("orders-producer-{n}");
        if holder_of(&api, Mark::Client(candidate.clone()).shard()).await != first_at {
            second = Some(candidate);
            break;
        }
    }
    let second = second.expect("a client id held by the other instance");
    let (_, requests) = simulate(SimConfig::new("pulsar-switch-back-delay-lost")).await;
    let requests = with_a_second_client(requests, "orders-app-1", &second);
    let anomalies = send_and_analyse(&instances, &requests).await;
    let flapping = |client: &str| -> Vec<&Value> {
        (anomalies.iter())
            .filter(|anomaly| anomaly["kind"] == "failover_flapping" && anomaly["client_id"] == client)
            .collect()
    };
    eprintln!("{first} held by {first_at}, {second} by the other: {:#?}", flapping(first));
    assert!(flapping(&second).is_empty(), "{second} never switched: {:#?}", flapping(&second));
    assert!(!flapping(first).is_empty(), "{first} flaps");
    assert!(
        flapping(first).iter().all(|anomaly| anomaly["evidence"]["source"].is_null()),
        "the process's lines are no one's: {first}'s flapping is found from its calls: {:#?}",
        flapping(first)
    );
    for instance in instances {
        instance.stop();
    }
}
