//! Span rows: written column by column, read back into domain spans.

use lagscope_model::{Op, Outcome, Span};
use sqlx::{Sqlite, SqlitePool, Transaction};

use super::insert_rows;
use crate::rows::{SpanRow, to_json_text};
use crate::{Result, TimeRange};

const INSERT_HEAD: &str = "INSERT INTO spans (
    trace_id, span_id, parent_span_id, name, kind, start_unix_nano, end_unix_nano,
    status_code, status_message, service_name, system, cluster, component, node_id,
    resource_attributes, scope_name, scope_version, scope_attributes, client_id, call_id,
    attempt, namespace, op, rpc_method, target_node, target_role, node_role, consistency,
    follower_read, state_carried, state_returned, state_served, state_committed, state_router,
    outcome, error_type, requeues, retry_delay_ms, bytes, attributes, events, links
) ";

const CONFLICT: &str =
    " ON CONFLICT (trace_id, span_id, start_unix_nano) WHERE trace_id IS NOT NULL AND span_id IS NOT NULL DO NOTHING";

/// Inserts spans; returns how many were new.
pub(super) async fn insert(transaction: &mut Transaction<'_, Sqlite>, spans: &[Span]) -> Result<u64> {
    insert_rows(transaction, INSERT_HEAD, CONFLICT, spans, |mut row, span| {
        let resource = &span.resource;
        let call = &span.call;
        row.push_bind(&span.trace_id)
            .push_bind(&span.span_id)
            .push_bind(&span.parent_span_id)
            .push_bind(&span.name)
            .push_bind(span.kind.to_otlp())
            .push_bind(span.start_unix_nano)
            .push_bind(span.end_unix_nano)
            .push_bind(span.status_code)
            .push_bind(&span.status_message)
            .push_bind(&resource.service_name)
            .push_bind(&resource.system)
            .push_bind(&resource.cluster)
            .push_bind(resource.component.as_ref().map(lagscope_model::Component::as_str))
            .push_bind(&resource.node_id)
            .push_bind(to_json_text(&resource.attributes))
            .push_bind(&span.scope_name)
            .push_bind(&span.scope_version)
            .push_bind(to_json_text(&span.scope_attributes))
            .push_bind(&call.client_id)
            .push_bind(&call.call_id)
            .push_bind(call.attempt)
            .push_bind(&call.namespace)
            .push_bind(call.op.as_ref().map(Op::as_str))
            .push_bind(&call.rpc_method)
            .push_bind(&call.target_node)
            .push_bind(&call.target_role)
            .push_bind(&call.node_role)
            .push_bind(&call.consistency)
            .push_bind(call.follower_read)
            .push_bind(call.state.carried)
            .push_bind(call.state.returned)
            .push_bind(call.state.served)
            .push_bind(call.state.committed)
            .push_bind(call.state.router)
            .push_bind(call.outcome.as_ref().map(Outcome::as_str))
            .push_bind(&call.error_type)
            .push_bind(call.requeues)
            .push_bind(call.retry_delay_ms)
            .push_bind(call.bytes)
            .push_bind(to_json_text(&span.attributes))
            .push_bind(to_json_text(&span.events))
            .push_bind(to_json_text(&span.links));
    })
    .await
}

/// The spans of a `spans` subquery as one JSON text, with their ids: `[[id, span], ...]`, each
/// span an array in [`SpanRow`]'s field order (the resource columns nested). sqlx's SQLite
/// driver copies every column of every row it returns, which for a page's two thousand spans of
/// 42 columns took most of the page's time; SQLite writes the same rows as JSON in a fraction.
/// Spans hold no floating-point column, so nothing is rounded on the way. The rows come in the
/// order the ids were picked (most picks are in start order) and are put in start order after
/// parsing where they are not ([`in_start_order`]): ordered inside the aggregate, SQLite built
/// a temporary B-tree of every row's text (spilled to disk past its cache), which took about as
/// long as the read itself.
const SPAN_JSON_ARRAY_WITH_IDS: &str = concat!("json_group_array(json_array(spans.id, ", span_json_row!(), "))");

/// One span row as a JSON array, in [`SpanRow`]'s field order.
macro_rules! span_json_row {
    () => {
        "json_array(
    trace_id, span_id, parent_span_id, name, kind, start_unix_nano, end_unix_nano,
    status_code, status_message,
    json_array(service_name, system, cluster, component, node_id, resource_attributes),
    scope_name, scope_version, scope_attributes, client_id, call_id, attempt, namespace, op,
    rpc_method, target_node, target_role, node_role, consistency,
    json(CASE WHEN follower_read IS NULL THEN 'null' WHEN follower_read THEN 'true' ELSE 'false' END),
    state_carried, state_returned, state_served, state_committed, state_router,
    outcome, error_type, requeues, retry_delay_ms, bytes, attributes, events, links
)"
    };
}
use span_json_row;

/// SQLite's result code for a string or blob longer than its length limit (1 GB).
const SQLITE_TOOBIG: &str = "18";

/// A value bound to a span read's statement.
#[derive(Clone, Copy)]
enum Bind<'a> {
    Text(Option<&'a str>),
    Int(i64),
}

fn bind_all<'q, O>(
    mut query: sqlx::query::QueryAs<'q, Sqlite, O, sqlx::sqlite::SqliteArguments>,
    binds: &[Bind<'_>],
) -> sqlx::query::QueryAs<'q, Sqlite, O, sqlx::sqlite::SqliteArguments> {
    for bind in binds {
        query = match *bind {
            Bind::Text(text) => query.bind(text.map(str::to_string)),
            Bind::Int(number) => query.bind(number),
        };
    }
    query
}

/// The spans whose ids the common table expressions `ctes` pick (the last of them named
/// `picked(id)`), oldest first: as one JSON text ([`SPAN_JSON_ARRAY_WITH_IDS`]), or row by row
/// when that text would pass SQLite's length limit (a few enormous spans, which telemetry may
/// hold).
async fn spans_picked(pool: &SqlitePool, ctes: &str, binds: &[Bind<'_>]) -> Result<Vec<Span>> {
    Ok(spans_picked_with_ids(pool, ctes, binds).await?.into_iter().map(|(_, span)| span).collect())
}

/// [`spans_picked`] with each span's id (what the span feed's readers keep spans by).
async fn spans_picked_with_ids(pool: &SqlitePool, ctes: &str, binds: &[Bind<'_>]) -> Result<Vec<(i64, Span)>> {
    match spans_picked_json(pool, ctes, binds).await? {
        Some(rows) => Ok(rows),
        None => spans_picked_with_ids_by_row(pool, ctes, binds).await,
    }
}

/// The picked spans with their ids, read as one JSON text, in start order; `None` when the
/// text would pass SQLite's length limit.
async fn spans_picked_json(pool: &SqlitePool, ctes: &str, binds: &[Bind<'_>]) -> Result<Option<Vec<(i64, Span)>>> {
    // The picked ids are distinct (every pick reads them from `spans`, or unites such reads),
    // and scanned first (CROSS JOIN keeps that order of the loops), each row then found by id.
    let sql = format!(
        "WITH {ctes} SELECT {SPAN_JSON_ARRAY_WITH_IDS} AS spans FROM picked CROSS JOIN spans ON spans.id = picked.id"
    );
    // `ctes` and the column list are this module's text: nothing of the caller reaches it.
    match bind_all(sqlx::query_as::<_, (String,)>(sqlx::AssertSqlSafe(sql)), binds).fetch_one(pool).await {
        Ok((text,)) => Ok(Some(in_start_order(parse_rows(&text)?))),
        Err(sqlx::Error::Database(error)) if error.code().as_deref() == Some(SQLITE_TOOBIG) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// What a JSON array of `[id, span row]`s reads as: each row made a span as it is parsed (half
/// a million rows were held whole beside the spans made of them, about 1 KB each).
struct Parsed(Vec<(i64, Span)>);

impl<'de> serde::Deserialize<'de> for Parsed {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct Rows;
        impl<'de> serde::de::Visitor<'de> for Rows {
            type Value = Parsed;

            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("an array of span rows with their ids")
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut rows: A) -> std::result::Result<Parsed, A::Error> {
                let mut items = Vec::with_capacity(rows.size_hint().unwrap_or(0));
                while let Some((id, row)) = rows.next_element::<(i64, SpanRow)>()? {
                    items.push((id, row.into_span().map_err(serde::de::Error::custom)?));
                }
                Ok(Parsed(items))
            }
        }
        deserializer.deserialize_seq(Rows)
    }
}

/// The rows of a JSON span read's text, as spans with their ids.
fn parse_rows(text: &str) -> Result<Vec<(i64, Span)>> {
    let Parsed(items) = serde_json::from_str(text).map_err(|error| crate::StoreError::Corrupt {
        what: "spans",
        detail: format!("reading spans as JSON: {error}"),
    })?;
    Ok(items)
}

/// `rows` by start, then id: the order of every span read. Rows picked in that order, or in
/// its reverse (the newest first), are not moved, or only swapped; the rest are moved once each.
fn in_start_order(mut rows: Vec<(i64, Span)>) -> Vec<(i64, Span)> {
    let key = |(id, span): &(i64, Span)| (span.start_unix_nano, *id);
    if rows.is_sorted_by_key(key) {
        return rows;
    }
    if rows.is_sorted_by_key(|row| std::cmp::Reverse(key(row))) {
        rows.reverse();
        return rows;
    }
    let mut order: Vec<(i64, i64, usize)> =
        rows.iter().enumerate().map(|(index, (id, span))| (span.start_unix_nano, *id, index)).collect();
    order.sort_unstable();
    let mut slots: Vec<Option<(i64, Span)>> = rows.into_iter().map(Some).collect();
    order.into_iter().map(|(_, _, index)| slots[index].take().expect("each row once")).collect()
}

/// [`spans_picked_with_ids`] one sqlx row per span.
async fn spans_picked_with_ids_by_row(pool: &SqlitePool, ctes: &str, binds: &[Bind<'_>]) -> Result<Vec<(i64, Span)>> {
    let sql = format!(
        "WITH {ctes} SELECT id AS row_id, * FROM spans WHERE id IN (SELECT id FROM picked) ORDER BY start_unix_nano, id"
    );
    let rows: Vec<IdSpanRow> = bind_all(sqlx::query_as(sqlx::AssertSqlSafe(sql)), binds).fetch_all(pool).await?;
    rows.into_iter().map(|row| Ok((row.row_id, row.span.into_span()?))).collect()
}

/// A span row with its id.
#[derive(sqlx::FromRow)]
struct IdSpanRow {
    row_id: i64,
    #[sqlx(flatten)]
    span: SpanRow,
}

/// Picks a client's spans in ?2..?3 (the most recent ?4), then every span of their traces: ids
/// first (the traces' from the covering trace index), then each row once (a union of whole
/// rows had SQLite sort and compare every column of every span). Only spans with ids up to ?6
/// (`+id`: the bound is checked on the index entries, which hold the id, and never makes the
/// rowid range the plan, which would scan every older span).
const CLIENT_PICK: &str = "own AS (
        SELECT id, trace_id, start_unix_nano, end_unix_nano FROM spans
        WHERE client_id = ?1 AND start_unix_nano >= ?2 AND start_unix_nano < ?3 AND +id <= ?6
        ORDER BY start_unix_nano DESC LIMIT ?4
    ),
    traces AS (
        SELECT trace_id, min(start_unix_nano) - ?5 AS earliest, max(end_unix_nano) + ?5 AS latest
        FROM own WHERE trace_id IS NOT NULL GROUP BY trace_id
    ),
    picked AS (
        SELECT id FROM own
        UNION
        SELECT spans.id FROM traces JOIN spans ON spans.trace_id = traces.trace_id
        WHERE spans.span_id IS NOT NULL AND +spans.id <= ?6
          AND spans.start_unix_nano >= traces.earliest AND spans.start_unix_nano <= traces.latest
    )";

/// The client's spans in the range (the most recent `limit`), plus every span of their traces.
pub(super) async fn for_client(pool: &SqlitePool, client_id: &str, range: TimeRange, limit: u32) -> Result<Vec<Span>> {
    spans_picked(pool, CLIENT_PICK, &client_binds(client_id, range, limit, i64::MAX)).await
}

/// [`CLIENT_PICK`]'s values.
fn client_binds(client_id: &str, range: TimeRange, limit: u32, through: i64) -> [Bind<'_>; 6] {
    [
        Bind::Text(Some(client_id)),
        Bind::Int(range.from),
        Bind::Int(range.to),
        Bind::Int(i64::from(limit)),
        Bind::Int(crate::TRACE_WINDOW_NANOS),
        Bind::Int(through),
    ]
}

pub(super) async fn clients_of_traces(pool: &SqlitePool, trace_ids: &[String]) -> Result<Vec<String>> {
    if trace_ids.is_empty() {
        return Ok(Vec::new());
    }
    let clients: Vec<(String,)> = sqlx::query_as(
        "SELECT DISTINCT client_id FROM spans
         WHERE trace_id IN (SELECT value FROM json_each(?1))
           AND trace_id IS NOT NULL AND span_id IS NOT NULL AND client_id IS NOT NULL",
    )
    .bind(to_json_text(&trace_ids))
    .fetch_all(pool)
    .await?;
    Ok(clients.into_iter().map(|(client,)| client).collect())
}

/// The newest `limit` spans of a scope whose start lies in `range`, among those with ids up to
/// `through` (`i64::MAX`: all).
pub(super) async fn for_scope(
    pool: &SqlitePool,
    cluster: Option<&str>,
    namespace: Option<&str>,
    range: TimeRange,
    limit: u32,
    through: i64,
) -> Result<Vec<Span>> {
    // The live analyzer's scope passes read tens of thousands of spans.
    let binds = [
        Bind::Text(cluster),
        Bind::Text(namespace),
        Bind::Int(range.from),
        Bind::Int(range.to),
        Bind::Int(i64::from(limit)),
        Bind::Int(through),
    ];
    spans_picked(pool, SCOPE_PICK, &binds).await
}

/// Picks the newest ?5 spans of cluster ?1 and namespace ?2 (either may be NULL) in ?3..?4,
/// with ids up to ?6 (`+id`, as in [`CLIENT_PICK`]).
const SCOPE_PICK: &str = "picked AS (
        SELECT id FROM spans
        WHERE cluster IS ?1 AND namespace IS ?2 AND start_unix_nano >= ?3 AND start_unix_nano < ?4
          AND +id <= ?6
        ORDER BY start_unix_nano DESC LIMIT ?5
    )";

/// The newest span's id, 0 for none (the rowid's maximum: one seek).
pub(super) async fn latest_id(pool: &SqlitePool) -> Result<i64> {
    let (latest,): (i64,) = sqlx::query_as("SELECT ifnull(max(id), 0) FROM spans").fetch_one(pool).await?;
    Ok(latest)
}

/// The spans of `scopes` with ids in `after..=through`, at most `limit` (the oldest ids).
pub(super) async fn of_scopes_between(
    pool: &SqlitePool,
    scopes: &[(Option<String>, Option<String>)],
    after: i64,
    through: i64,
    limit: u32,
) -> Result<Vec<Span>> {
    if scopes.is_empty() || after >= through {
        return Ok(Vec::new());
    }
    let scopes = to_json_text(&scopes);
    let binds = [Bind::Int(after), Bind::Int(through), Bind::Text(Some(&scopes)), Bind::Int(i64::from(limit))];
    spans_picked(pool, BETWEEN_PICK, &binds).await
}

/// Picks the spans with ids in ?1 exclusive to ?2 inclusive (a rowid range) of the scopes in ?3,
/// a JSON array of [cluster, namespace] pairs (either may be null), the lowest ?4 ids.
const BETWEEN_PICK: &str = "scopes AS (
        SELECT json_extract(value, '$[0]') AS cluster, json_extract(value, '$[1]') AS namespace
        FROM json_each(?3)
    ),
    picked AS (
        SELECT id FROM spans
        WHERE id > ?1 AND id <= ?2
          AND EXISTS (
              SELECT 1 FROM scopes WHERE scopes.cluster IS spans.cluster AND scopes.namespace IS spans.namespace
          )
        ORDER BY id LIMIT ?4
    )";

/// Every span with an id in `after..=through`, the lowest `limit` ids, with their ids.
pub(super) async fn between(pool: &SqlitePool, after: i64, through: i64, limit: u32) -> Result<Vec<(i64, Span)>> {
    if after >= through {
        return Ok(Vec::new());
    }
    let binds = [Bind::Int(after), Bind::Int(through), Bind::Int(i64::from(limit))];
    spans_picked_with_ids(
        pool,
        "picked AS (SELECT id FROM spans WHERE id > ?1 AND id <= ?2 ORDER BY id LIMIT ?3)",
        &binds,
    )
    .await
}

/// [`for_client`] over all time among the spans with ids up to `through`, with their ids.
pub(super) async fn for_client_through(
    pool: &SqlitePool,
    client_id: &str,
    through: i64,
    limit: u32,
) -> Result<Vec<(i64, Span)>> {
    spans_picked_with_ids(pool, CLIENT_PICK, &client_binds(client_id, TimeRange::ALL, limit, through)).await
}

/// Every span with a span id of the given traces, with an id up to `through`, with their ids
/// (from the trace index, which holds the spans with both ids).
pub(super) async fn of_traces_through(pool: &SqlitePool, trace_ids: &[&str], through: i64) -> Result<Vec<(i64, Span)>> {
    if trace_ids.is_empty() {
        return Ok(Vec::new());
    }
    let traces = to_json_text(&trace_ids);
    let binds = [Bind::Text(Some(&traces)), Bind::Int(through)];
    spans_picked_with_ids(
        pool,
        "picked AS (
            SELECT id FROM spans
            WHERE trace_id IN (SELECT value FROM json_each(?1))
              AND trace_id IS NOT NULL AND span_id IS NOT NULL AND +id <= ?2
        )",
        &binds,
    )
    .await
}

/// Spans in `cluster`/`namespace` (`None` = any) whose start lies in `range`, oldest first,
/// at most `limit`: their ids picked, then the rows read as one JSON text ([`spans_picked`];
/// row by row through sqlx, half a million spans took 13-15 s).
pub(super) async fn in_range(
    pool: &SqlitePool,
    cluster: Option<&str>,
    namespace: Option<&str>,
    range: TimeRange,
    limit: u32,
) -> Result<Vec<Span>> {
    let binds = [
        Bind::Text(cluster),
        Bind::Text(namespace),
        Bind::Int(range.from),
        Bind::Int(range.to),
        Bind::Int(i64::from(limit)),
    ];
    spans_picked(
        pool,
        "picked AS (
            SELECT id FROM spans
            WHERE (?1 IS NULL OR cluster = ?1) AND (?2 IS NULL OR namespace = ?2)
              AND start_unix_nano >= ?3 AND start_unix_nano < ?4
            ORDER BY start_unix_nano, id LIMIT ?5
        )",
        &binds,
    )
    .await
}

#[cfg(test)]
mod tests {
    use lagscope_model::{CallFields, ResourceFields, SpanKind};

    use super::*;
    use crate::{IngestBatch, Store};

    /// [`spans_picked`] one sqlx row per span.
    async fn spans_picked_by_row(pool: &SqlitePool, ctes: &str, binds: &[Bind<'_>]) -> Result<Vec<Span>> {
        Ok(spans_picked_with_ids_by_row(pool, ctes, binds).await?.into_iter().map(|(_, span)| span).collect())
    }

    fn span(trace: u8, id: u8, client: Option<&str>, start: i64, follower_read: Option<bool>) -> Span {
        Span {
            trace_id: Some(format!("{trace:032x}")),
            span_id: Some(format!("{id:016x}")),
            parent_span_id: None,
            name: "getFileInfo \"quoted\" <b>".to_string(),
            kind: SpanKind::Server,
            start_unix_nano: start,
            end_unix_nano: start + 5,
            status_code: 2,
            status_message: Some("line\nbreak \u{1} é".to_string()),
            resource: ResourceFields {
                service_name: Some("nn".to_string()),
                cluster: Some("prod".to_string()),
                ..ResourceFields::default()
            },
            scope_name: None,
            scope_version: None,
            scope_attributes: Default::default(),
            call: CallFields {
                client_id: client.map(str::to_string),
                namespace: Some("ns1".to_string()),
                follower_read,
                ..CallFields::default()
            },
            attributes: serde_json::json!({"k": [1, 2.5, "x"]}).as_object().cloned().unwrap_or_default(),
            events: Vec::new(),
            links: Vec::new(),
        }
    }

    /// The JSON read and the row-by-row fallback give the same spans, in the same order.
    #[tokio::test]
    async fn spans_read_as_json_equal_spans_read_row_by_row() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = super::super::SqliteStore::open_dir(dir.path()).await.expect("store");
        let spans = vec![
            span(1, 1, Some("c1"), 100, Some(true)),
            span(1, 2, None, 101, None),
            span(2, 3, Some("c1"), 90, Some(false)),
            span(3, 4, Some("c2"), 95, None),
        ];
        store.ingest(&IngestBatch { spans, ..IngestBatch::default() }).await.expect("ingest");
        let client = client_binds("c1", TimeRange { from: 0, to: 1_000 }, 10, i64::MAX);
        let scope = [
            Bind::Text(Some("prod")),
            Bind::Text(Some("ns1")),
            Bind::Int(0),
            Bind::Int(1_000),
            Bind::Int(10),
            Bind::Int(i64::MAX),
        ];
        for (ctes, binds, expected) in [(CLIENT_PICK, &client[..], 3), (SCOPE_PICK, &scope[..], 4)] {
            let json = spans_picked(&store.reader, ctes, binds).await.expect("json");
            let rows = spans_picked_by_row(&store.reader, ctes, binds).await.expect("rows");
            assert_eq!(json.len(), expected);
            assert_eq!(json, rows);
            assert!(json.windows(2).all(|pair| pair[0].start_unix_nano <= pair[1].start_unix_nano));
            // With their ids, both ways: the same spans, each with its own id.
            let with_ids = spans_picked_with_ids(&store.reader, ctes, binds).await.expect("json, ids");
            assert_eq!(with_ids, spans_picked_with_ids_by_row(&store.reader, ctes, binds).await.expect("rows, ids"));
            assert_eq!(with_ids.iter().map(|(_, span)| span.clone()).collect::<Vec<_>>(), json);
            let mut ids: Vec<i64> = with_ids.iter().map(|(id, _)| *id).collect();
            ids.sort_unstable();
            ids.dedup();
            assert_eq!(ids.len(), expected);
        }
    }
}
