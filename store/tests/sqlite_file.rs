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
