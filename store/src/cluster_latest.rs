//! The latest telemetry of one cluster, shared by both backends: the latest start of its
//! spans, time of its samples and time of its log lines, each found by index seeks alone.
//!
//! Spans are indexed by `(cluster, namespace, start)`: the cluster's namespaces are walked
//! one seek each (a loose index scan, as `clients` walks client ids), then each namespace's
//! latest start is one more seek. Samples are keyed by `(series_id, time)`: one seek per
//! series of the cluster. Log lines by `(cluster, time)`: one seek.

use sqlx::{Database, Encode, QueryBuilder, Type};

/// `cluster = <cluster>`, or `cluster IS NULL` for telemetry that names none (a bound `NULL`
/// would match nothing, and `IS NOT DISTINCT FROM` keeps PostgreSQL from using its index).
fn push_cluster<DB>(query: &mut QueryBuilder<DB>, table: &str, cluster: Option<&str>)
where
    DB: Database,
    for<'t> String: Encode<'t, DB> + Type<DB>,
{
    match cluster {
        Some(cluster) => {
            query.push(format_args!("{table}.cluster = ")).push_bind(cluster.to_string());
        }
        None => {
            query.push(format_args!("{table}.cluster IS NULL"));
        }
    }
}

/// One row, one column: the cluster's latest telemetry time, `NULL` when it has none.
pub(crate) fn query<DB>(cluster: Option<&str>) -> QueryBuilder<DB>
where
    DB: Database,
    <DB as Database>::Arguments: Default,
    for<'t> String: Encode<'t, DB> + Type<DB>,
{
    let mut query = QueryBuilder::new(
        "WITH RECURSIVE cluster_namespaces(namespace) AS (SELECT (SELECT min(namespace) FROM spans WHERE ",
    );
    push_cluster(&mut query, "spans", cluster);
    query.push(") UNION ALL SELECT (SELECT min(namespace) FROM spans WHERE ");
    push_cluster(&mut query, "spans", cluster);
    query.push(
        " AND spans.namespace > cluster_namespaces.namespace) FROM cluster_namespaces \
         WHERE cluster_namespaces.namespace IS NOT NULL) \
         SELECT max(latest) FROM (SELECT (SELECT max(start_unix_nano) FROM spans WHERE ",
    );
    push_cluster(&mut query, "spans", cluster);
    query.push(
        " AND spans.namespace IS NULL) AS latest UNION ALL SELECT (SELECT max(start_unix_nano) FROM spans WHERE ",
    );
    push_cluster(&mut query, "spans", cluster);
    query.push(
        " AND spans.namespace = cluster_namespaces.namespace) FROM cluster_namespaces \
         WHERE cluster_namespaces.namespace IS NOT NULL \
         UNION ALL SELECT (SELECT max(time_unix_nano) FROM samples WHERE samples.series_id = series.id) FROM series WHERE ",
    );
    push_cluster(&mut query, "series", cluster);
    query.push(" UNION ALL SELECT (SELECT max(time_unix_nano) FROM logs WHERE ");
    push_cluster(&mut query, "logs", cluster);
    query.push(")) AS latest_of_each");
    query
}
