//! Writing an ingest batch: spans and log records streamed with COPY into their partitions
//! (through staging when one was sent before), samples through staging, replacing a re-sent one.

use super::*;

/// Streams the spans into their partitions; returns how many were new (a span sent again takes
/// the staging path of [`copy_skipping_repeats`]).
pub(super) async fn insert_spans(transaction: &mut Transaction<'_, Postgres>, spans: &[Span]) -> Result<u64> {
    if spans.is_empty() {
        return Ok(0);
    }
    let mut rows = CopyRows::default();
    for span in spans {
        let resource = &span.resource;
        let call = &span.call;
        rows.opt_text(span.trace_id.as_deref())
            .opt_text(span.span_id.as_deref())
            .opt_text(span.parent_span_id.as_deref())
            .text(&span.name)
            .int(i64::from(span.kind.to_otlp()))
            .int(span.start_unix_nano)
            .int(span.end_unix_nano)
            .int(i64::from(span.status_code))
            .opt_text(span.status_message.as_deref())
            .opt_text(resource.service_name.as_deref())
            .opt_text(resource.system.as_deref())
            .opt_text(resource.cluster.as_deref())
            .opt_text(resource.component.as_ref().map(lagscope_model::Component::as_str))
            .opt_text(resource.node_id.as_deref())
            .text(&to_json_text(&resource.attributes))
            .opt_text(span.scope_name.as_deref())
            .opt_text(span.scope_version.as_deref())
            .text(&to_json_text(&span.scope_attributes))
            .opt_text(call.client_id.as_deref())
            .opt_text(call.call_id.as_deref())
            .opt_int(call.attempt)
            .opt_text(call.namespace.as_deref())
            .opt_text(call.op.as_ref().map(Op::as_str))
            .opt_text(call.rpc_method.as_deref())
            .opt_text(call.target_node.as_deref())
            .opt_text(call.target_role.as_deref())
            .opt_text(call.node_role.as_deref())
            .opt_text(call.consistency.as_deref())
            .opt_bool(call.follower_read)
            .opt_int(call.state.carried)
            .opt_int(call.state.returned)
            .opt_int(call.state.served)
            .opt_int(call.state.committed)
            .opt_int(call.state.router)
            .opt_text(call.outcome.as_ref().map(Outcome::as_str))
            .opt_text(call.error_type.as_deref())
            .opt_int(call.requeues)
            .opt_int(call.retry_delay_ms)
            .opt_int(call.bytes)
            .text(&to_json_text(&span.attributes))
            .text(&to_json_text(&span.events))
            .text(&to_json_text(&span.links))
            .end_row();
    }
    copy_skipping_repeats(transaction, &rows, "spans", SPAN_COLUMNS, SPANS_UNIQUE).await
}

/// The unique index a span sent again breaks (its ids and start, the partition key).
pub(super) const SPANS_UNIQUE: &str =
    "(trace_id, span_id, start_unix_nano) WHERE trace_id IS NOT NULL AND span_id IS NOT NULL";

/// The unique index a log record sent again breaks (its time and identity, see `LogColumns`).
pub(super) const LOGS_UNIQUE: &str = "(time_unix_nano, identity)";

/// Gives each log row stored before log records had an identity (migration 0008) the one its
/// insert would give it now, and removes the rows that turn out to be copies of another (a
/// record sent again, which the store kept twice then), as SQLite's `identify_old_rows`.
/// Instances connecting at once take turns batch by batch (a transaction-scoped advisory lock);
/// a batch that meets a copy an ingest stored meanwhile (a unique violation) is run again, and
/// then finds it. Returns (rows identified, copies removed).
pub(super) async fn identify_old_logs(pool: &PgPool) -> Result<(u64, u64)> {
    let (mut identified, mut removed, mut batches) = (0_u64, 0_u64, 0_u64);
    let mut conflicts = 0;
    loop {
        match identify_old_logs_batch(pool).await {
            Ok(None) => return Ok((identified, removed)),
            Ok(Some((batch_identified, batch_removed))) => {
                identified += batch_identified;
                removed += batch_removed;
                batches += 1;
                if batches.is_multiple_of(100) {
                    tracing::info!(identified, removed, "identifying log records stored before migration 0008");
                }
            }
            Err(StoreError::Query(sqlx::Error::Database(error)))
                if error.code().as_deref() == Some("23505") && conflicts < 10 =>
            {
                conflicts += 1;
            }
            Err(error) => return Err(error),
        }
    }
}

/// One batch of [`identify_old_logs`] in one transaction: what it identified and removed, or
/// `None` when no row was left.
pub(super) async fn identify_old_logs_batch(pool: &PgPool) -> Result<Option<(u64, u64)>> {
    /// The advisory lock's key: "lagscope logs identity" in eight bytes.
    const LOCK: i64 = 0x6c67_7363_6c6f_6769;
    let mut transaction = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(LOCK).execute(&mut *transaction).await?;
    let rows: Vec<LogRowWithId> = sqlx::query_as("SELECT * FROM logs WHERE identity IS NULL ORDER BY id LIMIT 1000")
        .fetch_all(&mut *transaction)
        .await?;
    if rows.is_empty() {
        return Ok(None);
    }
    let (mut identified, mut removed) = (0, 0);
    for row in &rows {
        let (identity, time) = (row.identity(), row.row.time_unix_nano);
        // In id order, so that of several copies the first stored keeps its row.
        let updated = sqlx::query(
            "UPDATE logs SET identity = $1 WHERE id = $2 AND time_unix_nano = $3 AND NOT EXISTS
                 (SELECT 1 FROM logs WHERE time_unix_nano = $3 AND identity = $1)",
        )
        .bind(identity)
        .bind(row.id)
        .bind(time)
        .execute(&mut *transaction)
        .await?;
        if updated.rows_affected() == 1 {
            identified += 1;
        } else {
            sqlx::query("DELETE FROM logs WHERE id = $1 AND time_unix_nano = $2")
                .bind(row.id)
                .bind(time)
                .execute(&mut *transaction)
                .await?;
            removed += 1;
        }
    }
    transaction.commit().await?;
    Ok(Some((identified, removed)))
}

/// Streams `rows` into `table`'s partitions; returns how many were new. The common case: none
/// of the rows is stored yet, and they go straight in. A retried export (or a batch repeating a
/// row) breaks the table's unique index `unique`: the savepoint is rolled back and the rows take
/// a staging table and `INSERT ... ON CONFLICT DO NOTHING`, which skips what is already
/// stored. `table`, `columns` and `unique` are program text, never telemetry.
pub(super) async fn copy_skipping_repeats(
    transaction: &mut Transaction<'_, Postgres>,
    rows: &CopyRows,
    table: &'static str,
    columns: &'static str,
    unique: &'static str,
) -> Result<u64> {
    let connection: &mut PgConnection = transaction;
    sqlx::query("SAVEPOINT copy_rows").execute(&mut *connection).await?;
    match rows.send(connection, &format!("COPY {table} ({columns}) FROM STDIN")).await {
        Ok(written) => {
            sqlx::query("RELEASE SAVEPOINT copy_rows").execute(&mut *connection).await?;
            return Ok(written);
        }
        Err(StoreError::Query(sqlx::Error::Database(error))) if error.code().as_deref() == Some("23505") => {
            sqlx::query("ROLLBACK TO SAVEPOINT copy_rows").execute(&mut *connection).await?;
        }
        Err(error) => return Err(error),
    }
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TEMP TABLE IF NOT EXISTS {table}_staging ON COMMIT DELETE ROWS AS \
         SELECT {columns} FROM {table} WITH NO DATA"
    )))
    .execute(&mut *connection)
    .await?;
    rows.send(connection, &format!("COPY {table}_staging ({columns}) FROM STDIN")).await?;
    let result = sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {table} ({columns}) SELECT {columns} FROM {table}_staging ON CONFLICT {unique} DO NOTHING"
    )))
    .execute(&mut *connection)
    .await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("TRUNCATE {table}_staging"))).execute(&mut *connection).await?;
    Ok(result.rows_affected())
}

/// Creates the batch's series on first sight, then streams the samples (the last one of a
/// series and time wins, as a re-sent sample replaces the stored one).
pub(super) async fn insert_samples(transaction: &mut Transaction<'_, Postgres>, samples: &[Sample]) -> Result<u64> {
    if samples.is_empty() {
        return Ok(0);
    }
    let connection: &mut PgConnection = transaction;
    // Each series once, in key order: an upsert locks the series row, and ingests committing
    // at once (`concurrent_ingests`) must take shared rows in one order or deadlock. A series'
    // metadata comes from its first sample in the batch.
    let mut first_of_series: BTreeMap<&SeriesKey, &Sample> = BTreeMap::new();
    for sample in samples {
        first_of_series.entry(&sample.series).or_insert(sample);
    }
    let mut series_ids: BTreeMap<&SeriesKey, i64> = BTreeMap::new();
    for (series, sample) in first_of_series {
        let (id,): (i64,) = sqlx::query_as(
            "INSERT INTO series (name, labels, kind, unit, description, cluster, namespace, node_id)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (name, labels) DO UPDATE SET
                 kind = excluded.kind,
                 unit = coalesce(excluded.unit, series.unit),
                 description = coalesce(excluded.description, series.description)
             RETURNING id",
        )
        .bind(copy::text(&series.name))
        .bind(copy::text(&to_json_text(&series.labels)))
        .bind(sample.meta.kind.as_str())
        .bind(sample.meta.unit.as_deref().map(copy::text))
        .bind(sample.meta.description.as_deref().map(copy::text))
        .bind(series.label(CLUSTER).map(copy::text))
        .bind(series.label(NAMESPACE).map(copy::text))
        .bind(series.label(NODE_ID).map(copy::text))
        .fetch_one(&mut *connection)
        .await?;
        series_ids.insert(series, id);
    }
    let mut latest: BTreeMap<(i64, i64), &Sample> = BTreeMap::new();
    for sample in samples {
        let series_id = series_ids.get(&*sample.series).copied().expect("every series was upserted above");
        latest.insert((series_id, sample.time_unix_nano), sample);
    }
    sqlx::query(
        "CREATE TEMP TABLE IF NOT EXISTS samples_staging ON COMMIT DELETE ROWS AS \
         SELECT series_id, time_unix_nano, start_time_unix_nano, value, distribution FROM samples WITH NO DATA",
    )
    .execute(&mut *connection)
    .await?;
    let mut rows = CopyRows::default();
    for ((series_id, time), sample) in &latest {
        let (value, distribution) = match &sample.value {
            PointValue::Number(number) => (Some(*number).filter(|number| number.is_finite()), None),
            PointValue::Distribution(point) => (None, Some(to_json_text(point))),
        };
        rows.int(*series_id)
            .int(*time)
            .opt_int(sample.start_time_unix_nano)
            .opt_float(value)
            .opt_text(distribution.as_deref())
            .end_row();
    }
    rows.send(
        connection,
        "COPY samples_staging (series_id, time_unix_nano, start_time_unix_nano, value, distribution) FROM STDIN",
    )
    .await?;
    let result = sqlx::query(
        "INSERT INTO samples (series_id, time_unix_nano, start_time_unix_nano, value, distribution)
         SELECT series_id, time_unix_nano, start_time_unix_nano, value, distribution FROM samples_staging
         ORDER BY series_id, time_unix_nano
         ON CONFLICT (series_id, time_unix_nano) DO UPDATE SET
             start_time_unix_nano = excluded.start_time_unix_nano,
             value = excluded.value,
             distribution = excluded.distribution",
    )
    .execute(&mut *connection)
    .await?;
    sqlx::query("TRUNCATE samples_staging").execute(&mut *connection).await?;
    Ok(result.rows_affected())
}

/// Streams the log records into their partitions; returns how many were new (a record
/// identical to a stored one is that record sent again, see `LogColumns`).
pub(super) async fn insert_logs(transaction: &mut Transaction<'_, Postgres>, logs: &[LogRecord]) -> Result<u64> {
    if logs.is_empty() {
        return Ok(0);
    }
    let mut rows = CopyRows::default();
    for record in logs {
        let resource = &record.resource;
        let columns = LogColumns::of(record);
        rows.int(record.time_unix_nano)
            .opt_int(record.observed_time_unix_nano)
            .int(i64::from(record.severity_number))
            .opt_text(record.severity_text.as_deref())
            .text(&columns.body)
            .opt_text(record.event_name.as_deref())
            .opt_text(record.trace_id.as_deref())
            .opt_text(record.span_id.as_deref())
            .opt_text(resource.service_name.as_deref())
            .opt_text(resource.system.as_deref())
            .opt_text(resource.cluster.as_deref())
            .opt_text(resource.component.as_ref().map(lagscope_model::Component::as_str))
            .opt_text(resource.node_id.as_deref())
            .text(&columns.resource_attributes)
            .opt_text(record.scope_name.as_deref())
            .opt_text(record.scope_version.as_deref())
            .text(&columns.attributes)
            .int(columns.identity)
            .end_row();
    }
    copy_skipping_repeats(transaction, &rows, "logs", LOG_COLUMNS, LOGS_UNIQUE).await
}
