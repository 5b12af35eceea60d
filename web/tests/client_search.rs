//! The navigation bar's client search: an id that is a client's, or begins only one client's,
//! goes on to its timeline; the beginning of several lists them; anything else says there is no
//! such client and lists the ids that follow it.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use lagscope_model::{CallFields, Component, ResourceFields, Span, SpanKind};
use lagscope_selfmetrics::SelfMetrics;
use lagscope_store::{IngestBatch, SqliteStore, Store};
use lagscope_web::ui::{Dashboards, UiState, router};
use tower::ServiceExt;

const SECOND: i64 = 1_000_000_000;
/// 2026-12-01T00:00:00Z.
const BASE: i64 = 1_796_083_200 * SECOND;

fn client_span(client: &str, index: u8) -> Span {
    Span {
        trace_id: Some(format!("{index:032x}")),
        span_id: Some(format!("{index:016x}")),
        parent_span_id: None,
        name: "getFileInfo".to_string(),
        kind: SpanKind::Client,
        start_unix_nano: BASE + i64::from(index) * SECOND,
        end_unix_nano: BASE + i64::from(index) * SECOND + SECOND / 10,
        status_code: 0,
        status_message: None,
        resource: ResourceFields {
            service_name: Some("hdfs-client".to_string()),
            component: Some(Component::Client),
            ..ResourceFields::default()
        },
        scope_name: None,
        scope_version: None,
        scope_attributes: Default::default(),
        call: CallFields { client_id: Some(client.to_string()), ..CallFields::default() },
        attributes: Default::default(),
        events: Vec::new(),
        links: Vec::new(),
    }
}

/// The status, the redirect's target if any, and the body of a search for `typed`.
async fn search(store: &Arc<dyn Store>, typed: &str) -> (StatusCode, Option<String>, String) {
    let state =
        UiState::new(store.clone(), Arc::new(SelfMetrics::default()), Dashboards::load(None).expect("built-in"), 0);
    let encoded: String = typed.bytes().map(|byte| format!("%{byte:02X}")).collect();
    let response = router(state)
        .oneshot(Request::get(format!("/clients/?id={encoded}")).body(Body::empty()).expect("request"))
        .await
        .expect("answer");
    let status = response.status();
    let location = response.headers().get(header::LOCATION).map(|value| value.to_str().expect("ASCII").to_string());
    let body = response.into_body().collect().await.expect("body").to_bytes();
    (status, location, String::from_utf8(body.to_vec()).expect("UTF-8"))
}

/// The ids the page lists, in order.
fn listed(page: &str) -> Vec<String> {
    let Some(list) = page.split("id=\"client-list\">").nth(1) else { return Vec::new() };
    let list = &list[..list.find("</ul>").expect("the list ends")];
    list.split("\">").skip(1).map(|item| item[..item.find("</a>").expect("a link")].to_string()).collect()
}

#[tokio::test]
async fn the_client_search_goes_to_one_client_lists_several_and_says_when_there_is_none() {
    let directory = tempfile::tempdir().expect("temp dir");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(directory.path()).await.expect("store"));
    let clients = ["app-1", "app-10", "app-2", "batch-7", "<b>x</b>", "<b>y</b>"];
    let spans = clients.iter().enumerate().map(|(index, client)| client_span(client, index as u8 + 1)).collect();
    store.ingest(&IngestBatch { spans, samples: Vec::new(), logs: Vec::new() }).await.expect("ingest");

    // A client's own id, even where others begin with it.
    let (status, location, _) = search(&store, "app-1").await;
    assert_eq!((status, location.as_deref()), (StatusCode::SEE_OTHER, Some("/clients/app-1")));
    // The beginning of one client's id only.
    let (status, location, _) = search(&store, "batch").await;
    assert_eq!((status, location.as_deref()), (StatusCode::SEE_OTHER, Some("/clients/batch-7")));
    // Spaces around what was typed do not count.
    let (_, location, _) = search(&store, " app-2 ").await;
    assert_eq!(location.as_deref(), Some("/clients/app-2"));
    // The beginning of several: listed, in order, linked to their timelines.
    let (status, location, page) = search(&store, "app").await;
    assert_eq!((status, location), (StatusCode::OK, None));
    assert_eq!(listed(&page), ["app-1", "app-10", "app-2"]);
    assert!(page.contains("3 clients whose ids begin with &quot;app&quot;"), "{page}");
    assert!(page.contains("href=\"&#x2f;clients&#x2f;app-10\""), "{page}");
    // No client: the ids that follow in order.
    let (status, _, page) = search(&store, "apq").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(listed(&page), ["batch-7"]);
    assert!(page.contains("no client &quot;apq&quot; and none whose id begins with it"), "{page}");
    let (status, _, page) = search(&store, "zzz").await;
    assert_eq!((status, listed(&page)), (StatusCode::NOT_FOUND, Vec::<String>::new()));
    assert!(page.contains("no client id sorts after it"), "{page}");
    // Ids are telemetry: escaped on the page, encoded in the link.
    let (_, _, page) = search(&store, "<").await;
    assert!(!page.contains("<b>x</b>"), "{page}");
    assert_eq!(listed(&page), ["&lt;b&gt;x&lt;&#x2f;b&gt;", "&lt;b&gt;y&lt;&#x2f;b&gt;"]);
    let (_, location, _) = search(&store, "<b>x").await;
    assert_eq!(location.as_deref(), Some("/clients/%3Cb%3Ex%3C%2Fb%3E"));
    // Nothing typed.
    let (status, _, _) = search(&store, "  ").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}
