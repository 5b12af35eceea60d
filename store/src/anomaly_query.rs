//! The SQL of anomaly lists and counts, shared by both backends.
//!
//! A statement names only the conditions its filter sets: the catch-all form
//! `(? IS NULL OR kind = ?)` keeps both planners from using an index, so every list scanned
//! the whole table newest first until it had enough rows (all of it for a rare kind). Every
//! value is still bound; only the choice among these fixed fragments varies.
//!
//! A list picks its ids first, from the indexes alone (`(kind, end, start)` and `(end,
//! start)` cover a time range's condition), then reads those rows: what is sorted is ids,
//! not whole rows with their evidence.

use sqlx::{Database, Encode, QueryBuilder, Type};

use crate::AnomalyFilter;

/// How a backend spells what the shared fragments cannot.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    /// The `open` condition as a literal (not a bind), so that each planner sees it implies its
    /// partial index of open anomalies.
    fn open(self, open: bool) -> &'static str {
        match (self, open) {
            (Dialect::Sqlite, true) => " AND open = 1",
            (Dialect::Sqlite, false) => " AND open = 0",
            (Dialect::Postgres, true) => " AND open",
            (Dialect::Postgres, false) => " AND NOT open",
        }
    }
}

/// The columns of a listed anomaly; `evidence` is read only when the filter wants it.
fn columns(filter: &AnomalyFilter) -> &'static str {
    if filter.skip_evidence {
        "id, fingerprint, kind, severity, cluster, namespace, client_id, node_id, start_unix_nano, \
         end_unix_nano, summary, cause, 'null' AS evidence, first_seen_unix_nano, last_seen_unix_nano, open, \
         superseded_by"
    } else {
        "*"
    }
}

/// `WHERE` and the filter's conditions (paging's `before_id` included when `paged`).
fn push_conditions<DB>(query: &mut QueryBuilder<DB>, dialect: Dialect, filter: &AnomalyFilter, paged: bool)
where
    DB: Database,
    for<'t> String: Encode<'t, DB> + Type<DB>,
    for<'t> i64: Encode<'t, DB> + Type<DB>,
{
    // Replaced by a whole version of the same incident: not listed (`supersede`).
    query.push(" WHERE superseded_by IS NULL");
    if let Some(kind) = filter.kind {
        query.push(" AND kind = ").push_bind(kind.as_str().to_string());
    }
    for (column, value) in
        [("cluster", &filter.cluster), ("namespace", &filter.namespace), ("client_id", &filter.client_id)]
    {
        if let Some(value) = value {
            query.push(format_args!(" AND {column} = ")).push_bind(value.clone());
        }
    }
    if let Some(since) = filter.since {
        query.push(" AND end_unix_nano >= ").push_bind(since);
    }
    if let Some(until) = filter.until {
        query.push(" AND start_unix_nano < ").push_bind(until);
    }
    if let Some(open) = filter.open {
        query.push(dialect.open(open));
    }
    if paged && let Some(before) = filter.before_id {
        query.push(" AND id < ").push_bind(before);
    }
}

/// Anomalies matching the filter, newest (highest id) first, at most `limit`.
pub(crate) fn list<DB>(dialect: Dialect, filter: &AnomalyFilter) -> QueryBuilder<DB>
where
    DB: Database,
    <DB as Database>::Arguments: Default,
    for<'t> String: Encode<'t, DB> + Type<DB>,
    for<'t> i64: Encode<'t, DB> + Type<DB>,
{
    let mut query =
        QueryBuilder::new(format!("SELECT {} FROM anomalies WHERE id IN (SELECT id FROM anomalies", columns(filter)));
    push_conditions(&mut query, dialect, filter, true);
    query.push(" ORDER BY id DESC LIMIT ").push_bind(i64::from(filter.limit));
    query.push(") ORDER BY id DESC");
    query
}

/// How many anomalies match the filter per kind, cluster, severity and open.
pub(crate) fn counts<DB>(dialect: Dialect, filter: &AnomalyFilter) -> QueryBuilder<DB>
where
    DB: Database,
    <DB as Database>::Arguments: Default,
    for<'t> String: Encode<'t, DB> + Type<DB>,
    for<'t> i64: Encode<'t, DB> + Type<DB>,
{
    let mut query = QueryBuilder::new("SELECT kind, cluster, severity, open, count(*) AS count FROM anomalies");
    push_conditions(&mut query, dialect, filter, false);
    query.push(" GROUP BY kind, cluster, severity, open ORDER BY kind, cluster, severity, open");
    query
}

/// Which anomalies of a kind in a range `Store::newest_of_kind` reads (one part at a time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RangePart {
    /// Those that end inside the range, latest end first: the `(kind, end, start)` index read
    /// backwards from the range's end, the scan stopping at the limit.
    EndingWithin,
    /// Those that end at or after the range's end and start before it (windows across it).
    Across,
}

/// Up to `limit` anomalies of `kind` of one part of `range`, without evidence, newest id first.
pub(crate) fn newest_of_kind<DB>(
    kind: lagscope_model::AnomalyKind,
    range: crate::TimeRange,
    part: RangePart,
    limit: u32,
) -> QueryBuilder<DB>
where
    DB: Database,
    <DB as Database>::Arguments: Default,
    for<'t> String: Encode<'t, DB> + Type<DB>,
    for<'t> i64: Encode<'t, DB> + Type<DB>,
{
    let filter = AnomalyFilter { skip_evidence: true, ..AnomalyFilter::default() };
    let mut query = QueryBuilder::new(format!(
        "SELECT {} FROM anomalies WHERE id IN (SELECT id FROM anomalies WHERE superseded_by IS NULL AND kind = ",
        columns(&filter)
    ));
    query.push_bind(kind.as_str().to_string());
    match part {
        RangePart::EndingWithin => {
            query.push(" AND end_unix_nano >= ").push_bind(range.from);
            query.push(" AND end_unix_nano < ").push_bind(range.to);
            query.push(" AND start_unix_nano < ").push_bind(range.to);
            query.push(" ORDER BY end_unix_nano DESC");
        }
        RangePart::Across => {
            query.push(" AND end_unix_nano >= ").push_bind(range.to.max(range.from));
            query.push(" AND start_unix_nano < ").push_bind(range.to);
        }
    }
    query.push(" LIMIT ").push_bind(i64::from(limit));
    query.push(") ORDER BY id DESC");
    query
}

/// `Store::newest_of_kind` over a backend's `read` of one part of the range (the query of
/// [`newest_of_kind`]): those ending within it, then, when there is room, those across its end.
pub(crate) async fn newest_of_kind_in<F, Fut>(limit: u32, mut read: F) -> crate::Result<Vec<crate::StoredAnomaly>>
where
    F: FnMut(RangePart, u32) -> Fut,
    Fut: std::future::Future<Output = crate::Result<Vec<crate::StoredAnomaly>>>,
{
    let mut newest = read(RangePart::EndingWithin, limit).await?;
    let room = limit.saturating_sub(newest.len() as u32);
    if room > 0 {
        newest.extend(read(RangePart::Across, room).await?);
        newest.sort_unstable_by_key(|stored| std::cmp::Reverse(stored.id));
    }
    Ok(newest)
}
