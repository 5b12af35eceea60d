//! Reading spans and samples back: a scope's newest, a client's own rows with the traces
//! under them (read in parallel on the prefetching pool), a scope's series with their samples.

use super::*;
use crate::rows::ResourceRow;
use sqlx::Column;
use sqlx::Row;
use sqlx::postgres::PgRow;

/// A span row with its row id (the order ties in start time are broken by).
pub(super) struct IdentifiedSpanRow {
    pub(super) id: i64,
    pub(super) span: SpanRow,
}

impl IdentifiedSpanRow {
    /// Each row's span with its id, as the span feed hands them out.
    pub(super) fn with_ids(rows: Vec<Self>) -> Result<Vec<(i64, Span)>> {
        rows.into_iter().map(|row| Ok((row.id, row.span.into_span()?))).collect()
    }
}

/// Declares `SpanColumns`: where each of a span's columns is in a result, found by name once
/// per result. sqlx's derived `FromRow` finds every column by name, in a hashed map, for every
/// row: 42 lookups a span, about a tenth of a `perf` profile of `/api/v1/lag` over 500 000
/// spans on PostgreSQL. A column the list leaves out of [`SpanRow`] does not compile.
macro_rules! span_columns {
    (span: [$($field:ident),* $(,)?], resource: [$($resource:ident),* $(,)?] $(,)?) => {
        struct SpanColumns {
            $($field: usize,)*
            $($resource: usize,)*
        }

        impl SpanColumns {
            fn of(row: &PgRow) -> Result<Self> {
                Ok(Self {
                    $($field: row.try_column(stringify!($field))?.ordinal(),)*
                    $($resource: row.try_column(stringify!($resource))?.ordinal(),)*
                })
            }

            fn decode(&self, row: &PgRow) -> Result<SpanRow> {
                Ok(SpanRow {
                    $($field: row.try_get(self.$field)?,)*
                    resource: ResourceRow { $($resource: row.try_get(self.$resource)?,)* },
                })
            }
        }
    };
}

span_columns!(
    span: [
        trace_id, span_id, parent_span_id, name, kind, start_unix_nano, end_unix_nano, status_code,
        status_message, scope_name, scope_version, scope_attributes, client_id, call_id, attempt,
        namespace, op, rpc_method, target_node, target_role, node_role, consistency, follower_read,
        state_carried, state_returned, state_served, state_committed, state_router, outcome,
        error_type, requeues, retry_delay_ms, bytes, attributes, events, links,
    ],
    resource: [service_name, system, cluster, component, node_id, resource_attributes],
);

/// The spans `query` (`SELECT * FROM spans` or any result with a span's columns) reads, each
/// decoded as it arrives.
pub(super) async fn fetch_span_rows<'q>(
    query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    pool: &PgPool,
) -> Result<Vec<SpanRow>> {
    fetch_decoded(query, pool, SpanColumns::of, SpanColumns::decode).await
}

/// [`fetch_span_rows`] with each row's `id`.
pub(super) async fn fetch_identified_span_rows<'q>(
    query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    pool: &PgPool,
) -> Result<Vec<IdentifiedSpanRow>> {
    fetch_decoded(
        query,
        pool,
        |row| Ok((SpanColumns::of(row)?, row.try_column("id")?.ordinal())),
        |(columns, id), row| Ok(IdentifiedSpanRow { id: row.try_get(*id)?, span: columns.decode(row)? }),
    )
    .await
}

/// The rows `query` reads, each decoded by `decode` as it arrives with what `columns` found
/// in the first row.
async fn fetch_decoded<'q, C, T>(
    query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    pool: &PgPool,
    columns: impl Fn(&PgRow) -> Result<C>,
    decode: impl Fn(&C, &PgRow) -> Result<T>,
) -> Result<Vec<T>> {
    use futures::TryStreamExt;
    let mut rows = query.fetch(pool);
    let mut found = None;
    let mut decoded = Vec::new();
    while let Some(row) = rows.try_next().await? {
        let found = match &found {
            Some(found) => found,
            None => found.insert(columns(&row)?),
        };
        decoded.push(decode(found, &row)?);
    }
    Ok(decoded)
}

/// Two statements made of the same pieces: `$plain` joins them, `$bounded` puts `$bound` (an
/// id bound, `AND id <= $n`) between each two, for the span feed's reads ([`feed`]).
macro_rules! with_id_bound {
    ($(#[$doc:meta])* $plain:ident, $bounded:ident, $bound:literal, $first:literal $(, $rest:literal)* $(,)?) => {
        $(#[$doc])*
        const $plain: &str = concat!($first $(, $rest)*);
        const $bounded: &str = concat!($first $(, $bound, $rest)*);
    };
}

with_id_bound!(
    /// A scope's newest $5 spans starting in $3..$4 (cluster $1 and namespace $2, either may
    /// be NULL), oldest first (`_THROUGH`: among the rows with ids up to $6).
    SCOPE_NEWEST,
    SCOPE_NEWEST_THROUGH,
    " AND id <= $6",
    "SELECT * FROM (
         SELECT * FROM spans
         WHERE cluster IS NOT DISTINCT FROM $1 AND namespace IS NOT DISTINCT FROM $2
           AND start_unix_nano >= $3 AND start_unix_nano < $4",
    "
         ORDER BY start_unix_nano DESC LIMIT $5
     ) AS recent ORDER BY start_unix_nano, id",
);

with_id_bound!(
    /// A client's newest entries ($4 + 1 of them, and those sharing the last one's start) in
    /// $2..$3, from the (client, start) index alone ([`PgStore::client_rows`]); `_THROUGH`:
    /// among the rows with ids up to $5.
    CLIENT_ENTRIES,
    CLIENT_ENTRIES_THROUGH,
    " AND id <= $5",
    "SELECT start_unix_nano, end_unix_nano, trace_id FROM spans
     WHERE client_id = $1 AND start_unix_nano < $3",
    "
       AND start_unix_nano >= COALESCE(
           (SELECT start_unix_nano FROM spans
            WHERE client_id = $1 AND start_unix_nano >= $2 AND start_unix_nano < $3",
    "
            ORDER BY start_unix_nano DESC OFFSET $4 LIMIT 1),
           $2)",
);

with_id_bound!(
    /// The client's rows from $2 on, before $3 (`_THROUGH`: with ids up to $4).
    CLIENT_OWN,
    CLIENT_OWN_THROUGH,
    " AND id <= $4",
    "SELECT * FROM spans WHERE client_id = $1 AND start_unix_nano >= $2 AND start_unix_nano < $3",
    "",
);

with_id_bound!(
    /// The spans with both ids of the traces $1 starting in $2..=$3 (`_THROUGH`: with ids up
    /// to $4).
    TRACE_HOPS,
    TRACE_HOPS_THROUGH,
    " AND id <= $4",
    "SELECT * FROM spans WHERE trace_id = ANY($1) AND start_unix_nano >= $2 AND start_unix_nano <= $3
       AND trace_id IS NOT NULL AND span_id IS NOT NULL",
    "",
);

/// A statement's arguments bound one after another: typed rows (`query_as`) or rows decoded
/// afterwards (`query`, [`span_rows`]).
pub(super) trait Binds<'q>: Sized {
    fn bind_one<T: 'q + sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres>>(self, value: T) -> Self;
}

impl<'q, O> Binds<'q> for sqlx::query::QueryAs<'q, Postgres, O, sqlx::postgres::PgArguments> {
    fn bind_one<T: 'q + sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres>>(self, value: T) -> Self {
        self.bind(value)
    }
}

impl<'q> Binds<'q> for sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    fn bind_one<T: 'q + sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres>>(self, value: T) -> Self {
        self.bind(value)
    }
}

/// `query` with the id bound of a `_THROUGH` statement, when there is one.
pub(super) fn bound<'q, Q: Binds<'q>>(query: Q, through: Option<i64>) -> Q {
    match through {
        Some(through) => query.bind_one(through),
        None => query,
    }
}

/// A client's timeline reads its traces' spans in parts of about this many traces, each on
/// its own connection ...
pub(super) const TRACES_PER_READ: usize = 12;

/// ... at most this many at once, beside the read of the client's own spans (the read pool
/// holds one connection more).
pub(super) const MAX_PARALLEL_TRACE_READS: usize = 8;

/// A series of a scope with its samples of the window, as arrays in time order.
#[derive(sqlx::FromRow)]
pub(super) struct ScopeSeriesRow {
    id: i64,
    name: String,
    labels: String,
    kind: String,
    unit: Option<String>,
    description: Option<String>,
    times: Vec<i64>,
    starts: Vec<Option<i64>>,
    numbers: Vec<Option<f64>>,
    distributions: Vec<Option<String>>,
}

/// Each trace's window from a client's spans in it, `(trace, start, end)`: from
/// [`crate::TRACE_WINDOW_NANOS`] before the earliest start to as long after the latest end.
pub(super) fn trace_windows<'a>(
    spans: impl Iterator<Item = (Option<&'a str>, i64, i64)>,
) -> BTreeMap<&'a str, (i64, i64)> {
    let mut windows: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
    for (trace, start, end) in spans {
        if let Some(trace) = trace {
            let window = windows.entry(trace).or_insert((i64::MAX, i64::MIN));
            window.0 = window.0.min(start.saturating_sub(crate::TRACE_WINDOW_NANOS));
            window.1 = window.1.max(end.saturating_add(crate::TRACE_WINDOW_NANOS));
        }
    }
    windows
}

/// Binds the scope and range parameters `$1`..`$5` of a range read: cluster, namespace, from,
/// to, limit.
pub(super) fn scoped<'q, Q: Binds<'q>>(
    query: Q,
    cluster: Option<&'q str>,
    namespace: Option<&'q str>,
    range: TimeRange,
    limit: u32,
) -> Q {
    query.bind_one(cluster).bind_one(namespace).bind_one(range.from).bind_one(range.to).bind_one(i64::from(limit))
}

impl PgStore {
    /// The series of a metric whose labels include every matcher (jsonb containment), in id
    /// order.
    pub(super) async fn matching_series(&self, name: &str, matchers: &[(String, String)]) -> Result<Vec<SeriesRow>> {
        let matcher_object: BTreeMap<&str, &str> =
            matchers.iter().map(|(label, value)| (label.as_str(), value.as_str())).collect();
        Ok(sqlx::query_as(
            "SELECT id, name, labels, kind, unit, description FROM series
             WHERE name = $1 AND labels::jsonb @> $2::jsonb
             ORDER BY id",
        )
        .bind(name)
        .bind(to_json_text(&matcher_object))
        .fetch_all(&self.pool)
        .await?)
    }

    /// [`Store::scope_spans`], among the rows with ids up to `through` when given (the span
    /// feed's reads, [`feed`]).
    pub(super) async fn scope_rows(
        &self,
        cluster: Option<&str>,
        namespace: Option<&str>,
        range: TimeRange,
        limit: u32,
        through: Option<i64>,
    ) -> Result<Vec<Span>> {
        let sql = if through.is_some() { SCOPE_NEWEST_THROUGH } else { SCOPE_NEWEST };
        let rows =
            fetch_span_rows(bound(scoped(sqlx::query(sql), cluster, namespace, range, limit), through), &self.pool)
                .await?;
        rows.into_iter().map(SpanRow::into_span).collect()
    }

    /// [`Store::client_spans`]'s rows with their ids, among those with ids up to `through`
    /// when given (the span feed's reads, [`feed`]).
    pub(super) async fn client_rows(
        &self,
        client_id: &str,
        range: TimeRange,
        limit: u32,
        through: Option<i64>,
    ) -> Result<Vec<IdentifiedSpanRow>> {
        // What a timeline costs once the table is larger than memory is random page reads
        // (BENCHMARKS.md, "A client's timeline from PostgreSQL"): a client's spans lie on as
        // many heap pages as it has spans, and its router and server hops (which name no
        // client) on as many more, behind one trace-index descent per trace. So:
        // 1. the client's newest `limit` entries (and those sharing the last one's start) from
        //    the (client, start) index alone, which carries each span's trace and end: an
        //    index-only scan of adjacent entries once vacuum has marked the pages visible, so
        //    the traces are known before any row is read, and the limit stays bounded
        //    however long the history;
        // 2. at the same time, the client's rows and its traces' spans near them in time, by
        //    bitmap scans (heap pages read in block order and prefetched), the traces split in
        //    time order over several connections so that their index descents, which are
        //    synchronous, wait side by side, each part in the partitions of its time only;
        // 3. the client's rows cut to the limit by (start, row id) through ties, and each
        //    trace's spans kept within its window around the rows kept.
        if limit == 0 {
            return Ok(Vec::new());
        }
        let limit = i64::from(limit);
        // Bounded by `through`, a read needs each row's id, which the index does not carry:
        // only the feed's reads pay for that.
        let (entries_sql, own_sql, traces_sql) = match through {
            None => (CLIENT_ENTRIES, CLIENT_OWN, TRACE_HOPS),
            Some(_) => (CLIENT_ENTRIES_THROUGH, CLIENT_OWN_THROUGH, TRACE_HOPS_THROUGH),
        };
        let entries: Vec<(i64, i64, Option<String>)> =
            bound(sqlx::query_as(entries_sql).bind(client_id).bind(range.from).bind(range.to).bind(limit - 1), through)
                .fetch_all(&self.pool)
                .await?;
        let Some(from) = entries.iter().map(|(start, _, _)| *start).min() else {
            return Ok(Vec::new());
        };
        let windows = trace_windows(entries.iter().map(|(start, end, trace)| (trace.as_deref(), *start, *end)));
        let own = fetch_identified_span_rows(
            bound(sqlx::query(own_sql).bind(client_id).bind(from).bind(range.to), through),
            &self.reads,
        );
        // Read in time order, a part's traces share a day or two: PostgreSQL prunes the
        // partitions outside the part's window instead of descending the trace index of every
        // day kept. Each part takes a connection only when it starts.
        let mut traces: Vec<(&str, (i64, i64))> = windows.iter().map(|(trace, window)| (*trace, *window)).collect();
        traces.sort_unstable_by_key(|(_, (earliest, _))| *earliest);
        let parts = traces.len().div_ceil(TRACES_PER_READ).clamp(1, MAX_PARALLEL_TRACE_READS);
        let chunk = traces.len().div_ceil(parts).max(1);
        let reads = traces.chunks(chunk).map(|part| {
            let ids: Vec<&str> = part.iter().map(|(trace, _)| *trace).collect();
            let earliest = part.iter().map(|(_, (earliest, _))| *earliest).min().unwrap_or(i64::MIN);
            let latest = part.iter().map(|(_, (_, latest))| *latest).max().unwrap_or(i64::MAX);
            fetch_identified_span_rows(
                bound(sqlx::query(traces_sql).bind(ids).bind(earliest).bind(latest), through),
                &self.reads,
            )
        });
        let (mut rows, parts) = futures::future::try_join(own, futures::future::try_join_all(reads)).await?;
        // Spans sharing the cut-off start: the newest `limit` by (start, row id).
        if rows.len() as i64 > limit {
            rows.sort_unstable_by_key(|row| std::cmp::Reverse((row.span.start_unix_nano, row.id)));
            rows.truncate(limit as usize);
        }
        // Each trace's window around the client's rows kept: a trace's spans belong to the
        // timeline when they start within TRACE_WINDOW_NANOS of them.
        let kept = trace_windows(
            rows.iter().map(|row| (row.span.trace_id.as_deref(), row.span.start_unix_nano, row.span.end_unix_nano)),
        );
        let hops: Vec<IdentifiedSpanRow> = parts
            .into_iter()
            .flatten()
            .filter(|hop| {
                hop.span
                    .trace_id
                    .as_deref()
                    .and_then(|trace| kept.get(trace))
                    .is_some_and(|(earliest, latest)| (*earliest..=*latest).contains(&hop.span.start_unix_nano))
            })
            .collect();
        rows.extend(hops);
        // The client's own spans come back with their traces: each stored row once, in
        // (start, row id) order.
        rows.sort_unstable_by_key(|row| (row.span.start_unix_nano, row.id));
        rows.dedup_by_key(|row| row.id);
        Ok(rows)
    }

    /// Samples of `cluster`'s series naming the namespace or none (`Namespaces::Every`: the
    /// series of the given names in every namespace), from `window` before the latest on.
    pub(super) async fn samples_of_scope(
        &self,
        cluster: Option<&str>,
        namespaces: crate::Namespaces<'_>,
        window: i64,
        from: i64,
    ) -> Result<Vec<(i64, Sample)>> {
        let (namespace, names) = namespaces.binds();
        // One row per series, its samples as arrays: each row naming its series again had its
        // labels parsed again for every sample (the live analyzer reads every busy scope's
        // window on each pass). The latest sample series by series, through the primary key
        // (as the SQLite store, where a max over the join read the whole table for a scope
        // without samples).
        let rows: Vec<ScopeSeriesRow> = sqlx::query_as(
            "WITH scope AS (
                 SELECT id, name, labels, kind, unit, description FROM series
                 WHERE cluster IS NOT DISTINCT FROM $1
                   AND CASE WHEN $4::text IS NULL
                            THEN namespace IS NOT DISTINCT FROM $2 OR namespace IS NULL
                            ELSE name IN (SELECT jsonb_array_elements_text($4::jsonb)) END
             ),
             latest AS (
                 SELECT max((SELECT max(time_unix_nano) FROM samples WHERE series_id = scope.id)) AS at FROM scope
             )
             SELECT scope.id, scope.name, scope.labels, scope.kind, scope.unit, scope.description,
                    array_agg(samples.time_unix_nano ORDER BY samples.time_unix_nano) AS times,
                    array_agg(samples.start_time_unix_nano ORDER BY samples.time_unix_nano) AS starts,
                    array_agg(samples.value ORDER BY samples.time_unix_nano) AS numbers,
                    array_agg(samples.distribution ORDER BY samples.time_unix_nano) AS distributions
             FROM samples JOIN scope ON scope.id = samples.series_id, latest
             WHERE samples.time_unix_nano >= GREATEST(latest.at - $3, $5)
             GROUP BY scope.id, scope.name, scope.labels, scope.kind, scope.unit, scope.description
             ORDER BY scope.id",
        )
        .bind(cluster)
        .bind(namespace)
        .bind(window)
        .bind(names)
        .bind(from)
        .fetch_all(&self.pool)
        .await?;
        let mut samples = Vec::new();
        for row in rows {
            let (key, meta) =
                crate::rows::series_identity(row.name, &row.labels, &row.kind, row.unit, row.description)?;
            let points = row.times.into_iter().zip(row.starts).zip(row.numbers).zip(row.distributions);
            for (((time_unix_nano, start_time_unix_nano), number), distribution) in points {
                let sample = Sample {
                    series: key.clone(),
                    meta: meta.clone(),
                    time_unix_nano,
                    start_time_unix_nano,
                    value: crate::rows::point_value(number, distribution.as_deref())?,
                };
                samples.push((row.id, sample));
            }
        }
        // Each series in time order, the series in id order: a stable sort by time orders the
        // samples of one time by series.
        samples.sort_by_key(|(_, sample)| sample.time_unix_nano);
        Ok(samples)
    }
}
