//! The overview page over a store where one kind floods the range: every kind and every
//! cluster of the range is still on the page, and the counts say which are cut.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use lagscope_model::{Anomaly, AnomalyKind, Evidence, MetricKind, PointValue, Sample, SeriesKey, SeriesMeta, Severity};
use lagscope_selfmetrics::SelfMetrics;
use lagscope_store::IngestBatch;
use lagscope_store::{SqliteStore, Store};
use lagscope_web::ui::{Dashboards, UiState, router};
use tower::ServiceExt;

const SECOND: i64 = 1_000_000_000;
/// 2026-12-01T00:00:00Z.
const BASE: i64 = 1_796_083_200 * SECOND;

fn anomaly(kind: AnomalyKind, cluster: &str, start: i64, fingerprint: String) -> Anomaly {
    Anomaly {
        kind,
        severity: if kind == AnomalyKind::StaleRead { Severity::Critical } else { Severity::Warning },
        cluster: Some(cluster.to_string()),
        namespace: Some("ns1".to_string()),
        client_id: Some("client-1".to_string()),
        node_id: Some("nn-obs1".to_string()),
        start_unix_nano: start,
        end_unix_nano: start + 10 * SECOND,
        summary: format!("{} in {cluster}", kind.as_str()),
        cause: "test".to_string(),
        evidence: Evidence::empty(),
        fingerprint,
        open: false,
    }
}

async fn overview(store: Arc<dyn Store>, query: &str) -> String {
    let state = UiState::new(store, Arc::new(SelfMetrics::default()), Dashboards::load(None).expect("built-in"), 0);
    let response = router(state)
        .oneshot(Request::get(format!("/?{query}")).body(Body::empty()).expect("request"))
        .await
        .expect("answer");
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.expect("body").to_bytes();
    String::from_utf8(body.to_vec()).expect("UTF-8")
}

/// The cells of the kinds table's row of `kind`, as text between spaces.
fn kind_row(page: &str, kind: &str) -> Option<String> {
    let table = &page[page.find("id=\"kinds\"")?..];
    let table = &table[..table.find("</table>")?];
    let start = table.find(&format!("<tr><td>{kind}</td>"))?;
    let row = &table[start..];
    Some(text(&row[..row.find("</tr>")?]))
}

/// HTML without its tags, words between single spaces.
fn text(html: &str) -> String {
    let mut text = String::new();
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => {
                in_tag = true;
                text.push(' ');
            }
            '>' => in_tag = false,
            _ if !in_tag => text.push(c),
            _ => {}
        }
    }
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[tokio::test]
async fn a_storm_of_one_kind_leaves_every_other_kind_and_cluster_on_the_overview() {
    let directory = tempfile::tempdir().expect("temp dir");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(directory.path()).await.expect("store"));
    // First an apply lag of another cluster, then 1 500 stale reads after it: the newest
    // thousand anomalies of the range are all stale reads.
    let mut anomalies = vec![anomaly(AnomalyKind::ApplyLag, "ozone-prod", BASE + 5 * SECOND, "lag".to_string())];
    anomalies.extend(
        (0..1_500).map(|n| anomaly(AnomalyKind::StaleRead, "hdfs-prod", BASE + 60 * SECOND + n, format!("read-{n}"))),
    );
    store.upsert_anomalies(&anomalies, BASE).await.expect("stored");
    let range = format!("from={}&to={}", BASE / SECOND, BASE / SECOND + 600);
    let page = overview(store.clone(), &range).await;

    let lag = kind_row(&page, "apply_lag").expect("apply_lag has a row");
    assert_eq!(lag, "apply_lag 0 1 0", "{lag}");
    let reads = kind_row(&page, "stale_read").expect("stale_read has a row");
    assert_eq!(reads, "stale_read 0 1000+ 1000", "{reads}");
    assert!(page.contains("ozone-prod"), "the apply lag's cluster has a card");
    let cards = &page[page.find("aria-label=\"clusters\"").expect("cards")..];
    let cards = text(&cards[..cards.find("</section>").expect("cards end")]);
    assert!(cards.contains("hdfs-prod ok 0 open · 1000+ in range"), "the flooded cluster's count is cut: {cards}");
    assert!(cards.contains("ozone-prod ok 0 open · 1 in range"), "the other cluster's count is exact: {cards}");
    let note = &page[page.find("id=\"kinds-cut\"").expect("the page says what it cut")..];
    let note = &note[..note.find("</p>").expect("note ends")];
    assert!(note.contains("more than 1000 anomalies of stale_read"), "{note}");
    assert!(!note.contains("apply_lag"), "{note}");

    // A range of the apply lag alone: nothing is cut.
    let range = format!("from={}&to={}", BASE / SECOND, BASE / SECOND + 30);
    let page = overview(store, &range).await;
    assert_eq!(kind_row(&page, "apply_lag").as_deref(), Some("apply_lag 0 1 0"));
    assert!(kind_row(&page, "stale_read").is_none(), "no stale read in the first 30 s");
    assert!(!page.contains("kinds-cut"), "nothing cut");
}

fn sample(cluster: &str, time: i64) -> Sample {
    Sample {
        series: SeriesKey {
            name: "lagscope.server.applied_state".to_string(),
            labels: [("lagscope.cluster", cluster), ("lagscope.node.id", "n1")]
                .into_iter()
                .map(|(key, value)| (key.to_string(), value.to_string()))
                .collect(),
        }
        .into(),
        meta: SeriesMeta { kind: MetricKind::Gauge, unit: None, description: None }.into(),
        time_unix_nano: time,
        start_time_unix_nano: None,
        value: PointValue::Number(1.0),
    }
}

#[tokio::test]
async fn a_cluster_with_open_windows_that_stopped_sending_is_called_silent() {
    let directory = tempfile::tempdir().expect("temp dir");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(directory.path()).await.expect("store"));
    // Both clusters have an open window; `ozone-prod` last sent 9 min 50 s before `hdfs-prod`.
    let mut lag = anomaly(AnomalyKind::ApplyLag, "ozone-prod", BASE, "lag".to_string());
    lag.open = true;
    lag.severity = Severity::Critical;
    let mut window = anomaly(AnomalyKind::NoNamenodesWindow, "hdfs-prod", BASE + 500 * SECOND, "window".to_string());
    window.open = true;
    // A third cluster went quiet too, with nothing open: nothing to say about it.
    let resolved = anomaly(AnomalyKind::ApplyLag, "es-prod", BASE, "resolved".to_string());
    store.upsert_anomalies(&[lag, window, resolved], BASE).await.expect("stored");
    let samples = vec![
        sample("ozone-prod", BASE + 10 * SECOND),
        sample("hdfs-prod", BASE + 600 * SECOND),
        sample("es-prod", BASE),
    ];
    store.ingest(&IngestBatch { samples, ..IngestBatch::default() }).await.expect("samples");
    let page = overview(store.clone(), &format!("from={}&to={}", BASE / SECOND, BASE / SECOND + 600)).await;
    let card = |cluster: &str| {
        let start = page.find(&format!("<div class=\"card-title\">{cluster}</div>")).expect("a card");
        let card = &page[start..];
        // Up to the next card, or the end of the cards.
        let end = card[1..]
            .find("<div class=\"card ")
            .map_or_else(|| card.find("</section>").expect("cards end"), |at| at + 1);
        card[..end].to_string()
    };
    assert!(card("ozone-prod").contains("no telemetry for the last 9 min 50 s"), "{}", card("ozone-prod"));
    assert!(!card("hdfs-prod").contains("no telemetry"), "{}", card("hdfs-prod"));
    assert!(!card("es-prod").contains("no telemetry"), "{}", card("es-prod"));
    // Clusters in trouble first: the critical one, then the warning, then the rest.
    let at = |cluster: &str| page.find(&format!("<div class=\"card-title\">{cluster}</div>")).expect("a card");
    assert!(at("ozone-prod") < at("hdfs-prod") && at("hdfs-prod") < at("es-prod"), "cards in order of status");
    // Once it sends again, it is not.
    store
        .ingest(&IngestBatch { samples: vec![sample("ozone-prod", BASE + 590 * SECOND)], ..IngestBatch::default() })
        .await
        .expect("sample");
    let page = overview(store, &format!("from={}&to={}", BASE / SECOND, BASE / SECOND + 600)).await;
    assert!(!page.contains("no telemetry for"), "no cluster is silent now");
}
