//! Span rows: written column by column, read back into domain spans.

use lagscope_model::{Op, Outcome, Span};
use sqlx::{QueryBuilder, Sqlite, SqlitePool, Transaction};

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

const CONFLICT: &str = " ON CONFLICT (trace_id, span_id) WHERE trace_id IS NOT NULL AND span_id IS NOT NULL DO NOTHING";

/// Rows per INSERT statement: 42 columns each, well under SQLite's 32 766 bound parameters.
/// One statement per chunk instead of one per span: each statement is a round trip to
/// sqlx's SQLite worker thread.
const ROWS_PER_STATEMENT: usize = 200;

/// Inserts spans; returns how many were new.
pub(super) async fn insert(transaction: &mut Transaction<'_, Sqlite>, spans: &[Span]) -> Result<u64> {
    let mut written = 0;
    for chunk in spans.chunks(ROWS_PER_STATEMENT) {
        let mut builder = QueryBuilder::<Sqlite>::new(INSERT_HEAD);
        builder.push_values(chunk, |mut row, span| {
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
        });
        builder.push(CONFLICT);
        let result = builder.build().execute(&mut **transaction).await?;
        written += result.rows_affected();
    }
    Ok(written)
}

/// The client's spans in the range (the most recent `limit`), plus every span of their traces.
/// The spans of a `spans` subquery as one JSON text: an array of [`SpanRow`]s, each an array
/// in `SpanRow`'s field order (the resource columns nested), oldest first. sqlx's SQLite driver
/// copies every column of every row it returns, which for a page's two thousand spans of 42
/// columns took most of the page's time; SQLite writes the same rows as JSON in a fraction.
/// Spans hold no floating-point column, so nothing is rounded on the way.
const SPAN_JSON_ARRAY: &str = "json_group_array(json_array(
    trace_id, span_id, parent_span_id, name, kind, start_unix_nano, end_unix_nano,
    status_code, status_message,
    json_array(service_name, system, cluster, component, node_id, resource_attributes),
    scope_name, scope_version, scope_attributes, client_id, call_id, attempt, namespace, op,
    rpc_method, target_node, target_role, node_role, consistency,
    json(CASE WHEN follower_read IS NULL THEN 'null' WHEN follower_read THEN 'true' ELSE 'false' END),
    state_carried, state_returned, state_served, state_committed, state_router,
    outcome, error_type, requeues, retry_delay_ms, bytes, attributes, events, links
) ORDER BY start_unix_nano, id)";

/// Spans from the one-row JSON text of [`SPAN_JSON_ARRAY`].
fn spans_of_json(text: &str) -> Result<Vec<Span>> {
    let rows: Vec<SpanRow> = serde_json::from_str(text).map_err(|error| crate::StoreError::Corrupt {
        what: "spans",
        detail: format!("reading spans as JSON: {error}"),
    })?;
    rows.into_iter().map(SpanRow::into_span).collect()
}

pub(super) async fn for_client(pool: &SqlitePool, client_id: &str, range: TimeRange, limit: u32) -> Result<Vec<Span>> {
    let (spans,): (String,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "WITH own AS (
             SELECT id, trace_id FROM spans
             WHERE client_id = ?1 AND start_unix_nano >= ?2 AND start_unix_nano < ?3
             ORDER BY start_unix_nano DESC LIMIT ?4
         ),
         -- Ids first (the traces' from the covering trace index), then each row once: a
         -- union of whole rows had SQLite sort and compare every column of every span.
         picked AS (
             SELECT id FROM own
             UNION
             SELECT id FROM spans
             WHERE trace_id IN (SELECT trace_id FROM own WHERE trace_id IS NOT NULL)
               AND trace_id IS NOT NULL AND span_id IS NOT NULL
         )
         SELECT {SPAN_JSON_ARRAY} AS spans FROM spans WHERE id IN (SELECT id FROM picked)"
    )))
    .bind(client_id)
    .bind(range.from)
    .bind(range.to)
    .bind(i64::from(limit))
    .fetch_one(pool)
    .await?;
    spans_of_json(&spans)
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

pub(super) async fn for_scope(
    pool: &SqlitePool,
    cluster: Option<&str>,
    namespace: Option<&str>,
    range: TimeRange,
    limit: u32,
) -> Result<Vec<Span>> {
    // The live analyzer's scope passes read tens of thousands of spans: one JSON row.
    let (spans,): (String,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {SPAN_JSON_ARRAY} AS spans FROM spans WHERE id IN (
             SELECT id FROM spans
             WHERE cluster IS ?1 AND namespace IS ?2 AND start_unix_nano >= ?3 AND start_unix_nano < ?4
             ORDER BY start_unix_nano DESC LIMIT ?5
         )"
    )))
    .bind(cluster)
    .bind(namespace)
    .bind(range.from)
    .bind(range.to)
    .bind(i64::from(limit))
    .fetch_one(pool)
    .await?;
    spans_of_json(&spans)
}

/// Spans in `cluster`/`namespace` (`None` = any) whose start lies in `range`, oldest first,
/// at most `limit`.
pub(super) async fn in_range(
    pool: &SqlitePool,
    cluster: Option<&str>,
    namespace: Option<&str>,
    range: TimeRange,
    limit: u32,
) -> Result<Vec<Span>> {
    let rows: Vec<SpanRow> = sqlx::query_as(
        "SELECT * FROM spans
         WHERE (?1 IS NULL OR cluster = ?1) AND (?2 IS NULL OR namespace = ?2)
           AND start_unix_nano >= ?3 AND start_unix_nano < ?4
         ORDER BY start_unix_nano, id LIMIT ?5",
    )
    .bind(cluster)
    .bind(namespace)
    .bind(range.from)
    .bind(range.to)
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await?;
    rows.into_iter().map(SpanRow::into_span).collect()
}
