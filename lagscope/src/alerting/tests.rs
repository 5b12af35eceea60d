use super::deliver::back_off;
use super::*;

/// A store in a new directory (kept while the directory lives) and alerting that routes
/// everything to one webhook receiver (nothing listens there: the outbox keeps what is
/// sent), with `settings` (TOML lines of `[alerts]`) before the receiver.
async fn hook_alerting(settings: &str) -> (tempfile::TempDir, lagscope_store::SqliteStore, AlertsConfig) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = lagscope_store::SqliteStore::open_dir(dir.path()).await.expect("store");
    let config: AlertsConfig = toml::from_str(&format!(
        "{settings}\n[[receiver]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"http://127.0.0.1:9/\"\n\
         [[route]]\nreceiver = \"hook\"\n"
    ))
    .expect("config");
    (dir, store, config)
}

/// The outbox's messages in the order sent: what `field` reads of each one and its body.
async fn outbox<T>(
    store: &lagscope_store::SqliteStore,
    field: impl Fn(&lagscope_store::AlertMessage, &serde_json::Value) -> T,
) -> Vec<T> {
    let mut messages = store.alert_messages(None, 100).await.expect("outbox");
    messages.reverse();
    messages.iter().map(|message| field(message, &serde_json::from_str(&message.body).expect("json"))).collect()
}

/// A per-read anomaly of its own incident (node), as the analyzer stores it.
fn stale_read(fingerprint: &str, node: &str, start: i64) -> Anomaly {
    Anomaly {
        kind: AnomalyKind::StaleRead,
        severity: lagscope_model::Severity::Critical,
        cluster: Some("prod".to_string()),
        namespace: Some("ns1".to_string()),
        client_id: Some("c1".to_string()),
        node_id: Some(node.to_string()),
        start_unix_nano: start,
        end_unix_nano: start,
        summary: "stale".to_string(),
        cause: "lag".to_string(),
        evidence: serde_json::json!({"floor": 120, "served": 110}).into(),
        open: false,
        fingerprint: fingerprint.to_string(),
    }
}

/// A row committed after the alerter read past its last-seen time (another instance's
/// analyzer, or a slow transaction) is still paged, once; rows already taken are not
/// taken again; a restart re-reads the settle window without sending anything twice.
#[tokio::test]
async fn a_change_committed_late_behind_the_cursor_is_paged_once() {
    const SECOND: i64 = 1_000_000_000;
    let (_dir, store, config) = hook_alerting("").await;
    let now = 1_767_225_600 * SECOND;
    let triggers = |messages: &[lagscope_store::AlertMessage]| -> Vec<String> {
        let mut nodes: Vec<String> = messages
            .iter()
            .filter(|message| message.event == "trigger")
            .map(|message| serde_json::from_str::<serde_json::Value>(&message.body).expect("json"))
            .map(|body| body["commonLabels"]["node"].as_str().unwrap_or_default().to_string())
            .collect();
        nodes.sort();
        nodes
    };
    let mut alerter = Alerter::load(&store, config.clone()).await.expect("load");
    store.upsert_anomalies(&[stale_read("a", "nn-1", now)], now).await.expect("a");
    alerter.pass(&store, now).await.expect("pass 1");
    // Committed now, but seen 5 s earlier than the row the cursor stands on.
    store.upsert_anomalies(&[stale_read("b", "nn-2", now)], now - 5 * SECOND).await.expect("late b");
    alerter.pass(&store, now + SECOND).await.expect("pass 2");
    alerter.pass(&store, now + 2 * SECOND).await.expect("pass 3");
    let messages = store.pending_alert_messages(100).await.expect("outbox");
    assert_eq!(triggers(&messages), ["nn-1", "nn-2"], "{messages:?}");
    // A restart reads the window again: nothing new goes out.
    let mut restarted = Alerter::load(&store, config).await.expect("reload");
    restarted.pass(&store, now + 3 * SECOND).await.expect("pass after restart");
    let messages = store.pending_alert_messages(100).await.expect("outbox");
    assert_eq!(triggers(&messages), ["nn-1", "nn-2"], "{messages:?}");
    // Beyond the settle window a row that late is behind what the alerter reads.
    store.upsert_anomalies(&[stale_read("c", "nn-3", now)], now - 2 * FEED_SETTLE).await.expect("too late c");
    restarted.pass(&store, now + 4 * SECOND).await.expect("pass 5");
    assert_eq!(triggers(&store.pending_alert_messages(100).await.expect("outbox")), ["nn-1", "nn-2"]);
}

/// A router's NoNamenodesAvailable window, open or closed at `end`.
fn window(start: i64, end: i64, open: bool) -> Anomaly {
    Anomaly {
        kind: AnomalyKind::NoNamenodesWindow,
        severity: lagscope_model::Severity::Critical,
        cluster: Some("prod".to_string()),
        namespace: Some("ns1".to_string()),
        client_id: None,
        node_id: Some("router-1".to_string()),
        start_unix_nano: start,
        end_unix_nano: end,
        summary: "router-1 answered NoNamenodesAvailable".to_string(),
        cause: "stale membership cache".to_string(),
        evidence: serde_json::json!({"attempts": 3}).into(),
        open,
        fingerprint: format!("no_namenodes_window|prod|ns1|router-1|{start}"),
    }
}

/// A window the analyzer closes and opens again (one source's telemetry ran ahead of the
/// rest) pages once: it resolves only after staying closed for `window_resolve_after`,
/// across a restart, with the end it was last seen with; one that opens again after it
/// resolved pages again.
#[tokio::test]
async fn a_window_closed_and_opened_again_pages_once_and_resolves_after_staying_closed() {
    const SECOND: i64 = 1_000_000_000;
    let (_dir, store, config) = hook_alerting("window_resolve_after = \"30s\"").await;
    let now = 1_767_225_600 * SECOND;
    let start = now - 60 * SECOND;
    let events = async || -> Vec<(String, Option<String>)> {
        outbox(&store, |message, body| {
            let ends = body["alerts"][0]["endsAt"].as_str().filter(|at| !at.starts_with("0001"));
            (message.event.clone(), ends.map(str::to_string))
        })
        .await
    };
    let trigger = ("trigger".to_string(), None);
    let mut alerter = Alerter::load(&store, config.clone()).await.expect("load");
    let at = |offset: i64, anomaly: Anomaly| {
        let store = &store;
        async move { store.upsert_anomalies(&[anomaly], now + offset * SECOND).await.expect("upsert") }
    };
    at(0, window(start, now - 20 * SECOND, true)).await;
    alerter.pass(&store, now).await.expect("pass");
    assert_eq!(events().await, std::slice::from_ref(&trigger));
    // Closed, then open again as the late spans arrive, then closed for good.
    at(1, window(start, now - 19 * SECOND, false)).await;
    alerter.pass(&store, now + SECOND).await.expect("pass");
    at(2, window(start, now - 10 * SECOND, true)).await;
    alerter.pass(&store, now + 2 * SECOND).await.expect("pass");
    at(3, window(start, now - 5 * SECOND, false)).await;
    alerter.pass(&store, now + 3 * SECOND).await.expect("pass");
    // Stored again, unchanged, by later passes: the window has been closed since 3 s.
    at(20, window(start, now - 5 * SECOND, false)).await;
    alerter.pass(&store, now + 20 * SECOND).await.expect("pass");
    alerter.pass(&store, now + 32 * SECOND).await.expect("pass");
    assert_eq!(
        events().await,
        std::slice::from_ref(&trigger),
        "nothing but the trigger while the window may open again"
    );
    // A restart keeps the closing state; 30 s after it closed, it resolves at its end.
    let mut alerter = Alerter::load(&store, config.clone()).await.expect("reload");
    alerter.pass(&store, now + 33 * SECOND).await.expect("pass");
    let resolved = ("resolve".to_string(), Some(lagscope_alerts::rfc3339(now - 5 * SECOND)));
    assert_eq!(events().await, [trigger.clone(), resolved.clone()]);
    alerter.pass(&store, now + 40 * SECOND).await.expect("pass");
    assert_eq!(events().await, [trigger.clone(), resolved.clone()], "resolved once");
    // Open again after it resolved: the condition is back, and pages again.
    at(50, window(start, now + 45 * SECOND, true)).await;
    alerter.pass(&store, now + 50 * SECOND).await.expect("pass");
    assert_eq!(events().await, [trigger.clone(), resolved, trigger]);
}

/// A window paged from part of its telemetry and then found whole, starting earlier (the
/// store replaces the partial row, `superseded_by`): the partial's incident resolves as a
/// closed window does and the whole one pages. A partial replaced before the alerter saw
/// it pages nothing.
#[tokio::test]
async fn a_window_replaced_by_its_whole_resolves_and_one_replaced_unseen_pages_nothing() {
    const SECOND: i64 = 1_000_000_000;
    let (_dir, store, config) = hook_alerting("window_resolve_after = \"30s\"").await;
    let now = 1_767_225_600 * SECOND;
    let events = async || -> Vec<(String, String)> {
        outbox(&store, |message, body| {
            (message.event.clone(), body["alerts"][0]["startsAt"].as_str().unwrap_or_default().to_string())
        })
        .await
    };
    let starts = |at: i64| lagscope_alerts::rfc3339(at);
    let mut alerter = Alerter::load(&store, config.clone()).await.expect("load");
    let partial = now - 50 * SECOND;
    store.upsert_anomalies(&[window(partial, now, true)], now).await.expect("partial");
    alerter.pass(&store, now).await.expect("pass");
    assert_eq!(events().await, [("trigger".to_string(), starts(partial))]);
    let whole = now - 60 * SECOND;
    let outcome = store.upsert_anomalies(&[window(whole, now + SECOND, true)], now + SECOND).await.expect("whole");
    assert_eq!(outcome.superseded, 1);
    alerter.pass(&store, now + SECOND).await.expect("pass");
    alerter.pass(&store, now + 40 * SECOND).await.expect("pass");
    let expected = [
        ("trigger".to_string(), starts(partial)),
        ("trigger".to_string(), starts(whole)),
        ("resolve".to_string(), starts(partial)),
    ];
    assert_eq!(events().await, expected);
    // A partial of a later window, stored after its whole and replaced at once: nothing.
    let later = now + 100 * SECOND;
    store.upsert_anomalies(&[window(later, later + 20 * SECOND, true)], now + 41 * SECOND).await.expect("w");
    alerter.pass(&store, now + 41 * SECOND).await.expect("pass");
    let again = window(later + 5 * SECOND, later + 10 * SECOND, true);
    let outcome = store.upsert_anomalies(&[again], now + 42 * SECOND).await.expect("partial again");
    assert_eq!((outcome.inserted.len(), outcome.superseded), (0, 1));
    alerter.pass(&store, now + 42 * SECOND).await.expect("pass");
    alerter.pass(&store, now + 80 * SECOND).await.expect("pass");
    let paged = events().await;
    assert_eq!(paged.len(), 4, "{paged:?}");
    assert_eq!(paged[3], ("trigger".to_string(), starts(later)));
}

/// Per-read anomalies of one node group into one incident while they keep coming; it
/// resolves once none has come for `resolve_after` (wall clock, as the alerter sees the
/// changes); the same anomaly stored again does not page, a new one after the resolve
/// opens the node's next incident, under the same dedup key.
#[tokio::test]
async fn per_read_anomalies_of_a_node_page_once_until_quiet_then_again() {
    const SECOND: i64 = 1_000_000_000;
    let (_dir, store, config) = hook_alerting("resolve_after = \"2s\"").await;
    let now = 1_767_225_600 * SECOND;
    let events = async || -> Vec<(String, String, String)> {
        outbox(&store, |message, body| {
            let node = body["commonLabels"]["node"].as_str().unwrap_or_default().to_string();
            (message.event.clone(), node, message.dedup_key.clone())
        })
        .await
    };
    let mut alerter = Alerter::load(&store, config).await.expect("load");
    let at = async |offset_ms: i64, anomalies: &[Anomaly], alerter: &mut Alerter| {
        let when = now + offset_ms * SECOND / 1_000;
        if !anomalies.is_empty() {
            store.upsert_anomalies(anomalies, when).await.expect("upsert");
        }
        alerter.pass(&store, when).await.expect("pass");
    };
    at(0, &[stale_read("a", "nn-1", now)], &mut alerter).await;
    at(1_500, &[stale_read("b", "nn-1", now), stale_read("c", "nn-2", now)], &mut alerter).await;
    at(3_000, &[stale_read("d", "nn-1", now)], &mut alerter).await;
    // nn-2 has been quiet for 3.4 s, nn-1 for 1.9 s only.
    at(4_900, &[], &mut alerter).await;
    let kinds = |events: &[(String, String, String)]| -> Vec<(String, String)> {
        events.iter().map(|(event, node, _)| (event.clone(), node.clone())).collect()
    };
    let pair = |event: &str, node: &str| (event.to_string(), node.to_string());
    assert_eq!(
        kinds(&events().await),
        [pair("trigger", "nn-1"), pair("trigger", "nn-2"), pair("resolve", "nn-2")],
        "one incident per node, nn-2 resolved after 2 s without a new anomaly"
    );
    at(5_000, &[], &mut alerter).await;
    // Stored again by a later analyzer pass, unchanged: nothing pages.
    at(6_000, &[stale_read("a", "nn-1", now), stale_read("c", "nn-2", now)], &mut alerter).await;
    // A new stale read served by nn-1: its next incident.
    at(7_000, &[stale_read("e", "nn-1", now + 7 * SECOND)], &mut alerter).await;
    at(9_000, &[], &mut alerter).await;
    let all = events().await;
    assert_eq!(
        kinds(&all),
        [
            pair("trigger", "nn-1"),
            pair("trigger", "nn-2"),
            pair("resolve", "nn-2"),
            pair("resolve", "nn-1"),
            pair("trigger", "nn-1"),
            pair("resolve", "nn-1"),
        ]
    );
    let keys_of = |node: &str| -> HashSet<&String> {
        all.iter().filter(|(_, of, _)| of == node).map(|(_, _, key)| key).collect()
    };
    assert_eq!(keys_of("nn-1").len(), 1, "one dedup key per node's incidents");
    assert_ne!(keys_of("nn-1"), keys_of("nn-2"));
}

#[test]
fn back_off_doubles_with_jitter_caps_and_honours_retry_after() {
    let (first, longest) = (Duration::from_secs(1), Duration::from_secs(300));
    let waits: Vec<Duration> = (0..12).map(|attempt| back_off(7, attempt, None, first, longest)).collect();
    assert!(waits[0] >= Duration::from_millis(500) && waits[0] <= Duration::from_millis(1_500), "{waits:?}");
    assert!(waits[3] >= Duration::from_secs(4) && waits[3] <= Duration::from_secs(12), "{waits:?}");
    assert!(waits.iter().all(|wait| *wait <= longest.mul_f64(1.5)), "{waits:?}");
    assert!(waits[11] >= longest / 2, "{waits:?}");
    assert_ne!(back_off(7, 2, None, first, longest), back_off(8, 2, None, first, longest), "messages spread out");
    assert!(back_off(7, 0, Some(Duration::from_secs(30)), first, longest) >= Duration::from_secs(30));
}

#[test]
fn receivers_and_routes_parse_from_toml_and_are_checked() {
    let text = r#"
        external_url = "http://lagscope:8080"
        [[receiver]]
        name = "am"
        kind = "alertmanager"
        url = "http://127.0.0.1:9093"
        [[receiver]]
        name = "pd"
        kind = "pagerduty"
        routing_key = "R0UT1NG"
        [[route]]
        receiver = "am"
        [[route]]
        receiver = "pd"
        kinds = ["stale_read"]
        severities = ["critical"]
    "#;
    let config: AlertsConfig = toml::from_str(text).expect("parses");
    config.validate().expect("valid");
    assert!(config.is_enabled());
    assert!(matches!(&config.receivers[1].kind, ReceiverKind::Pagerduty { url, .. } if url.contains("pagerduty.com")));
    let mut bad = config.clone();
    bad.routes[1].receiver = "ops".to_string();
    assert!(bad.validate().expect_err("unknown receiver").contains("\"ops\""));
    let mut bad = config.clone();
    bad.routes[1].kinds = vec!["stale_reads".to_string()];
    assert!(bad.validate().expect_err("unknown kind").contains("stale_reads"));
    let mut bad = config;
    bad.resolve_after = "soon".to_string();
    assert!(bad.validate().expect_err("bad duration").contains("alerts.resolve_after"));
    let unknown = "[[receiver]]\nname = \"x\"\nkind = \"email\"\nurl = \"http://x\"\n";
    assert!(toml::from_str::<AlertsConfig>(unknown).is_err());
}
