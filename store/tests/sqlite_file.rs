//! What only the SQLite backend promises: a real file, WAL mode, data that survives reopening,
//! and attributes queryable with SQLite's JSON functions.

use lagscope_model::{CallFields, Component, ResourceFields, Span, SpanKind};
use lagscope_store::{IngestBatch, SqliteStore, Store, TimeRange};
use sqlx::Connection;

fn span_with_attribute() -> Span {
    Span {
        trace_id: Some(format!("{:032x}", 1)),
        span_id: Some(format!("{:016x}", 1)),
        parent_span_id: None,
        name: "create".to_string(),
        kind: SpanKind::Client,
        start_unix_nano: 1,
        end_unix_nano: 2,
        status_code: 0,
        status_message: None,
        resource: ResourceFields { component: Some(Component::Client), ..ResourceFields::default() },
        scope_name: None,
        scope_version: None,
        scope_attributes: Default::default(),
        call: CallFields { client_id: Some("c1".to_string()), ..CallFields::default() },
        attributes: serde_json::json!({"my.span.attr": "some value"}).as_object().cloned().unwrap_or_default(),
        events: Vec::new(),
        links: Vec::new(),
    }
}

#[tokio::test]
async fn data_survives_reopening_and_attributes_stay_queryable() {
    let directory = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open_dir(directory.path()).await.expect("open");
    store.ingest(&IngestBatch { spans: vec![span_with_attribute()], ..IngestBatch::default() }).await.expect("ingest");
    store.close().await;

    let reopened = SqliteStore::open_dir(directory.path()).await.expect("reopen");
    assert_eq!(reopened.client_spans("c1", TimeRange::ALL, 10).await.expect("read").len(), 1);
    reopened.close().await;

    let path = directory.path().join(lagscope_store::sqlite_database_file());
    let mut connection = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display())).await.expect("raw");
    let (mode,): (String,) = sqlx::query_as("PRAGMA journal_mode").fetch_one(&mut connection).await.expect("pragma");
    assert_eq!(mode, "wal");
    let (value,): (String,) = sqlx::query_as("SELECT json_extract(attributes, '$.\"my.span.attr\"') FROM spans")
        .fetch_one(&mut connection)
        .await
        .expect("json query");
    assert_eq!(value, "some value");
}

#[tokio::test]
async fn an_unwritable_location_is_reported_with_its_path() {
    let directory = tempfile::tempdir().expect("temp dir");
    let file = directory.path().join("not-a-directory");
    std::fs::write(&file, b"x").expect("file");
    let error = SqliteStore::open_dir(&file.join("data")).await.expect_err("must fail");
    assert!(error.to_string().contains("not-a-directory"), "{error}");
}

/// A span of `cluster`/`namespace` starting at `start`, told apart by `id`.
fn scope_span(cluster: Option<&str>, namespace: Option<&str>, id: u32, start: i64) -> Span {
    let mut span = span_with_attribute();
    span.trace_id = Some(format!("{id:032x}"));
    span.span_id = Some(format!("{id:016x}"));
    span.start_unix_nano = start;
    span.end_unix_nano = start + 1;
    span.resource.cluster = cluster.map(str::to_string);
    span.call.namespace = namespace.map(str::to_string);
    span
}

fn starts(spans: &[Span]) -> Vec<i64> {
    spans.iter().map(|span| span.start_unix_nano).collect()
}

/// The feed's reads agree with `scope_spans` as of an id, and what a scope gained since is
/// found by id, whatever its start time (a late span of the past included).
#[tokio::test]
async fn the_span_feed_reads_a_scope_as_of_an_id_and_what_it_gained_since() {
    let directory = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open_dir(directory.path()).await.expect("open");
    let feed = store.span_feed().expect("SQLite offers the span feed");
    assert_eq!(feed.latest_span_id().await.expect("empty"), 0);
    let ingest = |spans: Vec<Span>| {
        let store = &store;
        async move { store.ingest(&IngestBatch { spans, ..IngestBatch::default() }).await.expect("ingest") }
    };
    ingest(vec![
        scope_span(Some("prod"), Some("ns1"), 1, 100),
        scope_span(Some("prod"), Some("ns1"), 2, 300),
        scope_span(Some("prod"), None, 3, 200),
        scope_span(None, Some("ns1"), 4, 250),
        scope_span(Some("prod"), Some("ns2"), 5, 150),
    ])
    .await;
    let first = feed.latest_span_id().await.expect("latest");
    assert!(first > 0);
    let ns1 = feed.scope_spans_through(Some("prod"), Some("ns1"), first, 10).await.expect("through");
    assert_eq!(ns1, store.scope_spans(Some("prod"), Some("ns1"), TimeRange::ALL, 10).await.expect("scope"));
    assert_eq!(starts(&ns1), [100, 300]);
    assert_eq!(starts(&feed.scope_spans_through(Some("prod"), Some("ns1"), first, 1).await.expect("newest")), [300]);
    // Absent parts are scopes of their own.
    assert_eq!(starts(&feed.scope_spans_through(Some("prod"), None, first, 10).await.expect("none")), [200]);

    // Committed later: a span of the past, a new one, a re-sent one (not stored again), and
    // spans of scopes not asked for.
    ingest(vec![
        scope_span(Some("prod"), Some("ns1"), 6, 50),
        scope_span(Some("prod"), Some("ns1"), 7, 400),
        scope_span(Some("prod"), Some("ns1"), 2, 300),
        scope_span(Some("prod"), Some("ns2"), 8, 410),
        scope_span(Some("other"), Some("ns1"), 9, 420),
    ])
    .await;
    let second = feed.latest_span_id().await.expect("latest");
    assert!(second > first);
    // Spans of ids up to `first` only, as a reader at `first` saw.
    assert_eq!(
        starts(&feed.scope_spans_through(Some("prod"), Some("ns1"), first, 10).await.expect("then")),
        [100, 300]
    );
    let scopes = [
        (Some("prod".to_string()), Some("ns1".to_string())),
        (Some("prod".to_string()), None),
        (None, Some("ns1".to_string())),
    ];
    let gained = feed.scope_spans_between(&scopes, first, second, 100).await.expect("between");
    assert_eq!(starts(&gained), [50, 400]);
    assert_eq!(feed.scope_spans_between(&scopes, first, second, 1).await.expect("limit").len(), 1);
    assert!(feed.scope_spans_between(&scopes, second, second, 100).await.expect("nothing").is_empty());
    assert!(feed.scope_spans_between(&[], first, second, 100).await.expect("no scopes").is_empty());
    // Scope text is bound, never spliced.
    let hostile = [(Some("prod' OR '1'='1".to_string()), Some("ns1".to_string()))];
    assert!(feed.scope_spans_between(&hostile, 0, second, 100).await.expect("hostile").is_empty());
}

/// Retention keeps the newest span, however old, so that SQLite never gives its id to a span
/// committed later: the feed would take that span for one it had already read.
#[tokio::test]
async fn retention_keeps_the_newest_span_so_span_ids_never_come_back() {
    let directory = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open_dir(directory.path()).await.expect("open");
    let feed = store.span_feed().expect("feed");
    let batch = |spans| IngestBatch { spans, ..IngestBatch::default() };
    store
        .ingest(&batch(vec![
            scope_span(Some("prod"), Some("ns1"), 1, 100),
            scope_span(Some("prod"), Some("ns1"), 2, 50),
        ]))
        .await
        .expect("ingest");
    let before = feed.latest_span_id().await.expect("latest");
    let everything = lagscope_store::RetentionCutoffs { spans: Some(1_000), ..Default::default() };
    let report = store.enforce_retention(&everything).await.expect("retention");
    assert_eq!(report.spans, 1, "the newest span stays");
    assert_eq!(feed.latest_span_id().await.expect("kept"), before);
    store.ingest(&batch(vec![scope_span(Some("prod"), Some("ns1"), 3, 2_000)])).await.expect("ingest");
    let after = feed.latest_span_id().await.expect("latest");
    assert!(after > before, "a new span takes a new id: {after} after {before}");
    assert_eq!(
        starts(
            &feed
                .scope_spans_between(&[(Some("prod".into()), Some("ns1".into()))], before, after, 10)
                .await
                .expect("gained")
        ),
        [2_000]
    );
    // Once a span follows it, the old one goes.
    assert_eq!(store.enforce_retention(&everything).await.expect("again").spans, 1);
    assert_eq!(starts(&store.scope_spans(Some("prod"), Some("ns1"), TimeRange::ALL, 10).await.expect("left")), [2_000]);
}
