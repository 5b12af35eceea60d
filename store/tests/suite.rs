//! The store suite: every test is written once against the [`Store`] trait and instantiated
//! per backend by `store_suite!` (as Quickwit's metastore suite is). A new backend adds one
//! macro invocation and must pass all of it.

use std::collections::BTreeMap;

use lagscope_model::{
    Anomaly, AnomalyKind, CallFields, Component, HistogramPoint, LogRecord, MetricKind, Op, Outcome, PointValue,
    ResourceFields, Sample, SeriesKey, SeriesMeta, Severity, Span, SpanEvent, SpanKind, SpanLink, StateFields,
};
use lagscope_store::{AnomalyFilter, IngestBatch, PgStore, Reduce, RetentionCutoffs, SqliteStore, Store, TimeRange};
use serde_json::json;

macro_rules! store_suite {
    ($backend:ident, $open:expr) => {
        mod $backend {
            use super::*;

            macro_rules! case {
                ($name:ident) => {
                    #[tokio::test]
                    async fn $name() {
                        let (store, _guard) = $open.await;
                        super::$name(&store).await;
                    }
                };
            }

            case!(spans_round_trip_with_every_attribute);
            case!(a_resent_span_is_stored_once);
            case!(spans_that_drew_the_same_ids_are_both_stored);
            case!(a_resent_log_record_is_stored_once);
            case!(client_spans_bring_their_traces_and_respect_range_and_limit);
            case!(client_spans_cut_at_the_limit_through_ties_and_bring_many_traces);
            case!(client_spans_take_the_spans_of_their_traces_within_the_trace_window);
            case!(clients_of_traces_finds_the_client_of_a_hop);
            case!(series_range_matches_labels_and_time);
            case!(scope_and_cluster_samples_take_their_series_and_window);
            case!(scope_samples_come_back_whole_in_time_order);
            case!(anomalies_are_unique_by_fingerprint_and_filterable);
            case!(anomalies_seen_at_their_own_times_keep_them);
            case!(a_window_found_whole_replaces_its_partial_version);
            case!(a_flapping_found_from_calls_and_then_from_lines_is_one);
            case!(the_newest_of_a_kind_in_a_range_end_last_and_include_windows_across_its_end);
            case!(logs_round_trip_in_time_order);
            case!(recognised_logs_keep_the_cluster_window_and_phrases);
            case!(range_reads_filter_scope_time_and_limit);
            case!(retention_removes_what_is_older_than_the_cutoff);
            case!(concurrent_ingests_sharing_series_and_clients_all_commit);
            case!(latest_time_is_the_newest_span_start_or_sample);
            case!(a_clusters_latest_time_is_its_newest_span_sample_or_log_line);
            case!(discovery_lists_scopes_and_pages_through_clients);
            case!(anomaly_counts_group_what_the_filter_matches);
            case!(series_buckets_reduce_each_slice_of_the_range);
            case!(anomaly_filters_combine_and_can_leave_evidence_out);
            case!(read_rollups_replace_their_minute_and_scope);
            case!(a_pass_findings_store_anomalies_and_rollups_together);
            case!(alert_changes_incidents_and_outbox_survive_and_record_delivery);
            case!(the_span_feed_reads_as_of_an_id_and_what_was_committed_since);
        }
    };
}

async fn open_sqlite() -> (SqliteStore, tempfile::TempDir) {
    let directory = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open_dir(directory.path()).await.expect("store opens");
    (store, directory)
}

store_suite!(sqlite, open_sqlite());

#[path = "support/postgres.rs"]
mod postgres_support;

async fn open_postgres() -> (PgStore, ()) {
    let url = postgres_support::fresh_database().await;
    let store = PgStore::connect(&url).await.unwrap_or_else(|error| panic!("cannot open {url}: {error}"));
    (store, ())
}

store_suite!(postgres, open_postgres());

const SECOND: i64 = 1_000_000_000;
const T0: i64 = 1_764_435_600 * SECOND;

fn span(client: Option<&str>, component: Component, trace: u8, span_id: u8, parent: Option<u8>, start: i64) -> Span {
    Span {
        trace_id: Some(format!("{trace:032x}")),
        span_id: Some(format!("{span_id:016x}")),
        parent_span_id: parent.map(|parent| format!("{parent:016x}")),
        name: "getFileInfo".to_string(),
        kind: SpanKind::Client,
        start_unix_nano: start,
        end_unix_nano: start + SECOND / 10,
        status_code: 0,
        status_message: None,
        resource: ResourceFields {
            service_name: Some("hdfs-client".to_string()),
            component: Some(component),
            ..ResourceFields::default()
        },
        scope_name: None,
        scope_version: None,
        scope_attributes: Default::default(),
        call: CallFields { client_id: client.map(str::to_string), ..CallFields::default() },
        attributes: Default::default(),
        events: Vec::new(),
        links: Vec::new(),
    }
}

fn full_span() -> Span {
    let mut full = span(Some("c1"), Component::Client, 1, 1, None, T0);
    full.status_code = 2;
    // Text that must come back byte for byte, whatever escaping a read path uses.
    full.status_message = Some("boom \"quoted\" 'single' <script>alert(1)</script> \\ \u{1}\t\n é 🙂".to_string());
    full.resource = ResourceFields {
        service_name: Some("hdfs-client".to_string()),
        system: Some("hdfs-rbf".to_string()),
        cluster: Some("prod".to_string()),
        component: Some(Component::Client),
        node_id: Some("host-7".to_string()),
        attributes: json!({"host.name": "h7", "process.pid": 42}).as_object().cloned().unwrap_or_default(),
    };
    full.scope_name = Some("lagscope-test".to_string());
    full.scope_version = Some("1.0".to_string());
    full.scope_attributes = json!({"scope.attr": true}).as_object().cloned().unwrap_or_default();
    full.call = CallFields {
        client_id: Some("c1".to_string()),
        call_id: Some("call-9".to_string()),
        attempt: Some(2),
        namespace: Some("ns1".to_string()),
        op: Some(Op::Read),
        rpc_method: Some("getFileInfo".to_string()),
        target_node: Some("router-1".to_string()),
        target_role: Some("observer".to_string()),
        node_role: Some("observer".to_string()),
        consistency: Some("OBSERVER".to_string()),
        follower_read: Some(true),
        state: StateFields {
            carried: Some(1),
            returned: Some(2),
            served: Some(3),
            committed: Some(4),
            router: Some(5),
        },
        outcome: Some(Outcome::Other("throttled".to_string())),
        error_type: Some("org.apache.hadoop.ipc.RetriableException".to_string()),
        requeues: Some(6),
        retry_delay_ms: Some(7),
        bytes: Some(i64::MAX),
    };
    full.attributes = json!({"my.attr": "v", "my.list": [1, "two", 3.5], "my.map": {"k": null}})
        .as_object()
        .cloned()
        .unwrap_or_default();
    full.events = vec![SpanEvent {
        time_unix_nano: T0 + 5,
        name: "lagscope.failover".to_string(),
        attributes: json!({"lagscope.failover.to": "nn2"}).as_object().cloned().unwrap_or_default(),
    }];
    full.links = vec![SpanLink {
        trace_id: Some(format!("{:032x}", 9)),
        span_id: Some(format!("{:016x}", 9)),
        attributes: Default::default(),
    }];
    full
}

async fn spans_round_trip_with_every_attribute(store: &dyn Store) {
    let original = full_span();
    let receipt =
        store.ingest(&IngestBatch { spans: vec![original.clone()], ..IngestBatch::default() }).await.expect("ingest");
    assert_eq!(receipt.spans_written, 1);
    let read = store.client_spans("c1", TimeRange::ALL, 100).await.expect("read");
    assert_eq!(read, vec![original]);
}

async fn a_resent_span_is_stored_once(store: &dyn Store) {
    let batch = IngestBatch { spans: vec![full_span()], ..IngestBatch::default() };
    store.ingest(&batch).await.expect("first");
    let receipt = store.ingest(&batch).await.expect("second");
    assert_eq!(receipt.spans_written, 0);
    assert_eq!(store.stats().await.expect("stats").spans, 1);
    // A batch repeating a span, alongside a new one: the new one is stored, the repeat once.
    let mut other = full_span();
    other.span_id = Some(format!("{:016x}", 0xfeed));
    let repeating = IngestBatch { spans: vec![full_span(), other.clone(), other], ..IngestBatch::default() };
    assert_eq!(store.ingest(&repeating).await.expect("repeating").spans_written, 1);
    assert_eq!(store.stats().await.expect("stats").spans, 2);
}

/// Two different spans with the same ids (two runs of one seeded simulator, or ids drawn
/// badly) are both kept: only the ids and the start together make a span sent again.
async fn spans_that_drew_the_same_ids_are_both_stored(store: &dyn Store) {
    let first = full_span();
    let mut second = full_span();
    second.start_unix_nano += SECOND;
    second.end_unix_nano += SECOND;
    let receipt = store
        .ingest(&IngestBatch { spans: vec![first.clone(), second.clone()], ..IngestBatch::default() })
        .await
        .expect("ingest");
    assert_eq!(receipt.spans_written, 2);
    let again = store.ingest(&IngestBatch { spans: vec![second.clone()], ..IngestBatch::default() }).await;
    assert_eq!(again.expect("again").spans_written, 0);
    assert_eq!(store.client_spans("c1", TimeRange::ALL, 100).await.expect("read"), vec![first, second]);
}

/// OTLP log records have no ids: one identical to a stored one in every field is that record
/// sent again, and a record differing in any field (here its observed time, its attributes or
/// its resource) is another.
async fn a_resent_log_record_is_stored_once(store: &dyn Store) {
    let line = log(T0, "Cannot get available namenode for ns60 nn6002:8020 error: No namenodes available");
    let batch = IngestBatch { logs: vec![line.clone()], ..IngestBatch::default() };
    assert_eq!(store.ingest(&batch).await.expect("first").logs_written, 1);
    assert_eq!(store.ingest(&batch).await.expect("second").logs_written, 0);
    assert_eq!(store.stats().await.expect("stats").logs, 1);

    let mut observed_later = line.clone();
    observed_later.observed_time_unix_nano = Some(T0 + 2);
    let mut other_thread = line.clone();
    other_thread.attributes.insert("thread".to_string(), json!(8));
    let mut other_router = line.clone();
    other_router.resource.node_id = Some("router-2".to_string());
    // A batch repeating a stored record and a new one, alongside three that differ: the new
    // ones are stored once each.
    let logs = vec![line.clone(), observed_later.clone(), observed_later.clone(), other_thread.clone(), other_router];
    let receipt = store.ingest(&IngestBatch { logs, ..IngestBatch::default() }).await.expect("repeating");
    assert_eq!(receipt.logs_written, 3);
    assert_eq!(store.stats().await.expect("stats").logs, 4);
    let stored = store.logs(TimeRange::ALL, 10).await.expect("logs");
    assert_eq!(stored.iter().filter(|record| **record == line).count(), 1);
    assert_eq!(stored.iter().filter(|record| **record == observed_later).count(), 1);
    assert_eq!(stored.iter().filter(|record| **record == other_thread).count(), 1);
}

async fn client_spans_bring_their_traces_and_respect_range_and_limit(store: &dyn Store) {
    let spans = vec![
        span(Some("c1"), Component::Client, 1, 1, None, T0),
        span(None, Component::Router, 1, 2, Some(1), T0 + 1),
        span(None, Component::Server, 1, 3, Some(2), T0 + 2),
        span(Some("c1"), Component::Client, 2, 4, None, T0 + 10 * SECOND),
        span(None, Component::Server, 2, 5, Some(4), T0 + 10 * SECOND + 1),
        span(Some("c2"), Component::Client, 3, 6, None, T0),
    ];
    store.ingest(&IngestBatch { spans, ..IngestBatch::default() }).await.expect("ingest");

    let all = store.client_spans("c1", TimeRange::ALL, 100).await.expect("all");
    let ids: Vec<_> = all.iter().map(|span| span.span_id.clone().unwrap_or_default()).collect();
    assert_eq!(
        ids,
        ["0000000000000001", "0000000000000002", "0000000000000003", "0000000000000004", "0000000000000005"]
    );

    let first_trace = store.client_spans("c1", TimeRange { from: T0, to: T0 + SECOND }, 100).await.expect("range");
    assert_eq!(first_trace.len(), 3);

    let latest_only = store.client_spans("c1", TimeRange::ALL, 1).await.expect("limit");
    let ids: Vec<_> = latest_only.iter().map(|span| span.span_id.clone().unwrap_or_default()).collect();
    assert_eq!(ids, ["0000000000000004", "0000000000000005"]);

    assert!(store.client_spans("nobody", TimeRange::ALL, 100).await.expect("none").is_empty());
}

/// A busy client: more traces than one read of them takes (PostgreSQL splits them over
/// several connections), and client spans sharing their start at the limit's cut.
async fn client_spans_cut_at_the_limit_through_ties_and_bring_many_traces(store: &dyn Store) {
    let mut spans = Vec::new();
    for call in 0..90u8 {
        // Calls in pairs sharing a start, each with a server hop.
        let start = T0 + i64::from(call / 2) * SECOND;
        spans.push(span(Some("busy"), Component::Client, call + 1, 2 * call + 1, None, start));
        spans.push(span(None, Component::Server, call + 1, 2 * call + 2, Some(2 * call + 1), start + 1));
    }
    spans.push(span(Some("other"), Component::Client, 200, 250, None, T0 + 30 * SECOND));
    store.ingest(&IngestBatch { spans, ..IngestBatch::default() }).await.expect("ingest");

    let all = store.client_spans("busy", TimeRange::ALL, 1000).await.expect("all");
    assert_eq!(all.len(), 180, "every call's client span and hop");
    assert!(all.windows(2).all(|pair| pair[0].start_unix_nano <= pair[1].start_unix_nano), "in time order");

    // The 45 newest client spans: calls 89 down to 45; calls 44 and 45 share a start, so the
    // cut falls inside a tie and exactly one of them may come.
    let limited = store.client_spans("busy", TimeRange::ALL, 45).await.expect("limited");
    let clients: Vec<&Span> = limited.iter().filter(|span| span.call.client_id.is_some()).collect();
    assert_eq!(clients.len(), 45, "exactly the limit of the client's own spans");
    let cut = T0 + 22 * SECOND;
    assert!(clients.iter().all(|span| span.start_unix_nano >= cut), "only the newest");
    assert_eq!(clients.iter().filter(|span| span.start_unix_nano > cut).count(), 44, "every span after the cut");
    let traces: std::collections::BTreeSet<_> = clients.iter().map(|span| span.trace_id.clone()).collect();
    let hops: Vec<&Span> = limited.iter().filter(|span| span.call.client_id.is_none()).collect();
    assert_eq!(hops.len(), 45, "the hop of every call read");
    assert!(hops.iter().all(|hop| traces.contains(&hop.trace_id)), "only hops of those calls");
}

/// A trace's spans belong to a client's timeline when they start within
/// `TRACE_WINDOW_NANOS` of the client's spans in that trace (before or after).
async fn client_spans_take_the_spans_of_their_traces_within_the_trace_window(store: &dyn Store) {
    let window = lagscope_store::TRACE_WINDOW_NANOS;
    let spans = vec![
        span(Some("c1"), Component::Client, 1, 1, None, T0),
        span(None, Component::Server, 1, 2, Some(1), T0 - window + SECOND),
        span(None, Component::Server, 1, 3, Some(1), T0 + SECOND / 10 + window - SECOND),
        span(None, Component::Server, 1, 4, Some(1), T0 - window - SECOND),
        span(None, Component::Server, 1, 5, Some(1), T0 + 2 * window),
        // A later call of the same client: read with the first (one part), whose window then
        // covers span 5's time, which still lies outside its own trace's window.
        span(Some("c1"), Component::Client, 2, 6, None, T0 + 3 * window),
    ];
    store.ingest(&IngestBatch { spans, ..IngestBatch::default() }).await.expect("ingest");
    let read = store.client_spans("c1", TimeRange::ALL, 10).await.expect("read");
    let ids: Vec<_> = read.iter().map(|span| span.span_id.clone().unwrap_or_default()).collect();
    assert_eq!(ids, ["0000000000000002", "0000000000000001", "0000000000000003", "0000000000000006"]);
}

async fn clients_of_traces_finds_the_client_of_a_hop(store: &dyn Store) {
    let spans = vec![
        span(Some("c1"), Component::Client, 1, 1, None, T0),
        span(None, Component::Server, 1, 2, Some(1), T0),
        span(Some("c2"), Component::Client, 2, 3, None, T0),
    ];
    store.ingest(&IngestBatch { spans, ..IngestBatch::default() }).await.expect("ingest");
    let clients = store.clients_of_traces(&[format!("{:032x}", 1), format!("{:032x}", 7)]).await.expect("clients");
    assert_eq!(clients, ["c1"]);
    assert!(store.clients_of_traces(&[]).await.expect("empty").is_empty());
}

fn sample(name: &str, labels: &[(&str, &str)], time: i64, value: PointValue, kind: MetricKind) -> Sample {
    Sample {
        series: SeriesKey {
            name: name.to_string(),
            labels: labels.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect::<BTreeMap<_, _>>(),
        }
        .into(),
        meta: SeriesMeta { kind, unit: Some("1".to_string()), description: None }.into(),
        time_unix_nano: time,
        start_time_unix_nano: None,
        value,
    }
}

async fn series_range_matches_labels_and_time(store: &dyn Store) {
    let applied = "lagscope.server.applied_state";
    let obs1 = [("lagscope.node.id", "nn-obs1"), ("lagscope.namespace", "ns1")];
    let obs2 = [("lagscope.node.id", "nn-obs2"), ("lagscope.namespace", "ns1")];
    let samples = vec![
        sample(applied, &obs1, T0, PointValue::Number(100.0), MetricKind::Gauge),
        sample(applied, &obs1, T0 + SECOND, PointValue::Number(110.0), MetricKind::Gauge),
        sample(applied, &obs1, T0 + 2 * SECOND, PointValue::Number(120.0), MetricKind::Gauge),
        sample(applied, &obs2, T0, PointValue::Number(90.0), MetricKind::Gauge),
        sample(
            "rpc.latency",
            &obs1,
            T0,
            PointValue::Distribution(Box::new(HistogramPoint {
                count: 2,
                sum: Some(3.0),
                ..HistogramPoint::default()
            })),
            MetricKind::Histogram,
        ),
    ];
    let receipt = store.ingest(&IngestBatch { samples, ..IngestBatch::default() }).await.expect("ingest");
    assert_eq!(receipt.samples_written, 5);

    let matchers = vec![("lagscope.node.id".to_string(), "nn-obs1".to_string())];
    let series = store
        .series_samples(applied, &matchers, TimeRange { from: T0 + SECOND, to: T0 + 3 * SECOND })
        .await
        .expect("range");
    assert_eq!(series.len(), 1);
    assert_eq!(series[0].key.label("lagscope.node.id"), Some("nn-obs1"));
    let values: Vec<_> = series[0].points.iter().map(|point| point.1).collect();
    assert_eq!(values, [Some(110.0), Some(120.0)]);

    let both = store.series_samples(applied, &[], TimeRange::ALL).await.expect("all");
    assert_eq!(both.len(), 2);
    let none = store
        .series_samples(applied, &[("lagscope.node.id".to_string(), "x\"' OR 1=1".to_string())], TimeRange::ALL)
        .await
        .expect("hostile matcher");
    assert!(none.is_empty());

    let histogram = store.series_samples("rpc.latency", &[], TimeRange::ALL).await.expect("histogram");
    assert_eq!(histogram[0].meta.kind, MetricKind::Histogram);
    assert_eq!(histogram[0].points[0].2.as_ref().map(|value| value["count"].clone()), Some(json!(2)));
}

/// A chart's read: each slice of the range gives one point at its last sample's time, valued
/// by its last, smallest or largest value; samples without a value and outside the range are
/// left out; one slice of `Last` is the latest value.
async fn series_buckets_reduce_each_slice_of_the_range(store: &dyn Store) {
    let name = "lagscope.shard.inflight_bytes";
    let shard = [("lagscope.node.id", "es-1"), ("lagscope.namespace", "logs/0")];
    let other = [("lagscope.node.id", "es-2"), ("lagscope.namespace", "logs/1")];
    // Slices of 10 s from T0: [T0, T0+10s) holds 5, 9, 2; [T0+10s, T0+20s) holds 7 and a NaN
    // (stored without a value); T0+25s is outside a range ending at T0+20s.
    let mut samples: Vec<_> = [(0, 5.0), (3, 9.0), (9, 2.0), (12, 7.0), (15, f64::NAN), (25, 100.0)]
        .into_iter()
        .map(|(second, value)| sample(name, &shard, T0 + second * SECOND, PointValue::Number(value), MetricKind::Gauge))
        .collect();
    samples.push(sample(name, &other, T0 + SECOND, PointValue::Number(1.0), MetricKind::Gauge));
    store.ingest(&IngestBatch { samples, ..IngestBatch::default() }).await.expect("ingest");
    let range = TimeRange { from: T0, to: T0 + 20 * SECOND };
    let matchers = vec![("lagscope.node.id".to_string(), "es-1".to_string())];
    let points = |series: &[lagscope_store::SeriesSamples]| -> Vec<(i64, Option<f64>)> {
        assert_eq!(series.len(), 1, "{series:?}");
        series[0].points.iter().map(|(at, value, _)| ((at - T0) / SECOND, *value)).collect()
    };
    let last = store.series_buckets(name, &matchers, range, 2, Reduce::Last).await.expect("last");
    assert_eq!(last[0].key.label("lagscope.node.id"), Some("es-1"));
    assert_eq!(points(&last), [(9, Some(2.0)), (12, Some(7.0))]);
    let max = store.series_buckets(name, &matchers, range, 2, Reduce::Max).await.expect("max");
    assert_eq!(points(&max), [(9, Some(9.0)), (12, Some(7.0))]);
    let min = store.series_buckets(name, &matchers, range, 2, Reduce::Min).await.expect("min");
    assert_eq!(points(&min), [(9, Some(2.0)), (12, Some(7.0))]);
    let latest = store.series_buckets(name, &matchers, range, 1, Reduce::Last).await.expect("latest");
    assert_eq!(points(&latest), [(12, Some(7.0))]);
    // Every series of the metric, each with its own points; an empty range gives none.
    let both = store.series_buckets(name, &[], range, 4, Reduce::Last).await.expect("both");
    assert_eq!(both.len(), 2);
    assert_eq!(both.iter().map(|series| series.points.len()).collect::<Vec<_>>(), [3, 1]);
    let empty = TimeRange { from: T0, to: T0 };
    let none = store.series_buckets(name, &[], empty, 4, Reduce::Last).await.expect("empty range");
    assert!(none.iter().all(|series| series.points.is_empty()));
    let hostile = vec![("lagscope.node.id".to_string(), "x\"' OR 1=1".to_string())];
    assert!(store.series_buckets(name, &hostile, range, 4, Reduce::Last).await.expect("hostile").is_empty());
    // Values come back exactly, however many digits they need (state ids near 2^53, tiny and
    // huge magnitudes, negative zero's sign aside).
    let exact = [9_007_199_254_740_991.0, 0.1 + 0.2, 1e-300, -1.7976931348623157e308, 123_456_789.123_456_78];
    let name = "lagscope.server.applied_state";
    let samples: Vec<_> = exact
        .iter()
        .enumerate()
        .map(|(index, value)| {
            sample(name, &shard, T0 + index as i64 * SECOND, PointValue::Number(*value), MetricKind::Gauge)
        })
        .collect();
    store.ingest(&IngestBatch { samples, ..IngestBatch::default() }).await.expect("ingest exact");
    let range = TimeRange { from: T0, to: T0 + exact.len() as i64 * SECOND };
    for reduce in [Reduce::Last, Reduce::Min, Reduce::Max] {
        let each = store.series_buckets(name, &[], range, exact.len() as u32, reduce).await.expect("exact");
        let values: Vec<f64> = each[0].points.iter().filter_map(|(_, value, _)| *value).collect();
        assert_eq!(values, exact, "{reduce:?}");
    }
    let raw = store.series_samples(name, &[], range).await.expect("raw");
    let values: Vec<f64> = raw[0].points.iter().filter_map(|(_, value, _)| *value).collect();
    assert_eq!(values, exact, "series_samples");
}

/// A rollup replaces the stored one of its minute and scope (absent parts included), reads
/// come back in (minute, scope) order within the range, and retention removes old minutes.
async fn read_rollups_replace_their_minute_and_scope(store: &dyn Store) {
    let rollup = |minute: i64, node: Option<&str>, reads: u64| {
        let mut behind_states = lagscope_model::LogHistogram::default();
        behind_states.record(reads * 1_000);
        lagscope_model::ReadRollup {
            cluster: Some("prod".to_string()),
            namespace: Some("ns1".to_string()),
            node: node.map(str::to_string),
            minute_unix_nano: T0 + minute * 60 * SECOND,
            reads,
            compared: reads,
            behind_reads: 1,
            behind_states,
            max_behind_states: Some(reads as i64 * 1_000),
            max_behind_seconds: Some(1.5),
            ..lagscope_model::ReadRollup::default()
        }
    };
    let first = [rollup(0, Some("nn-obs1"), 3), rollup(0, None, 4), rollup(1, Some("nn-obs1"), 5)];
    store.upsert_read_rollups(&first).await.expect("upsert");
    // A later pass saw more of minute 0 of nn-obs1.
    store
        .upsert_read_rollups(&[rollup(0, Some("nn-obs1"), 7), rollup(2, Some("x' OR '1'='1"), 1)])
        .await
        .expect("again");
    let all = store.read_rollups(TimeRange::ALL, 100).await.expect("all");
    assert_eq!(all.len(), 4, "{all:?}");
    assert_eq!(all[0], rollup(0, None, 4));
    assert_eq!(all[1], rollup(0, Some("nn-obs1"), 7));
    assert_eq!(all[3].node.as_deref(), Some("x' OR '1'='1"));
    let middle =
        store.read_rollups(TimeRange { from: T0 + 60 * SECOND, to: T0 + 120 * SECOND }, 100).await.expect("range");
    assert_eq!(middle, [rollup(1, Some("nn-obs1"), 5)]);
    assert_eq!(store.read_rollups(TimeRange::ALL, 2).await.expect("limit").len(), 2);
    let report = store
        .enforce_retention(&RetentionCutoffs { spans: Some(T0 + 60 * SECOND), ..RetentionCutoffs::default() })
        .await
        .expect("retention");
    assert_eq!(report.rollups, 2);
    assert_eq!(store.read_rollups(TimeRange::ALL, 100).await.expect("after").len(), 2);
}

/// A pass's findings: its anomalies upserted as `upsert_anomalies` does (new, changed and
/// unchanged told apart) and its rollups as `upsert_read_rollups` does; either may be empty.
async fn a_pass_findings_store_anomalies_and_rollups_together(store: &dyn Store) {
    let rollup = |minute: i64, reads: u64| lagscope_model::ReadRollup {
        cluster: Some("prod".to_string()),
        namespace: Some("ns1".to_string()),
        node: Some("nn-obs1".to_string()),
        minute_unix_nano: T0 + minute * 60 * SECOND,
        reads,
        compared: reads,
        ..lagscope_model::ReadRollup::default()
    };
    let nothing = store.upsert_findings(&[], &[], T0).await.expect("nothing");
    assert_eq!((nothing.inserted.len(), nothing.updated, nothing.unchanged), (0, 0, 0));
    let first = store
        .upsert_findings(&[anomaly("a", "c1", T0), anomaly("b", "c2", T0)], &[rollup(0, 3)], T0)
        .await
        .expect("first");
    assert_eq!(first.inserted.len(), 2);
    let grown = Anomaly { end_unix_nano: T0 + 5 * SECOND, ..anomaly("a", "c1", T0) };
    let again = store
        .upsert_findings(&[grown.clone(), anomaly("b", "c2", T0)], &[rollup(0, 4), rollup(1, 1)], T0 + SECOND)
        .await
        .expect("again");
    assert_eq!((again.inserted.len(), again.updated, again.unchanged), (0, 1, 1));
    let only_rollups = store.upsert_findings(&[], &[rollup(1, 2)], T0 + 2 * SECOND).await.expect("rollups");
    assert!(only_rollups.inserted.is_empty());
    let stored = store.anomalies(&AnomalyFilter { limit: 10, ..AnomalyFilter::default() }).await.expect("anomalies");
    let a = stored.iter().find(|stored| stored.anomaly.fingerprint == "a").expect("a");
    assert_eq!(a.anomaly.end_unix_nano, grown.end_unix_nano);
    assert_eq!(stored.len(), 2);
    let rollups = store.read_rollups(TimeRange::ALL, 10).await.expect("rollups");
    assert_eq!(rollups, [rollup(0, 4), rollup(1, 2)]);
}

/// The alerter's feed gives each change once in order; its cursor, incidents and messages
/// commit together; delivery attempts are recorded; retention removes what is finished.
async fn alert_changes_incidents_and_outbox_survive_and_record_delivery(store: &dyn Store) {
    use lagscope_store::{AlertCursor, AlertIncident, DeliveryOutcome, NewAlertMessage};
    store.upsert_anomalies(&[anomaly("a", "c1", T0)], T0).await.expect("a");
    store.upsert_anomalies(&[anomaly("b", "c2", T0)], T0 + SECOND).await.expect("b");
    let changes = store.anomaly_changes(AlertCursor::default(), 10).await.expect("changes");
    assert_eq!(changes.iter().map(|c| c.anomaly.fingerprint.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    let after_a = changes[0].change_key();
    assert_eq!(store.anomaly_changes(after_a, 10).await.expect("after a").len(), 1);
    // Found again unchanged: no change. Changed later (its window grew): a change again, after b.
    store.upsert_anomalies(&[anomaly("a", "c1", T0)], T0 + 2 * SECOND).await.expect("a unchanged");
    let after_b = changes[1].change_key();
    assert!(store.anomaly_changes(after_b, 10).await.expect("none").is_empty());
    let grown = Anomaly { end_unix_nano: T0 + 3 * SECOND, ..anomaly("a", "c1", T0) };
    store.upsert_anomalies(&[grown], T0 + 2 * SECOND).await.expect("a again");
    let again = store.anomaly_changes(after_b, 10).await.expect("again");
    assert_eq!(again.iter().map(|c| c.anomaly.fingerprint.as_str()).collect::<Vec<_>>(), ["a"]);
    // The keys of a stretch of the feed: after one key, through another, in order, bounded.
    let (b, a_again) = (changes[1].change_key(), again[0].change_key());
    let keys = store.anomaly_change_keys(AlertCursor::default(), a_again, 10).await.expect("keys");
    assert_eq!(keys, [b, a_again]);
    assert_eq!(store.anomaly_change_keys(AlertCursor::default(), b, 10).await.expect("through b"), [b]);
    assert_eq!(store.anomaly_change_keys(b, a_again, 10).await.expect("after b"), [a_again]);
    assert_eq!(store.anomaly_change_keys(AlertCursor::default(), a_again, 1).await.expect("limit"), [b]);
    assert!(store.anomaly_change_keys(a_again, a_again, 10).await.expect("none").is_empty());

    assert_eq!(store.alert_state(0).await.expect("empty state"), (None, Vec::new()));
    let incident = |firing: bool, members: i64| AlertIncident {
        receiver: "am".to_string(),
        incident: "stale_read|prod|ns1|nn-obs1".to_string(),
        dedup_key: "lagscope-stale_read-0011".to_string(),
        firing,
        alert: json!({"labels": {"alertname": "stale_read"}}).to_string(),
        latest_anomaly_id: changes[1].id,
        members,
        last_member_unix_nano: T0,
        last_sent_unix_nano: T0,
    };
    let message = |event: &str, body: &str| NewAlertMessage {
        receiver: "am".to_string(),
        dedup_key: "lagscope-stale_read-0011".to_string(),
        event: event.to_string(),
        body: body.to_string(),
        created_unix_nano: T0,
    };
    store
        .commit_alerts(Some(after_b), &[incident(true, 2)], &[message("trigger", "[1]"), message("resolve", "[2]")])
        .await
        .expect("commit");
    store.commit_alerts(None, &[incident(true, 3)], &[]).await.expect("replace incident");
    let (cursor, firing) = store.alert_state(T0 + SECOND).await.expect("state");
    assert_eq!(cursor, Some(after_b));
    assert_eq!(firing, [incident(true, 3)]);

    let pending = store.pending_alert_messages(10).await.expect("pending");
    assert_eq!(
        pending.iter().map(|m| (m.event.as_str(), m.body.as_str())).collect::<Vec<_>>(),
        [("trigger", "[1]"), ("resolve", "[2]")]
    );
    let retry = DeliveryOutcome::Retry { next_attempt_unix_nano: T0 + 5 * SECOND, error: "503".to_string() };
    store.alert_message_attempted(pending[0].id, T0 + SECOND, &retry).await.expect("retry");
    let still = store.pending_alert_messages(10).await.expect("still pending");
    assert_eq!((still[0].attempts, still[0].next_attempt_unix_nano), (1, T0 + 5 * SECOND));
    assert_eq!(still[0].last_error.as_deref(), Some("503"));
    store.alert_message_attempted(pending[0].id, T0 + 6 * SECOND, &DeliveryOutcome::Delivered).await.expect("ok");
    let refused = DeliveryOutcome::Failed { error: "400 bad routing key".to_string() };
    store.alert_message_attempted(pending[1].id, T0 + 6 * SECOND, &refused).await.expect("failed");
    assert!(store.pending_alert_messages(10).await.expect("none").is_empty());
    let record = store.alert_messages(None, 10).await.expect("record");
    assert_eq!(record.iter().map(|m| m.state.as_str()).collect::<Vec<_>>(), ["failed", "delivered"]);
    assert_eq!(record[1].finished_unix_nano, Some(T0 + 6 * SECOND));
    assert_eq!(store.alert_messages(Some(record[0].id), 10).await.expect("page").len(), 1);

    store.commit_alerts(None, &[incident(false, 3)], &[]).await.expect("resolved");
    // Resolved: among the recent ones (last sent at T0), not among those since T0 + 1 s.
    assert_eq!(store.alert_state(T0).await.expect("recent").1, [incident(false, 3)]);
    assert!(store.alert_state(T0 + SECOND).await.expect("state").1.is_empty());
    let report = store
        .enforce_retention(&RetentionCutoffs { anomalies: Some(T0 + 60 * SECOND), ..RetentionCutoffs::default() })
        .await
        .expect("retention");
    assert_eq!(report.alerts, 3, "two finished messages and the resolved incident");
    assert!(store.alert_messages(None, 10).await.expect("after").is_empty());
}

/// A scope read takes its namespace's series and the cluster's namespace-less ones; a cluster
/// read takes every namespace (a node's shards compared with each other); both from the
/// window before the latest sample.
async fn scope_and_cluster_samples_take_their_series_and_window(store: &dyn Store) {
    let inflight = "lagscope.shard.inflight_bytes";
    let labels = |namespace: Option<&'static str>| {
        let mut labels = vec![("lagscope.cluster", "es-prod"), ("lagscope.node.id", "es-1")];
        labels.extend(namespace.map(|namespace| ("lagscope.namespace", namespace)));
        labels
    };
    let gauge = |namespace, time, value| {
        sample(inflight, &labels(namespace), time, PointValue::Number(value), MetricKind::Gauge)
    };
    let samples = vec![
        gauge(Some("shard-0"), T0, 1.0),
        gauge(Some("shard-0"), T0 + 100 * SECOND, 2.0),
        gauge(Some("shard-1"), T0 + 100 * SECOND, 3.0),
        gauge(None, T0 + 100 * SECOND, 4.0),
        sample(
            inflight,
            &[("lagscope.cluster", "other"), ("lagscope.namespace", "shard-0")],
            T0 + 100 * SECOND,
            PointValue::Number(5.0),
            MetricKind::Gauge,
        ),
    ];
    store.ingest(&IngestBatch { samples, ..IngestBatch::default() }).await.expect("ingest");
    let values = |samples: Vec<Sample>| {
        let mut values: Vec<f64> = samples
            .iter()
            .filter_map(|sample| match sample.value {
                PointValue::Number(value) => Some(value),
                _ => None,
            })
            .collect();
        values.sort_by(f64::total_cmp);
        values
    };
    let scope = store.scope_samples(Some("es-prod"), Some("shard-0"), 1_000 * SECOND).await.expect("scope");
    assert_eq!(values(scope), [1.0, 2.0, 4.0], "the shard's own series and the namespace-less one");
    let recent = store.scope_samples(Some("es-prod"), Some("shard-0"), 10 * SECOND).await.expect("scope");
    assert_eq!(values(recent), [2.0, 4.0], "only the window before the latest sample");
    let cluster = store.cluster_samples(Some("es-prod"), &[inflight], 10 * SECOND).await.expect("cluster");
    assert_eq!(values(cluster), [2.0, 3.0, 4.0], "every namespace of the cluster, no other cluster");
    let other = store.cluster_samples(Some("es-prod"), &["lagscope.shard.limit_bytes"], 10 * SECOND).await;
    assert!(other.expect("other metric").is_empty(), "only the metrics asked for");
    assert!(store.cluster_samples(Some("absent"), &[inflight], 10 * SECOND).await.expect("absent").is_empty());
}

/// What a scope read returns is each sample as ingested (values that are not whole, NaN,
/// start times, distributions, units), in time order.
async fn scope_samples_come_back_whole_in_time_order(store: &dyn Store) {
    let node =
        |node: &'static str| [("lagscope.cluster", "hdfs"), ("lagscope.namespace", "ns1"), ("lagscope.node.id", node)];
    let mut samples = Vec::new();
    for step in 0..40_i64 {
        let time = T0 + step * SECOND;
        let applied = 1_000.0 + step as f64 * 0.1 + 1e-9;
        samples.push(sample(
            "lagscope.server.applied_state",
            &node("nn-1"),
            time,
            PointValue::Number(applied),
            MetricKind::Gauge,
        ));
        let mut requeues = sample(
            "lagscope.server.requeues",
            &node("nn-2"),
            time,
            PointValue::Number(-(step as f64 + 1.0) / 3.0),
            MetricKind::UpDownCounter,
        );
        requeues.start_time_unix_nano = Some(T0 - SECOND);
        samples.push(requeues);
        if step % 7 == 3 {
            samples.push(sample(
                "lagscope.server.lag",
                &node("nn-2"),
                time,
                PointValue::Number(f64::NAN),
                MetricKind::Gauge,
            ));
        }
        if step % 5 == 0 {
            let histogram = lagscope_model::HistogramPoint {
                count: step as u64,
                sum: Some(step as f64 * 1.5),
                min: Some(0.25),
                max: None,
                explicit_bounds: vec![0.5, 1.0],
                bucket_counts: vec![1, 2, step as u64],
                ..lagscope_model::HistogramPoint::default()
            };
            let mut point = sample(
                "rpc.queue.time",
                &node("nn-1"),
                time,
                PointValue::Distribution(Box::new(histogram)),
                MetricKind::Histogram,
            );
            std::sync::Arc::make_mut(&mut point.meta).description = Some("queue time".to_string());
            samples.push(point);
        }
    }
    // Ingested newest first, in two batches.
    let mut sent = samples.clone();
    sent.reverse();
    let later = sent.split_off(sent.len() / 2);
    store.ingest(&IngestBatch { samples: sent, ..IngestBatch::default() }).await.expect("ingest");
    store.ingest(&IngestBatch { samples: later, ..IngestBatch::default() }).await.expect("ingest");
    let read = store.scope_samples(Some("hdfs"), Some("ns1"), 1_000 * SECOND).await.expect("scope");
    assert!(read.is_sorted_by_key(|sample| sample.time_unix_nano), "in time order");
    // Compared whole, samples of one time by series (the order of a time's samples is not
    // promised); NaN compared as text.
    let whole = |samples: &[Sample]| {
        let mut texts: Vec<(i64, String)> =
            samples.iter().map(|sample| (sample.time_unix_nano, format!("{sample:?}"))).collect();
        texts.sort();
        texts
    };
    assert_eq!(whole(&read), whole(&samples));
    let window = store.scope_samples(Some("hdfs"), Some("ns1"), 10 * SECOND).await.expect("window");
    let expected: Vec<Sample> =
        samples.iter().filter(|sample| sample.time_unix_nano >= T0 + 29 * SECOND).cloned().collect();
    assert_eq!(whole(&window), whole(&expected), "the window before the latest sample, its first instant included");
    // From a time on: the same samples, in the same order, each with its series' id (the same
    // id for one series, another for each other series, ordered by time then id). Compared as
    // text (NaN).
    let texts =
        |samples: &mut dyn Iterator<Item = &Sample>| samples.map(|sample| format!("{sample:?}")).collect::<Vec<_>>();
    let all = store.scope_samples_from(Some("hdfs"), Some("ns1"), 1_000 * SECOND, i64::MIN).await.expect("from");
    assert_eq!(texts(&mut all.iter().map(|(_, sample)| sample)), texts(&mut read.iter()));
    let ids: BTreeMap<i64, &lagscope_model::SeriesKey> =
        all.iter().map(|(id, sample)| (*id, &*sample.series)).collect();
    let series: std::collections::BTreeSet<&lagscope_model::SeriesKey> = ids.values().copied().collect();
    assert_eq!((ids.len(), series.len()), (4, 4), "one id a series");
    assert!(all.iter().all(|(id, sample)| *ids[id] == *sample.series));
    assert!(all.is_sorted_by_key(|(id, sample)| (sample.time_unix_nano, *id)), "by time, then series id");
    let from = store.scope_samples_from(Some("hdfs"), Some("ns1"), 1_000 * SECOND, T0 + 35 * SECOND).await;
    let expected = all.iter().filter(|(_, sample)| sample.time_unix_nano >= T0 + 35 * SECOND);
    let expected: Vec<(i64, String)> = expected.map(|(id, sample)| (*id, format!("{sample:?}"))).collect();
    let from: Vec<(i64, String)> =
        from.expect("from").iter().map(|(id, sample)| (*id, format!("{sample:?}"))).collect();
    assert!(!expected.is_empty());
    assert_eq!(from, expected, "from its first instant on");
    // The window still applies: from before it gives the window.
    let windowed = store.scope_samples_from(Some("hdfs"), Some("ns1"), 10 * SECOND, T0).await.expect("windowed");
    assert_eq!(texts(&mut windowed.iter().map(|(_, sample)| sample)), texts(&mut window.iter()));
}

fn anomaly(fingerprint: &str, client: &str, start: i64) -> Anomaly {
    Anomaly {
        kind: AnomalyKind::StaleRead,
        severity: Severity::Critical,
        cluster: Some("prod".to_string()),
        namespace: Some("ns1".to_string()),
        client_id: Some(client.to_string()),
        node_id: Some("nn-obs1".to_string()),
        start_unix_nano: start,
        end_unix_nano: start + SECOND,
        summary: "stale".to_string(),
        cause: "lag".to_string(),
        evidence: json!({"guarantee": "read_your_writes", "floor": 120, "served": 110}).into(),
        open: false,
        fingerprint: fingerprint.to_string(),
    }
}

async fn the_newest_of_a_kind_in_a_range_end_last_and_include_windows_across_its_end(store: &dyn Store) {
    let range = TimeRange { from: T0 + 100 * SECOND, to: T0 + 200 * SECOND };
    let at = |fingerprint: &str, kind: AnomalyKind, start: i64, end: i64| Anomaly {
        kind,
        start_unix_nano: T0 + start * SECOND,
        end_unix_nano: T0 + end * SECOND,
        ..anomaly(fingerprint, "c1", 0)
    };
    // Inserted in an order unlike their ends: ids do not decide which are newest.
    let anomalies = vec![
        at("late-read", AnomalyKind::StaleRead, 190, 191),
        at("before", AnomalyKind::StaleRead, 50, 60),
        at("early-read", AnomalyKind::StaleRead, 110, 111),
        at("after", AnomalyKind::StaleRead, 250, 251),
        at("across-start", AnomalyKind::StaleRead, 90, 120),
        at("mid-read", AnomalyKind::StaleRead, 150, 151),
        at("across-end", AnomalyKind::StaleRead, 195, 300),
        at("other-kind", AnomalyKind::ApplyLag, 150, 160),
    ];
    store.upsert_anomalies(&anomalies, T0).await.expect("stored");
    let fingerprints = |listed: Vec<lagscope_store::StoredAnomaly>| {
        assert!(listed.windows(2).all(|pair| pair[0].id > pair[1].id), "newest id first");
        assert!(listed.iter().all(|stored| stored.anomaly.evidence.value().is_null()), "no evidence read");
        let mut names: Vec<String> = listed.into_iter().map(|stored| stored.anomaly.fingerprint).collect();
        names.sort();
        names
    };
    // Room for all: every one in the range, the window across its end too.
    let all = store.newest_of_kind(AnomalyKind::StaleRead, range, 10).await.expect("all");
    assert_eq!(fingerprints(all), ["across-end", "across-start", "early-read", "late-read", "mid-read"]);
    // Cut: those ending last inside the range (a window across the end is left for room).
    let cut = store.newest_of_kind(AnomalyKind::StaleRead, range, 2).await.expect("cut");
    assert_eq!(fingerprints(cut), ["late-read", "mid-read"]);
    let four = store.newest_of_kind(AnomalyKind::StaleRead, range, 4).await.expect("four");
    assert_eq!(fingerprints(four), ["across-start", "early-read", "late-read", "mid-read"]);
    let other = store.newest_of_kind(AnomalyKind::ApplyLag, range, 10).await.expect("other kind");
    assert_eq!(fingerprints(other), ["other-kind"]);
    let none = store.newest_of_kind(AnomalyKind::PinnedRetry, range, 10).await.expect("none");
    assert!(none.is_empty());
}

/// An open `unfair_rejection` window of shard `logs/1`'s `role` on `es-node-1`, from `start` to
/// `end` seconds after T0, fingerprinted by where it starts (as the detector names it).
fn unfair_window(start: i64, end: i64, role: &str) -> Anomaly {
    Anomaly {
        kind: AnomalyKind::UnfairRejection,
        client_id: None,
        node_id: Some("es-node-1".to_string()),
        namespace: Some("logs/1".to_string()),
        start_unix_nano: T0 + start * SECOND,
        end_unix_nano: T0 + end * SECOND,
        evidence: json!({"role": role, "spans": []}).into(),
        open: true,
        fingerprint: format!("unfair_rejection|prod|logs/1|es-node-1|{role}|{start}"),
        ..anomaly("", "", 0)
    }
}

/// A window stored from part of its telemetry and found again whole, starting earlier (under
/// another fingerprint), is one incident: the whole is listed, the partial is closed and points
/// at it, and the alerter's feed sees it change. Whichever comes first, the earliest start is
/// kept; another role of the shard, a window that does not overlap, and a call's own anomalies
/// (named by their attempt) stand beside it.
async fn a_window_found_whole_replaces_its_partial_version(store: &dyn Store) {
    use lagscope_store::AlertCursor;
    let window = unfair_window;
    let listed = || async {
        let all = store.anomalies(&AnomalyFilter { limit: 100, ..AnomalyFilter::default() }).await.expect("list");
        let mut fingerprints: Vec<String> = all.into_iter().map(|stored| stored.anomaly.fingerprint).collect();
        fingerprints.sort();
        fingerprints
    };
    let partial = store.upsert_anomalies(&[window(65, 68, "primary")], T0).await.expect("partial");
    assert_eq!((partial.inserted.len(), partial.superseded), (1, 0));
    let partial_id = partial.inserted[0];
    // Found whole: it replaces the partial.
    let whole = store.upsert_anomalies(&[window(64, 79, "primary")], T0 + SECOND).await.expect("whole");
    assert_eq!((whole.inserted.len(), whole.superseded), (1, 1));
    let whole_id = whole.inserted[0];
    assert_eq!(listed().await, [window(64, 79, "primary").fingerprint]);
    let replaced = store.anomaly(partial_id).await.expect("get").expect("kept");
    assert_eq!(replaced.superseded_by, Some(whole_id));
    assert!(!replaced.anomaly.open, "closed as it was replaced");
    let counts = store.anomaly_counts(&AnomalyFilter::default()).await.expect("counts");
    assert_eq!(counts.iter().map(|count| count.count).sum::<i64>(), 1, "{counts:?}");
    let changes = store.anomaly_changes(AlertCursor::default(), 100).await.expect("changes");
    let change = changes.iter().find(|change| change.id == partial_id).expect("the partial changed");
    assert!(change.superseded_by.is_some() && change.last_seen_unix_nano > T0);
    // Found partial again later (a pass that read less): replaced at once, not new.
    let again = store.upsert_anomalies(&[window(66, 70, "primary")], T0 + 2 * SECOND).await.expect("again");
    assert_eq!((again.inserted.len(), again.superseded), (0, 1));
    // The replaced partial found again as it was: not revived.
    let revived = store.upsert_anomalies(&[window(65, 70, "primary")], T0 + 3 * SECOND).await.expect("revive");
    assert_eq!((revived.inserted.len(), revived.updated, revived.superseded), (0, 0, 0));
    // Another role, a later window of the same subject, and overlapping stale reads stand.
    let others = [
        window(65, 68, "replica"),
        window(90, 95, "primary"),
        Anomaly { start_unix_nano: T0 + 64 * SECOND, ..anomaly("read-1", "c1", 0) },
        Anomaly { start_unix_nano: T0 + 64 * SECOND, ..anomaly("read-2", "c1", 0) },
    ];
    let outcome = store.upsert_anomalies(&others, T0 + 4 * SECOND).await.expect("others");
    assert_eq!((outcome.inserted.len(), outcome.superseded), (4, 0));
    assert_eq!(listed().await.len(), 5);
}

/// A run of `client`'s switches from `start` to `end` seconds after T0, as found from its calls'
/// addresses or from its logged lines (`source`).
fn flapping_run(client: &str, start: i64, end: i64, source: Option<&str>) -> Anomaly {
    let mut evidence = json!({"switches": 3, "switch_times_unix_nano": [T0 + start * SECOND, T0 + end * SECOND]});
    if let Some(source) = source {
        evidence["source"] = json!(source);
    }
    Anomaly {
        kind: AnomalyKind::FailoverFlapping,
        cluster: Some("pulsar-east".to_string()),
        namespace: None,
        client_id: Some(client.to_string()),
        node_id: None,
        start_unix_nano: T0 + start * SECOND,
        end_unix_nano: T0 + end * SECOND,
        evidence: evidence.into(),
        open: false,
        fingerprint: format!("failover_flapping|pulsar-east|{client}|{start}"),
        ..anomaly("", "", 0)
    }
}

/// A client's flapping found from the addresses its calls went to (the first switch seen by
/// the call after it), then from its switch lines that came later (the first switch itself):
/// one incident, the earlier start kept. Another client's run, and a later run, stand.
async fn a_flapping_found_from_calls_and_then_from_lines_is_one(store: &dyn Store) {
    let from_calls = store.upsert_anomalies(&[flapping_run("p1", 183, 190, None)], T0).await.expect("calls");
    assert_eq!((from_calls.inserted.len(), from_calls.superseded), (1, 0));
    let from_lines =
        store.upsert_anomalies(&[flapping_run("p1", 180, 190, Some("client log"))], T0 + SECOND).await.expect("lines");
    assert_eq!((from_lines.inserted.len(), from_lines.superseded), (1, 1));
    let others = [flapping_run("p2", 183, 190, None), flapping_run("p1", 400, 410, Some("client log"))];
    let outcome = store.upsert_anomalies(&others, T0 + 2 * SECOND).await.expect("others");
    assert_eq!((outcome.inserted.len(), outcome.superseded), (2, 0));
    let all = store.anomalies(&AnomalyFilter { limit: 10, ..AnomalyFilter::default() }).await.expect("list");
    let mut listed: Vec<&str> = all.iter().map(|stored| stored.anomaly.fingerprint.as_str()).collect();
    listed.sort_unstable();
    assert_eq!(
        listed,
        [
            "failover_flapping|pulsar-east|p1|180",
            "failover_flapping|pulsar-east|p1|400",
            "failover_flapping|pulsar-east|p2|183"
        ]
    );
}

/// Anomalies upserted together, each seen at its own time (an import's): each keeps its own
/// first and last seen, and they are upserted in their order (the same fingerprint twice is
/// one anomaly, changed by the second), as one upsert each would.
async fn anomalies_seen_at_their_own_times_keep_them(store: &dyn Store) {
    let grown = Anomaly { end_unix_nano: T0 + 3 * SECOND, ..anomaly("a", "c1", T0) };
    let outcome = store
        .upsert_anomalies_seen_at(&[
            (anomaly("a", "c1", T0), T0 + 5 * SECOND),
            (anomaly("b", "c2", T0 + 100 * SECOND), T0 + 7 * SECOND),
            (grown.clone(), T0 + 9 * SECOND),
            (anomaly("b", "c2", T0 + 100 * SECOND), T0 + 11 * SECOND),
        ])
        .await
        .expect("upserted");
    assert_eq!((outcome.inserted.len(), outcome.updated, outcome.unchanged), (2, 1, 1));
    let all = store.anomalies(&AnomalyFilter { limit: 10, ..AnomalyFilter::default() }).await.expect("all");
    let seen: Vec<_> = all
        .iter()
        .map(|stored| (stored.anomaly.fingerprint.as_str(), stored.first_seen_unix_nano, stored.last_seen_unix_nano))
        .collect();
    assert_eq!(seen, [("b", T0 + 7 * SECOND, T0 + 7 * SECOND), ("a", T0 + 5 * SECOND, T0 + 9 * SECOND)]);
    assert_eq!(all[1].anomaly.end_unix_nano, grown.end_unix_nano);
    assert!(store.upsert_anomalies_seen_at(&[]).await.expect("nothing").inserted.is_empty());
}

async fn anomalies_are_unique_by_fingerprint_and_filterable(store: &dyn Store) {
    let first = store
        .upsert_anomalies(&[anomaly("a", "c1", T0), anomaly("b", "c2", T0 + 100 * SECOND)], T0)
        .await
        .expect("insert");
    assert_eq!(first.inserted.len(), 2);
    let stored_at = |fingerprint: &'static str| async move {
        let all = store.anomalies(&AnomalyFilter { limit: 10, ..AnomalyFilter::default() }).await.expect("all");
        let stored = all.into_iter().find(|stored| stored.anomaly.fingerprint == fingerprint).expect("stored");
        (stored.last_seen_unix_nano, stored.anomaly)
    };
    // Found again as it is: not written, last seen kept.
    let again = store.upsert_anomalies(&[anomaly("a", "c1", T0)], T0 + SECOND).await.expect("again");
    assert!(again.inserted.is_empty());
    assert_eq!((again.updated, again.unchanged), (0, 1));
    assert_eq!(stored_at("a").await.0, T0);

    let all = store.anomalies(&AnomalyFilter { limit: 10, ..AnomalyFilter::default() }).await.expect("all");
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].anomaly.fingerprint, "b", "newest first");
    assert_eq!(all[1].anomaly.evidence["floor"], json!(120));

    let by_client = AnomalyFilter { client_id: Some("c1".to_string()), limit: 10, ..AnomalyFilter::default() };
    assert_eq!(store.anomalies(&by_client).await.expect("client").len(), 1);
    let late = AnomalyFilter { since: Some(T0 + 50 * SECOND), limit: 10, ..AnomalyFilter::default() };
    let late = store.anomalies(&late).await.expect("since");
    assert_eq!(late.iter().map(|stored| stored.anomaly.fingerprint.as_str()).collect::<Vec<_>>(), ["b"]);
    let early = AnomalyFilter { until: Some(T0 + 50 * SECOND), limit: 10, ..AnomalyFilter::default() };
    assert_eq!(store.anomalies(&early).await.expect("until").len(), 1);
    let page = AnomalyFilter { before_id: Some(all[0].id), limit: 10, ..AnomalyFilter::default() };
    assert_eq!(store.anomalies(&page).await.expect("page")[0].id, all[1].id);

    let fetched = store.anomaly(all[1].id).await.expect("get").expect("present");
    assert_eq!(fetched.anomaly, anomaly("a", "c1", T0));
    assert!(store.anomaly(9_999).await.expect("get").is_none());

    store.upsert_anomalies(&[anomaly("z", "c3", T0)], T0).await.expect("z");
    // Each change is written, with a later last seen: a longer window, another summary,
    // other evidence, a status.
    let longer = Anomaly { end_unix_nano: T0 + 5 * SECOND, ..anomaly("z", "c3", T0) };
    let summary = Anomaly { summary: "staler".to_string(), ..longer.clone() };
    let evidence = Anomaly { evidence: json!({"floor": 121}).into(), ..summary.clone() };
    let open = Anomaly { open: true, ..evidence.clone() };
    for (step, changed) in [longer, summary, evidence, open].into_iter().enumerate() {
        let seen = T0 + (2 + step as i64) * SECOND;
        let outcome = store.upsert_anomalies(std::slice::from_ref(&changed), seen).await.expect("changed");
        assert_eq!((outcome.updated, outcome.unchanged), (1, 0), "change {step}");
        assert_eq!(stored_at("z").await, (seen, changed.clone()), "change {step}");
    }
    // A shorter window found later (less of it read) changes nothing: the stored one is kept.
    let shorter = Anomaly {
        end_unix_nano: T0 + 2 * SECOND,
        open: true,
        summary: "staler".to_string(),
        evidence: json!({"floor": 121}).into(),
        ..anomaly("z", "c3", T0)
    };
    let outcome = store.upsert_anomalies(&[shorter], T0 + 9 * SECOND).await.expect("shorter");
    assert_eq!((outcome.updated, outcome.unchanged), (0, 1));
    assert_eq!(stored_at("z").await.1.end_unix_nano, T0 + 5 * SECOND);
}

fn log(time: i64, body: &str) -> LogRecord {
    LogRecord {
        time_unix_nano: time,
        observed_time_unix_nano: Some(time + 1),
        severity_number: 13,
        severity_text: Some("WARN".to_string()),
        body: json!(body),
        event_name: None,
        trace_id: Some(format!("{:032x}", 5)),
        span_id: Some(format!("{:016x}", 6)),
        resource: ResourceFields {
            service_name: Some("hdfs-router".to_string()),
            cluster: Some("prod".to_string()),
            component: Some(Component::Router),
            node_id: Some("router-1".to_string()),
            ..ResourceFields::default()
        },
        scope_name: Some("org.apache.hadoop.hdfs.server.federation.router.RouterRpcClient".to_string()),
        scope_version: None,
        attributes: json!({"lagscope.namespace": "ns60", "thread": 7}).as_object().cloned().unwrap_or_default(),
    }
}

async fn latest_time_is_the_newest_span_start_or_sample(store: &dyn Store) {
    assert_eq!(store.latest_time().await.expect("empty"), None);
    let spans = vec![
        span(Some("c1"), Component::Client, 1, 1, None, T0),
        span(Some("c1"), Component::Client, 2, 2, None, T0 + 5),
    ];
    store.ingest(&IngestBatch { spans, ..IngestBatch::default() }).await.expect("spans");
    assert_eq!(store.latest_time().await.expect("spans only"), Some(T0 + 5));
    let samples = vec![sample("m", &[], T0 + 9, PointValue::Number(1.0), MetricKind::Gauge)];
    store.ingest(&IngestBatch { samples, ..IngestBatch::default() }).await.expect("samples");
    assert_eq!(store.latest_time().await.expect("a later sample"), Some(T0 + 9));
    let late = vec![span(Some("c2"), Component::Client, 3, 3, None, T0 + 20)];
    store.ingest(&IngestBatch { spans: late, ..IngestBatch::default() }).await.expect("span");
    assert_eq!(store.latest_time().await.expect("a later span"), Some(T0 + 20));
}

async fn a_clusters_latest_time_is_its_newest_span_sample_or_log_line(store: &dyn Store) {
    assert_eq!(store.cluster_latest_time(Some("prod")).await.expect("empty"), None);
    assert_eq!(store.cluster_latest_time(None).await.expect("empty"), None);
    let in_scope = |cluster: Option<&str>, namespace: Option<&str>, id: u8, start: i64| {
        let mut span = span(Some("c1"), Component::Client, id, id, None, start);
        span.resource.cluster = cluster.map(str::to_string);
        span.call.namespace = namespace.map(str::to_string);
        span
    };
    // The newest span of `prod` is in the middle one of its namespaces (each is looked at).
    let spans = vec![
        in_scope(Some("prod"), Some("ns1"), 1, T0 + 5),
        in_scope(Some("prod"), Some("ns2"), 2, T0 + 30),
        in_scope(Some("prod"), Some("ns3"), 3, T0 + 7),
        in_scope(Some("prod"), None, 4, T0 + 12),
        in_scope(Some("test"), Some("ns1"), 5, T0 + 100),
        in_scope(None, Some("ns1"), 6, T0 + 3),
    ];
    store.ingest(&IngestBatch { spans, ..IngestBatch::default() }).await.expect("spans");
    assert_eq!(store.cluster_latest_time(Some("prod")).await.expect("spans"), Some(T0 + 30));
    assert_eq!(store.cluster_latest_time(Some("test")).await.expect("spans"), Some(T0 + 100));
    assert_eq!(store.cluster_latest_time(None).await.expect("spans"), Some(T0 + 3));
    assert_eq!(store.cluster_latest_time(Some("nope")).await.expect("spans"), None);
    // A namespace-less span alone counts too.
    let late = vec![in_scope(Some("prod"), None, 7, T0 + 40)];
    store.ingest(&IngestBatch { spans: late, ..IngestBatch::default() }).await.expect("span");
    assert_eq!(store.cluster_latest_time(Some("prod")).await.expect("spans"), Some(T0 + 40));
    // Then a sample of one of its series, and of a series naming no cluster.
    let samples = vec![
        sample(
            "m",
            &[("lagscope.cluster", "prod"), ("lagscope.node.id", "n1")],
            T0 + 50,
            PointValue::Number(1.0),
            MetricKind::Gauge,
        ),
        sample(
            "m",
            &[("lagscope.cluster", "prod"), ("lagscope.node.id", "n2")],
            T0 + 45,
            PointValue::Number(1.0),
            MetricKind::Gauge,
        ),
        sample("m", &[], T0 + 60, PointValue::Number(1.0), MetricKind::Gauge),
    ];
    store.ingest(&IngestBatch { samples, ..IngestBatch::default() }).await.expect("samples");
    assert_eq!(store.cluster_latest_time(Some("prod")).await.expect("samples"), Some(T0 + 50));
    assert_eq!(store.cluster_latest_time(None).await.expect("samples"), Some(T0 + 60));
    assert_eq!(store.cluster_latest_time(Some("test")).await.expect("samples"), Some(T0 + 100));
    // Then a log line of it (`log` names cluster `prod`).
    store.ingest(&IngestBatch { logs: vec![log(T0 + 70, "a line")], ..IngestBatch::default() }).await.expect("log");
    assert_eq!(store.cluster_latest_time(Some("prod")).await.expect("logs"), Some(T0 + 70));
    assert_eq!(store.cluster_latest_time(Some("test")).await.expect("logs"), Some(T0 + 100));
}

async fn discovery_lists_scopes_and_pages_through_clients(store: &dyn Store) {
    assert!(store.scopes().await.expect("no series").is_empty());
    assert!(store.clients(None, 10).await.expect("no spans").is_empty());
    let mut spans = Vec::new();
    for (index, client) in ["c3", "c1", "c2", "c1", "c3"].iter().enumerate() {
        spans.push(span(Some(client), Component::Client, index as u8 + 1, index as u8 + 1, None, T0 + index as i64));
    }
    // A hop names no client: not listed.
    spans.push(span(None, Component::Server, 1, 9, Some(1), T0));
    let samples = vec![
        sample(
            "m",
            &[("lagscope.cluster", "a"), ("lagscope.namespace", "ns1"), ("lagscope.node.id", "n2")],
            T0,
            PointValue::Number(1.0),
            MetricKind::Gauge,
        ),
        sample(
            "m",
            &[("lagscope.cluster", "a"), ("lagscope.namespace", "ns1"), ("lagscope.node.id", "n1")],
            T0,
            PointValue::Number(1.0),
            MetricKind::Gauge,
        ),
        sample(
            "other",
            &[("lagscope.cluster", "a"), ("lagscope.namespace", "ns1"), ("lagscope.node.id", "n1")],
            T0,
            PointValue::Number(1.0),
            MetricKind::Gauge,
        ),
        sample("m", &[("lagscope.cluster", "b")], T0, PointValue::Number(1.0), MetricKind::Gauge),
    ];
    store.ingest(&IngestBatch { spans, samples, ..IngestBatch::default() }).await.expect("ingest");
    let scopes = store.scopes().await.expect("scopes");
    let named = |scope: &lagscope_store::Scope| (scope.cluster.clone(), scope.namespace.clone(), scope.node_id.clone());
    let some = |text: &str| Some(text.to_string());
    assert_eq!(
        scopes.iter().map(named).collect::<Vec<_>>(),
        vec![(some("a"), some("ns1"), some("n1")), (some("a"), some("ns1"), some("n2")), (some("b"), None, None)]
    );
    assert_eq!(store.clients(None, 10).await.expect("all"), vec!["c1", "c2", "c3"]);
    assert_eq!(store.clients(None, 2).await.expect("first page"), vec!["c1", "c2"]);
    assert_eq!(store.clients(Some("c2"), 2).await.expect("second page"), vec!["c3"]);
    assert!(store.clients(Some("c3"), 2).await.expect("past the end").is_empty());
}

async fn anomaly_counts_group_what_the_filter_matches(store: &dyn Store) {
    let mut open = anomaly("f-open", "c1", T0);
    open.open = true;
    let batch =
        [anomaly("f-1", "c1", T0), anomaly("f-2", "c2", T0 + SECOND), anomaly("f-3", "c1", T0 + 50 * SECOND), open];
    store.upsert_anomalies(&batch, T0).await.expect("upsert");
    let all = store.anomaly_counts(&AnomalyFilter::default()).await.expect("counts");
    assert_eq!(all.iter().map(|count| count.count).sum::<i64>(), 4, "{all:?}");
    assert_eq!(all.iter().filter(|count| count.open).map(|count| count.count).sum::<i64>(), 1, "{all:?}");
    let early = AnomalyFilter { until: Some(T0 + 10 * SECOND), ..AnomalyFilter::default() };
    assert_eq!(store.anomaly_counts(&early).await.expect("counts").iter().map(|count| count.count).sum::<i64>(), 3);
    let one_client = AnomalyFilter { client_id: Some("c2".to_string()), ..AnomalyFilter::default() };
    let counted = store.anomaly_counts(&one_client).await.expect("counts");
    assert_eq!(counted.len(), 1);
    assert_eq!((counted[0].kind.as_str(), counted[0].count), ("stale_read", 1));
}

/// Every condition of a filter holds at once (each backend builds only the conditions given),
/// and a list may leave the evidence out.
async fn anomaly_filters_combine_and_can_leave_evidence_out(store: &dyn Store) {
    let mut lag = anomaly("lag-1", "c1", T0 + 10 * SECOND);
    lag.kind = AnomalyKind::ApplyLag;
    lag.client_id = None;
    lag.open = true;
    lag.end_unix_nano = T0 + 200 * SECOND;
    let mut other_cluster = anomaly("s-3", "c1", T0 + 20 * SECOND);
    other_cluster.cluster = Some("dr".to_string());
    // One at a time: ids follow this order (within one batch, a backend may order its upserts).
    for anomaly in [anomaly("s-1", "c1", T0), anomaly("s-2", "c2", T0 + 30 * SECOND), other_cluster, lag] {
        store.upsert_anomalies(&[anomaly], T0).await.expect("upsert");
    }
    let fingerprints = |found: Vec<lagscope_store::StoredAnomaly>| -> Vec<String> {
        found.into_iter().map(|stored| stored.anomaly.fingerprint).collect()
    };
    let filter = |kind, cluster: Option<&str>, since, until, open| AnomalyFilter {
        kind,
        cluster: cluster.map(str::to_string),
        since,
        until,
        open,
        limit: 10,
        ..AnomalyFilter::default()
    };
    let stale = Some(AnomalyKind::StaleRead);
    assert_eq!(
        fingerprints(store.anomalies(&filter(stale, Some("prod"), None, None, None)).await.expect("query")),
        ["s-2", "s-1"]
    );
    // A window overlapping the range: ends at or after its start, starts before its end.
    let overlapping = filter(None, None, Some(T0 + 15 * SECOND), Some(T0 + 25 * SECOND), None);
    assert_eq!(fingerprints(store.anomalies(&overlapping).await.expect("query")), ["lag-1", "s-3"]);
    let open_lag = filter(Some(AnomalyKind::ApplyLag), Some("prod"), Some(T0 + 150 * SECOND), None, Some(true));
    assert_eq!(fingerprints(store.anomalies(&open_lag).await.expect("query")), ["lag-1"]);
    let resolved = filter(None, Some("prod"), None, None, Some(false));
    assert_eq!(fingerprints(store.anomalies(&resolved).await.expect("query")), ["s-2", "s-1"]);
    assert!(
        store.anomalies(&filter(stale, Some("dr"), None, Some(T0 + 5 * SECOND), None)).await.expect("query").is_empty()
    );
    let limited = AnomalyFilter { limit: 1, ..filter(stale, None, None, None, None) };
    assert_eq!(fingerprints(store.anomalies(&limited).await.expect("query")), ["s-3"]);
    let hostile =
        AnomalyFilter { cluster: Some("prod' OR '1'='1".to_string()), ..filter(None, None, None, None, None) };
    assert!(store.anomalies(&hostile).await.expect("query").is_empty());
    assert!(store.anomaly_counts(&hostile).await.expect("query").is_empty());

    let light = AnomalyFilter { skip_evidence: true, ..filter(stale, None, None, None, None) };
    let light = store.anomalies(&light).await.expect("without evidence");
    assert_eq!(light.len(), 3);
    assert!(light.iter().all(|stored| stored.anomaly.evidence.value().is_null()), "{light:?}");
    assert_eq!(light[0].anomaly.summary, "stale");
    let counted = store.anomaly_counts(&filter(None, Some("prod"), None, None, Some(true))).await.expect("open");
    assert_eq!(counted.iter().map(|count| (count.kind.as_str(), count.count)).collect::<Vec<_>>(), [("apply_lag", 1)]);
}

async fn logs_round_trip_in_time_order(store: &dyn Store) {
    let late = log(T0 + SECOND, "Cannot get available namenode for ns60 nn6002:8020 error: No namenodes available");
    let early = log(T0, "Observer Node is too far behind: serverStateId = 1 clientStateId = 50000001");
    let receipt = store
        .ingest(&IngestBatch { logs: vec![late.clone(), early.clone()], ..IngestBatch::default() })
        .await
        .expect("ingest");
    assert_eq!(receipt.logs_written, 2);
    assert_eq!(store.logs(TimeRange::ALL, 10).await.expect("logs"), vec![early.clone(), late]);
    assert_eq!(store.logs(TimeRange { from: T0, to: T0 + 1 }, 10).await.expect("range"), vec![early]);
    assert_eq!(store.stats().await.expect("stats").logs, 2);
}

async fn recognised_logs_keep_the_cluster_window_and_phrases(store: &dyn Store) {
    let in_cluster = |time: i64, body: &str, cluster: &str| {
        let mut record = log(time, body);
        record.resource.cluster = Some(cluster.to_string());
        record
    };
    let old = in_cluster(T0, "Cannot get available namenode for ns1 a:1 error: x", "prod");
    let hit = in_cluster(T0 + 100 * SECOND, "Cannot get available namenode for ns1 a:1 error: x", "prod");
    let chatter = in_cluster(T0 + 101 * SECOND, "GC pause 12 ms", "prod");
    let quoted = in_cluster(T0 + 102 * SECOND, "rejected execution of primary operation [\"q\"]", "prod");
    let elsewhere = in_cluster(T0 + 103 * SECOND, "Cannot get available namenode for ns1 b:1 error: x", "staging");
    let logs = vec![old, hit.clone(), chatter, quoted.clone(), elsewhere];
    store.ingest(&IngestBatch { logs, ..IngestBatch::default() }).await.expect("ingest");
    let window = 10 * SECOND;
    let found = store.recognised_logs(Some("prod"), window, 100).await.expect("logs");
    assert_eq!(found, vec![hit, quoted.clone()], "the cluster's failure lines in the window, oldest first");
    let latest = store.recognised_logs(Some("prod"), window, 1).await.expect("logs");
    assert_eq!(latest, vec![quoted], "the limit keeps the most recent");
    assert_eq!(store.recognised_logs(None, window, 100).await.expect("logs"), Vec::new());
}

async fn range_reads_filter_scope_time_and_limit(store: &dyn Store) {
    let in_scope = |client: &str, trace: u8, start: i64, cluster: &str, namespace: &str| {
        let mut span = span(Some(client), Component::Client, trace, trace, None, start);
        span.resource.cluster = Some(cluster.to_string());
        span.call.namespace = Some(namespace.to_string());
        span
    };
    let mut spans = vec![
        in_scope("a", 1, T0, "c1", "ns1"),
        in_scope("a", 2, T0 + SECOND, "c1", "ns1"),
        in_scope("b", 3, T0 + 2 * SECOND, "c1", "ns2"),
        in_scope("c", 4, T0 + 3 * SECOND, "c2", "ns1"),
    ];
    spans[1].call.state.committed = Some(70);
    spans[3].call.state.committed = Some(90);
    let applied = "lagscope.server.applied_state";
    let samples = vec![
        sample(
            applied,
            &[("lagscope.cluster", "c1"), ("lagscope.namespace", "ns1")],
            T0,
            PointValue::Number(1.0),
            MetricKind::Gauge,
        ),
        sample(
            applied,
            &[("lagscope.cluster", "c1"), ("lagscope.namespace", "ns2")],
            T0,
            PointValue::Number(2.0),
            MetricKind::Gauge,
        ),
        sample(
            "lagscope.probe.up",
            &[("lagscope.cluster", "c1")],
            T0 + SECOND,
            PointValue::Number(3.0),
            MetricKind::Gauge,
        ),
        sample(
            applied,
            &[("lagscope.cluster", "c2"), ("lagscope.namespace", "ns1")],
            T0,
            PointValue::Number(4.0),
            MetricKind::Gauge,
        ),
    ];
    store.ingest(&IngestBatch { spans, samples, ..IngestBatch::default() }).await.expect("ingest");
    let starts = |spans: Vec<Span>| spans.iter().map(|span| (span.start_unix_nano - T0) / SECOND).collect::<Vec<_>>();

    let all = store.spans_in_range(None, None, TimeRange::ALL, 100).await.expect("all");
    assert_eq!(starts(all), [0, 1, 2, 3]);
    let c1 = store.spans_in_range(Some("c1"), None, TimeRange::ALL, 100).await.expect("c1");
    assert_eq!(starts(c1), [0, 1, 2]);
    let ns1 = store.spans_in_range(None, Some("ns1"), TimeRange::ALL, 100).await.expect("ns1");
    assert_eq!(starts(ns1), [0, 1, 3]);
    let window = store
        .spans_in_range(Some("c1"), Some("ns1"), TimeRange { from: T0 + SECOND, to: T0 + 10 * SECOND }, 100)
        .await
        .expect("window");
    assert_eq!(starts(window), [1]);
    let limited = store.spans_in_range(None, None, TimeRange::ALL, 2).await.expect("limited");
    assert_eq!(starts(limited), [0, 1], "the oldest first");
    let hostile = store.spans_in_range(Some("c1' OR 1=1 --"), None, TimeRange::ALL, 100).await.expect("hostile");
    assert!(hostile.is_empty());

    let values =
        |samples: Vec<Sample>| samples.iter().filter_map(|sample| sample.value.as_number()).collect::<Vec<_>>();
    let c1_ns1 = store.samples_in_range(Some("c1"), Some("ns1"), TimeRange::ALL, 100).await.expect("samples");
    assert_eq!(values(c1_ns1), [1.0, 3.0], "the namespace's series and the cluster's series without one");
    let c1 = store.samples_in_range(Some("c1"), None, TimeRange::ALL, 100).await.expect("samples");
    assert_eq!(c1.len(), 3);
    let later =
        store.samples_in_range(None, None, TimeRange { from: T0 + SECOND, to: i64::MAX }, 100).await.expect("samples");
    assert_eq!(values(later), [3.0]);

    let named = store.named_samples_in_range(&[applied], TimeRange::ALL, 100).await.expect("named");
    assert_eq!(values(named), [1.0, 2.0, 4.0], "the named series only, in time and series order");
    let named = store.named_samples_in_range(&[applied, "lagscope.probe.up"], TimeRange::ALL, 2).await.expect("named");
    assert_eq!(values(named), [1.0, 2.0], "the oldest first");
    let named = store
        .named_samples_in_range(&["lagscope.probe.up"], TimeRange { from: T0 + 2 * SECOND, to: i64::MAX }, 100)
        .await
        .expect("named");
    assert!(named.is_empty());
    let hostile = store.named_samples_in_range(&["x') OR 1=1 --"], TimeRange::ALL, 100).await.expect("hostile");
    assert!(hostile.is_empty());

    let committed = store.committed_on_spans(TimeRange::ALL, 100).await.expect("committed");
    let reported = |committed: Vec<lagscope_store::CommittedOnSpan>| {
        committed
            .into_iter()
            .map(|on| (on.cluster, on.namespace, on.end_unix_nano, on.state_committed))
            .collect::<Vec<_>>()
    };
    let end = |index: i64| T0 + index * SECOND + SECOND / 10;
    assert_eq!(
        reported(committed),
        [(Some("c1".into()), Some("ns1".into()), end(1), 70), (Some("c2".into()), Some("ns1".into()), end(3), 90)]
    );
    let later = store.committed_on_spans(TimeRange { from: T0 + 2 * SECOND, to: i64::MAX }, 100).await.expect("later");
    assert_eq!(reported(later).len(), 1);
    let limited = store.committed_on_spans(TimeRange::ALL, 1).await.expect("limited");
    assert_eq!(reported(limited)[0].3, 70, "the oldest first");

    // A series' samples of one read share its key and meta (its labels parsed once).
    let again = sample(
        applied,
        &[("lagscope.cluster", "c1"), ("lagscope.namespace", "ns1")],
        T0 + 5 * SECOND,
        PointValue::Number(5.0),
        MetricKind::Gauge,
    );
    store.ingest(&IngestBatch { samples: vec![again], ..IngestBatch::default() }).await.expect("ingest");
    let c1_ns1 = store.samples_in_range(Some("c1"), Some("ns1"), TimeRange::ALL, 100).await.expect("samples");
    assert_eq!(values(c1_ns1.clone()), [1.0, 3.0, 5.0]);
    assert!(std::sync::Arc::ptr_eq(&c1_ns1[0].series, &c1_ns1[2].series), "one key for the series");
    assert!(std::sync::Arc::ptr_eq(&c1_ns1[0].meta, &c1_ns1[2].meta), "one meta for the series");
    let named = store.named_samples_in_range(&[applied], TimeRange::ALL, 100).await.expect("named");
    assert_eq!(values(named.clone()), [1.0, 2.0, 4.0, 5.0]);
    assert!(std::sync::Arc::ptr_eq(&named[0].series, &named[3].series), "one key for the series");
}

/// Now, to the nanosecond (retention works on wall-clock cut-offs; PostgreSQL keeps recent
/// days in partitions of their own).
fn now() -> i64 {
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    i64::try_from(since_epoch.as_nanos()).expect("before 2262")
}

const DAY: i64 = 86_400 * SECOND;

/// Three days of telemetry and anomalies, one day kept.
async fn old_and_recent(store: &dyn Store) -> (i64, i64) {
    let (old, recent) = (now() - 3 * DAY, now() - SECOND);
    let applied = "lagscope.node.applied_state";
    let batch = IngestBatch {
        spans: vec![
            span(Some("c1"), Component::Client, 1, 1, None, old),
            span(None, Component::Server, 1, 2, Some(1), old + SECOND),
            span(Some("c1"), Component::Client, 2, 3, None, recent),
        ],
        samples: vec![
            sample(applied, &[("lagscope.node.id", "nn1")], old, PointValue::Number(1.0), MetricKind::Gauge),
            sample(applied, &[("lagscope.node.id", "nn1")], recent, PointValue::Number(2.0), MetricKind::Gauge),
        ],
        logs: vec![log(old, "old line"), log(recent, "recent line")],
    };
    store.ingest(&batch).await.expect("ingest");
    let mut open_old = anomaly("open-old", "c1", old);
    open_old.open = true;
    let anomalies = [anomaly("resolved-old", "c1", old), open_old, anomaly("resolved-recent", "c1", recent)];
    store.upsert_anomalies(&anomalies, recent).await.expect("anomalies");
    (old, recent)
}

async fn retention_removes_what_is_older_than_the_cutoff(store: &dyn Store) {
    let (_, recent) = old_and_recent(store).await;
    let cutoff = now() - DAY;
    let everything =
        RetentionCutoffs { spans: Some(cutoff), samples: Some(cutoff), logs: Some(cutoff), anomalies: Some(cutoff) };
    let report = store.enforce_retention(&everything).await.expect("retention");
    // SQLite deletes rows; PostgreSQL drops the old day's partitions (no rows to delete).
    assert!(
        report.spans == 2 || report.partitions_dropped.iter().any(|name| name.starts_with("spans_p")),
        "{report:?}"
    );
    assert_eq!(report.anomalies, 1, "the open anomaly stays: {report:?}");

    let spans = store.spans_in_range(None, None, TimeRange::ALL, 100).await.expect("spans");
    assert_eq!(spans.iter().map(|span| span.start_unix_nano).collect::<Vec<_>>(), [recent]);
    let samples = store.samples_in_range(None, None, TimeRange::ALL, 100).await.expect("samples");
    assert_eq!(samples.iter().map(|sample| sample.time_unix_nano).collect::<Vec<_>>(), [recent]);
    let logs = store.logs(TimeRange::ALL, 100).await.expect("logs");
    assert_eq!(logs.iter().map(|record| record.time_unix_nano).collect::<Vec<_>>(), [recent]);
    let listed = store.anomalies(&AnomalyFilter { limit: 10, ..AnomalyFilter::default() }).await.expect("list");
    let mut kept: Vec<&str> = listed.iter().map(|stored| stored.anomaly.fingerprint.as_str()).collect();
    kept.sort_unstable();
    assert_eq!(kept, ["open-old", "resolved-recent"]);
    // Queries still answer, and new data still goes in.
    assert_eq!(store.client_spans("c1", TimeRange::ALL, 10).await.expect("timeline").len(), 1);
    store
        .ingest(&IngestBatch {
            spans: vec![span(Some("c2"), Component::Client, 9, 9, None, now())],
            ..Default::default()
        })
        .await
        .expect("ingest after retention");
    assert_eq!(store.stats().await.expect("stats").spans, 2);

    let again = store.enforce_retention(&everything).await.expect("second pass");
    assert_eq!((again.spans, again.samples, again.logs, again.anomalies), (0, 0, 0, 0));
    assert!(again.partitions_dropped.is_empty(), "{again:?}");
}

/// PostgreSQL drops whole daily partitions (no row-by-row delete) and keeps today's.
#[tokio::test]
async fn postgres_retention_drops_whole_partitions() {
    let (store, ()) = open_postgres().await;
    let (old, recent) = old_and_recent(&store).await;
    let day_of = |time: i64| time.div_euclid(DAY);
    let exists = |name: String| {
        let pool = store.pool().clone();
        async move {
            let (found,): (Option<String>,) =
                sqlx::query_as("SELECT to_regclass($1)::text").bind(name).fetch_one(&pool).await.expect("catalog");
            found.is_some()
        }
    };
    for (table, _) in lagscope_store::PARTITIONED_TABLES {
        assert!(exists(lagscope_store::day_partition_name(table, day_of(old))).await, "{table} has the old day");
    }
    let cutoff = now() - DAY;
    let cutoffs = RetentionCutoffs { spans: Some(cutoff), samples: Some(cutoff), logs: Some(cutoff), anomalies: None };
    let report = store.enforce_retention(&cutoffs).await.expect("retention");
    assert_eq!((report.spans, report.samples, report.logs), (0, 0, 0), "no row deleted one by one: {report:?}");
    for (table, _) in lagscope_store::PARTITIONED_TABLES {
        let old_partition = lagscope_store::day_partition_name(table, day_of(old));
        assert!(report.partitions_dropped.contains(&old_partition), "{old_partition} dropped: {report:?}");
        assert!(!exists(old_partition).await);
        assert!(exists(lagscope_store::day_partition_name(table, day_of(recent))).await, "today's {table} stays");
    }
}

/// SQLite is one process's file: no leases, the live analyzer uses in-memory marks.
#[tokio::test]
async fn sqlite_has_no_coordinator() {
    let (store, _directory) = open_sqlite().await;
    assert!(store.coordinator().is_none());
}

/// Leases split the shards between live instances, move to the survivor when one stops
/// renewing, and a clean release hands them over at once.
#[tokio::test]
async fn postgres_leases_split_shards_and_move_when_an_instance_stops() {
    use lagscope_store::SHARDS;
    use std::time::Duration;
    let (store, ()) = open_postgres().await;
    let coordinator = store.coordinator().expect("PostgreSQL coordinates instances");
    let lease = Duration::from_millis(1_500);
    let first = coordinator.balance("a", lease).await.expect("a balances");
    assert_eq!(first.shards, (0..SHARDS).collect::<Vec<_>>(), "alone, a takes every shard");
    assert_eq!(first.live_instances, 1);
    // b arrives: nothing is free yet, but a sees two live instances and gives up half.
    let arriving = coordinator.balance("b", lease).await.expect("b balances");
    assert!(arriving.shards.is_empty(), "{arriving:?}");
    let shrunk = coordinator.balance("a", lease).await.expect("a balances again");
    assert_eq!(shrunk.shards.len(), (SHARDS / 2) as usize, "{shrunk:?}");
    assert_eq!(shrunk.released.len(), (SHARDS / 2) as usize);
    let joined = coordinator.balance("b", lease).await.expect("b claims");
    assert_eq!(joined.claimed, shrunk.released, "b takes exactly what a gave up");
    let status = coordinator.status().await.expect("status");
    assert!(status.unowned_shards.is_empty(), "{status:?}");
    let held: Vec<usize> = status.instances.iter().map(|instance| instance.shards.len()).collect();
    assert_eq!(held, vec![(SHARDS / 2) as usize; 2], "{status:?}");
    // a stops renewing (a crash): its leases run out and b takes them, not before.
    let early = coordinator.balance("b", lease).await.expect("b renews");
    assert_eq!(early.shards.len(), (SHARDS / 2) as usize, "a's leases are still valid: {early:?}");
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    let took_over = coordinator.balance("b", lease).await.expect("b takes over");
    assert_eq!(took_over.shards, (0..SHARDS).collect::<Vec<_>>(), "{took_over:?}");
    assert_eq!(took_over.live_instances, 1);
    let status = coordinator.status().await.expect("status");
    let a = status.instances.iter().find(|instance| instance.instance == "a").expect("a is still listed");
    assert!(!a.alive && a.shards.is_empty(), "{a:?}");
    // A clean stop releases at once: a newcomer gets everything on its first round.
    coordinator.release("b").await.expect("b releases");
    let newcomer = coordinator.balance("c", lease).await.expect("c balances");
    assert_eq!(newcomer.shards.len(), SHARDS as usize, "{newcomer:?}");
}

/// Marks are committed with the data; an analysed mark is removed unless a batch marked it
/// again after it was read (that batch's data must be analysed too).
#[tokio::test]
async fn postgres_marks_follow_ingest_and_survive_a_remark() {
    use lagscope_store::{Mark, SHARDS};
    let (store, ()) = open_postgres().await;
    let coordinator = store.coordinator().expect("coordinator");
    let all: Vec<i32> = (0..SHARDS).collect();
    let mut client_span = span(Some("client-7"), Component::Client, 1, 1, None, T0);
    client_span.resource.cluster = Some("prod".into());
    client_span.call.namespace = Some("ns1".into());
    let server_span = span(None, Component::Server, 2, 2, None, T0 + SECOND);
    let batch = IngestBatch { spans: vec![client_span.clone(), server_span], ..IngestBatch::default() };
    store.ingest(&batch).await.expect("ingest");
    let pending = coordinator.pending_marks(&all, 100).await.expect("marks");
    let marks: Vec<&Mark> = pending.iter().map(|pending| &pending.mark).collect();
    assert!(marks.contains(&&Mark::Client("client-7".into())), "{marks:?}");
    assert!(marks.contains(&&Mark::Scope(Some("prod".into()), Some("ns1".into()))), "{marks:?}");
    let trace = format!("{:032x}", 2);
    assert!(marks.contains(&&Mark::Trace(trace)), "the client-less hop marks its trace: {marks:?}");
    // Only the shards asked for.
    let client_shard = Mark::Client("client-7".into()).shard();
    let others: Vec<i32> = all.iter().copied().filter(|shard| *shard != client_shard).collect();
    let elsewhere = coordinator.pending_marks(&others, 100).await.expect("marks");
    assert!(elsewhere.iter().all(|pending| pending.mark.shard() != client_shard), "{elsewhere:?}");
    // The client is marked again while its first mark is being analysed.
    let mut again = client_span;
    again.span_id = Some("0000000000000009".into());
    store.ingest(&IngestBatch { spans: vec![again], ..IngestBatch::default() }).await.expect("ingest again");
    coordinator.finish_marks(&pending).await.expect("finish");
    let left = coordinator.pending_marks(&all, 100).await.expect("marks");
    let left: Vec<&Mark> = left.iter().map(|pending| &pending.mark).collect();
    assert!(left.contains(&&Mark::Client("client-7".into())), "the re-marked client stays: {left:?}");
    assert!(!left.iter().any(|mark| matches!(mark, Mark::Trace(_))), "finished marks are gone: {left:?}");
    // Finishing the latest read removes it.
    let latest = coordinator.pending_marks(&all, 100).await.expect("marks");
    coordinator.finish_marks(&latest).await.expect("finish");
    assert!(coordinator.pending_marks(&all, 100).await.expect("marks").is_empty());
    assert_eq!(coordinator.status().await.expect("status").pending_marks, 0);
    // Marks added by an analyzer (a trace's clients) land in their own shards.
    coordinator.add_marks(&[Mark::Client("client-8".into())]).await.expect("add");
    let shard = Mark::Client("client-8".into()).shard();
    let found = coordinator.pending_marks(&[shard], 10).await.expect("marks");
    assert_eq!(found.iter().map(|pending| &pending.mark).collect::<Vec<_>>(), vec![&Mark::Client("client-8".into())]);
}

/// A scope's mark carries the oldest time of the samples committed to it since it was last
/// finished (a mark written again keeps the older time); other marks, and scopes marked by
/// spans alone, carry none. What the live analyzer's sample cache reads again from.
#[tokio::test]
async fn postgres_scope_marks_carry_their_oldest_sample_time() {
    use lagscope_model::conventions::{CLUSTER, NAMESPACE, NODE_ID};
    use lagscope_store::Mark;
    let (store, ()) = open_postgres().await;
    let coordinator = store.coordinator().expect("coordinator");
    let all: Vec<i32> = (0..lagscope_store::SHARDS).collect();
    let number = PointValue::Number(1.0);
    let ns1 = [(CLUSTER, "prod"), (NAMESPACE, "ns1"), (NODE_ID, "nn-1")];
    let cluster_wide = [(CLUSTER, "prod"), (NODE_ID, "nn-1")];
    let samples = vec![
        sample("lagscope.server.applied_state", &ns1, T0 + 5 * SECOND, number.clone(), MetricKind::Gauge),
        sample("lagscope.server.applied_state", &ns1, T0 + 3 * SECOND, number.clone(), MetricKind::Gauge),
        sample("lagscope.server.requeues", &cluster_wide, T0 + 7 * SECOND, number.clone(), MetricKind::Gauge),
    ];
    let mut client_span = span(Some("client-7"), Component::Client, 1, 1, None, T0);
    client_span.resource.cluster = Some("prod".into());
    client_span.call.namespace = Some("ns2".into());
    store.ingest(&IngestBatch { spans: vec![client_span], samples, ..IngestBatch::default() }).await.expect("ingest");
    let scope = |namespace: Option<&str>| Mark::Scope(Some("prod".into()), namespace.map(str::to_string));
    let from = |pending: &[lagscope_store::PendingMark]| -> BTreeMap<Mark, Option<i64>> {
        pending.iter().map(|pending| (pending.mark.clone(), pending.samples_from)).collect()
    };
    let pending = coordinator.pending_marks(&all, 100).await.expect("marks");
    let expected = BTreeMap::from([
        (Mark::Client("client-7".into()), None),
        (scope(Some("ns1")), Some(T0 + 3 * SECOND)),
        (scope(Some("ns2")), None),
        (scope(None), Some(T0 + 7 * SECOND)),
    ]);
    assert_eq!(from(&pending), expected);
    // Marked again while being analysed, with a newer sample and an older one: the older
    // time stays with what waits, and only the mark written again is left.
    let again = vec![
        sample("lagscope.server.applied_state", &ns1, T0 + 9 * SECOND, number.clone(), MetricKind::Gauge),
        sample("lagscope.server.requeues", &cluster_wide, T0 + SECOND, number.clone(), MetricKind::Gauge),
    ];
    store.ingest(&IngestBatch { samples: again, ..IngestBatch::default() }).await.expect("ingest again");
    let remarked = from(&coordinator.pending_marks(&all, 100).await.expect("marks"));
    assert_eq!(remarked[&scope(Some("ns1"))], Some(T0 + 3 * SECOND), "{remarked:?}");
    assert_eq!(remarked[&scope(None)], Some(T0 + SECOND), "{remarked:?}");
    coordinator.finish_marks(&pending).await.expect("finish");
    let left = from(&coordinator.pending_marks(&all, 100).await.expect("marks"));
    let expected = BTreeMap::from([(scope(Some("ns1")), Some(T0 + 3 * SECOND)), (scope(None), Some(T0 + SECOND))]);
    assert_eq!(left, expected);
    // Once finished, the next samples start afresh.
    coordinator.finish_marks(&coordinator.pending_marks(&all, 100).await.expect("marks")).await.expect("finish");
    let later = vec![sample("lagscope.server.applied_state", &ns1, T0 + 11 * SECOND, number, MetricKind::Gauge)];
    store.ingest(&IngestBatch { samples: later, ..IngestBatch::default() }).await.expect("ingest later");
    let fresh = from(&coordinator.pending_marks(&all, 100).await.expect("marks"));
    assert_eq!(fresh, BTreeMap::from([(scope(Some("ns1")), Some(T0 + 11 * SECOND))]));
}

/// Which clients called cluster URLs from a process, as instances note them: a process with
/// one client seen within the window has it as its owner, one with several has none, "no
/// cluster" is not the empty cluster, and pairs not seen within the window are forgotten.
#[tokio::test]
async fn postgres_process_owners_are_the_one_client_seen_within_the_window() {
    let (store, ()) = open_postgres().await;
    let coordinator = store.coordinator().expect("coordinator");
    let asked: [(Option<&str>, &str); 5] = [
        (Some("east"), "app-1"),
        (Some("east"), "app-2"),
        (None, "app-1"),
        (Some(""), "app-1"),
        (Some("east"), "app-3"),
    ];
    let window = std::time::Duration::from_secs(600);
    // Two instances note their own clients; the same pair twice in one call is one.
    coordinator
        .note_process_clients(&[(Some("east"), "app-1", "producer-1"), (Some("east"), "app-1", "producer-1")])
        .await
        .expect("a notes");
    coordinator
        .note_process_clients(&[(Some("east"), "app-2", "producer-2"), (None, "app-1", "producer-9")])
        .await
        .expect("b notes");
    let owners = coordinator.process_owners(&asked, window).await.expect("owners");
    let producer = |n: u32| Some(format!("producer-{n}"));
    assert_eq!(owners, vec![producer(1), producer(2), producer(9), None, None]);
    // A second client of app-1, noted by another instance: app-1's lines are no one's.
    coordinator.note_process_clients(&[(Some("east"), "app-1", "producer-3")]).await.expect("c notes");
    let owners = coordinator.process_owners(&asked, window).await.expect("owners");
    assert_eq!(owners, vec![None, producer(2), producer(9), None, None]);
    // Outside a short window nothing counts; forgotten, nothing is left to count.
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    let short = std::time::Duration::from_millis(20);
    assert_eq!(coordinator.process_owners(&asked, short).await.expect("owners"), vec![None; 5]);
    coordinator.note_process_clients(&[(Some("east"), "app-1", "producer-1")]).await.expect("seen again");
    assert_eq!(coordinator.process_owners(&asked, short).await.expect("owners")[0], producer(1));
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    coordinator.forget_process_clients(short).await.expect("forget");
    assert_eq!(coordinator.process_owners(&asked, window).await.expect("owners"), vec![None; 5]);
    assert!(coordinator.process_owners(&[], window).await.expect("none asked").is_empty());
}

/// Ingests committing at once (the committer keeps `concurrent_ingests` groups in flight)
/// upsert the same series and mark the same clients, listed in opposite orders: none may
/// deadlock or fail, and every sample and span is stored once.
async fn concurrent_ingests_sharing_series_and_clients_all_commit(store: &dyn Store) {
    const BATCHES: usize = 8;
    const SERIES: usize = 24;
    let batch = |index: usize| {
        let mut order: Vec<usize> = (0..SERIES).collect();
        if index % 2 == 1 {
            order.reverse();
        }
        let samples = order
            .iter()
            .map(|series| {
                let node = format!("nn{series}");
                let labels = [("cluster", "prod"), ("namespace", "ns1"), ("node.id", node.as_str())];
                let time = T0 + index as i64 * SECOND;
                sample("lagscope_test_state", &labels, time, PointValue::Number(index as f64), MetricKind::Gauge)
            })
            .collect();
        let spans = order
            .iter()
            .map(|client| {
                let mut span = span(None, Component::Client, 0, 0, None, T0 + index as i64 * SECOND);
                span.trace_id = Some(format!("{:032x}", 1000 * (index + 1) + client));
                span.span_id = Some(format!("{:016x}", 1000 * (index + 1) + client));
                span.call.client_id = Some(format!("client-{client}"));
                span.resource.cluster = Some("prod".into());
                span.call.namespace = Some("ns1".into());
                span
            })
            .collect();
        IngestBatch { spans, samples, ..IngestBatch::default() }
    };
    let batches: Vec<IngestBatch> = (0..BATCHES).map(batch).collect();
    for round in 0..3 {
        let results = futures::future::join_all(batches.iter().map(|batch| store.ingest(batch))).await;
        for (index, result) in results.into_iter().enumerate() {
            if let Err(error) = result {
                panic!("round {round}, batch {index}: {error}");
            }
        }
    }
    let stats = store.stats().await.expect("stats");
    assert_eq!(stats.series, SERIES as u64, "{stats:?}");
    assert_eq!(stats.samples, (SERIES * BATCHES) as u64, "{stats:?}");
    assert_eq!(stats.spans, (SERIES * BATCHES) as u64, "re-sent spans are stored once: {stats:?}");
}

/// Log rows stored before log records had an identity (SQLite migration 0013, PostgreSQL 0008)
/// are given it when the store opens, and those that are copies of another row (a record sent
/// again, kept twice then) are removed: afterwards every record is stored once, and a copy sent
/// later is recognised. `raw` runs SQL on the store's database behind its back (to make the
/// rows an older lagscope left: the same columns, no identity, copies side by side);
/// `reopen` opens the store again.
async fn log_rows_stored_before_identities_get_theirs<S: Store>(
    store: S,
    raw: impl AsyncFn(String),
    reopen: impl AsyncFn() -> S,
) {
    let first = log(T0, "Cannot get available namenode for ns60 nn6002:8020 error: No namenodes available");
    let same_time = log(T0, "Observer Node is too far behind: serverStateId = 7");
    let second = log(T0 + SECOND, "No namenodes available under nameservice ns60");
    let third = log(T0 + 2 * SECOND, "Disable OM follower read and retry OM leader directly");
    let records = vec![first.clone(), same_time.clone(), second.clone(), third.clone()];
    let batch = IngestBatch { logs: records.clone(), ..IngestBatch::default() };
    assert_eq!(store.ingest(&batch).await.expect("ingest").logs_written, 4);
    const COLUMNS: &str = "time_unix_nano, observed_time_unix_nano, severity_number, severity_text, body, \
        event_name, trace_id, span_id, service_name, system, cluster, component, node_id, resource_attributes, \
        scope_name, scope_version, attributes";
    let copy = |condition: String| format!("INSERT INTO logs ({COLUMNS}) SELECT {COLUMNS} FROM logs WHERE {condition}");
    // The two records at T0 and the one a second later as an older store held them: no
    // identity, the first two twice each, the third four times.
    raw(format!("UPDATE logs SET identity = NULL WHERE time_unix_nano IN ({T0}, {})", T0 + SECOND)).await;
    raw(copy(format!("time_unix_nano = {T0}"))).await;
    raw(copy(format!("time_unix_nano = {}", T0 + SECOND))).await;
    raw(copy(format!("time_unix_nano = {}", T0 + SECOND))).await;
    // The last one stored without an identity before the migration, and sent again after it.
    raw(copy(format!("time_unix_nano = {}", T0 + 2 * SECOND))).await;
    assert_eq!(store.stats().await.expect("stats").logs, 2 + 2 + 4 + 2);
    drop(store);

    let store = reopen().await;
    assert_eq!(store.stats().await.expect("stats").logs, 4, "each record once");
    assert_eq!(store.logs(TimeRange::ALL, 100).await.expect("logs"), records, "each record as it was");
    let again = store.ingest(&batch).await.expect("sent again");
    assert_eq!(again.logs_written, 0, "every stored record is recognised when sent again");
    drop(store);
    let store = reopen().await;
    assert_eq!(store.stats().await.expect("stats").logs, 4, "opening again changes nothing");
}

#[tokio::test]
async fn sqlite_gives_log_rows_stored_before_identities_theirs() {
    let (store, directory) = open_sqlite().await;
    let url = format!("sqlite://{}", directory.path().join(lagscope_store::sqlite_database_file()).display());
    let raw = async |sql: String| {
        let mut connection = <sqlx::SqliteConnection as sqlx::Connection>::connect(&url).await.expect("connect");
        sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
            .execute(&mut connection)
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error}"));
    };
    let reopen = async || SqliteStore::open_dir(directory.path()).await.expect("store opens again");
    log_rows_stored_before_identities_get_theirs(store, raw, reopen).await;
}

#[tokio::test]
async fn postgres_gives_log_rows_stored_before_identities_theirs() {
    let url = postgres_support::fresh_database().await;
    let store = PgStore::connect(&url).await.unwrap_or_else(|error| panic!("cannot open {url}: {error}"));
    let raw = async |sql: String| {
        let mut connection = <sqlx::PgConnection as sqlx::Connection>::connect(&url).await.expect("connect");
        sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
            .execute(&mut connection)
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error}"));
    };
    let reopen = async || PgStore::connect(&url).await.expect("store connects again");
    log_rows_stored_before_identities_get_theirs(store, raw, reopen).await;
}

/// Every read of the span feed agrees with the store's own read as it was at an id, and what
/// was committed since is found by id, whatever its start time (a late span of the past, a
/// span sent again stored once). On both backends: the live analyzer holds clients and scopes
/// on either.
async fn the_span_feed_reads_as_of_an_id_and_what_was_committed_since(store: &dyn Store) {
    let feed = store.span_feed().expect("the store offers a span feed");
    assert_eq!(feed.latest_span_id().await.expect("empty"), 0);
    let in_scope = |mut span: Span, cluster: &str, namespace: &str| {
        span.resource.cluster = Some(cluster.to_string());
        span.call.namespace = Some(namespace.to_string());
        span
    };
    let first_batch = vec![
        in_scope(span(Some("c1"), Component::Client, 1, 1, None, T0), "prod", "ns1"),
        in_scope(span(None, Component::Router, 1, 2, Some(1), T0 + 1), "prod", "ns1"),
        in_scope(span(Some("c1"), Component::Client, 2, 3, None, T0 + 20 * SECOND), "prod", "ns1"),
        in_scope(span(Some("c2"), Component::Client, 3, 4, None, T0 + 5 * SECOND), "prod", "ns2"),
    ];
    store.ingest(&IngestBatch { spans: first_batch, ..IngestBatch::default() }).await.expect("ingest");
    let logs = |time: i64| {
        let mut record = log(time, "Cannot get available namenode for ns1 a:1 error: x");
        record.resource.cluster = Some("prod".to_string());
        record
    };
    store.ingest(&IngestBatch { logs: vec![logs(T0)], ..IngestBatch::default() }).await.expect("logs");
    let first = feed.latest_span_id().await.expect("latest");
    assert!(first > 0);
    let client_then = store.client_spans("c1", TimeRange::ALL, 10).await.expect("client");
    let scope_then = store.scope_spans(Some("prod"), Some("ns1"), TimeRange::ALL, 10).await.expect("scope");
    let (lines, latest) = feed.recognised_logs_after(Some("prod"), 60 * SECOND, 0, 10).await.expect("lines");
    assert_eq!((lines.len(), latest), (1, Some(T0)));
    let after_line = lines[0].0;

    // Committed later: a span of the past in a trace of before, a new call, a span sent again
    // (not stored again), a span of another scope; and a second line.
    let resent = in_scope(span(Some("c1"), Component::Client, 2, 3, None, T0 + 20 * SECOND), "prod", "ns1");
    let second_batch = vec![
        in_scope(span(None, Component::Server, 1, 5, Some(2), T0 + 2), "prod", "ns1"),
        in_scope(span(Some("c1"), Component::Client, 4, 6, None, T0 + 30 * SECOND), "prod", "ns1"),
        resent,
        in_scope(span(Some("c2"), Component::Client, 5, 7, None, T0 + 31 * SECOND), "prod", "ns2"),
    ];
    store.ingest(&IngestBatch { spans: second_batch, ..IngestBatch::default() }).await.expect("ingest");
    store.ingest(&IngestBatch { logs: vec![logs(T0 + SECOND)], ..IngestBatch::default() }).await.expect("logs");
    let second = feed.latest_span_id().await.expect("latest");
    assert!(second > first, "{second} after {first}");

    // As of `first`: what the store's reads returned then.
    let client_through = feed.client_spans_through("c1", first, 10).await.expect("client through");
    assert_eq!(client_through.iter().map(|(_, span)| span.clone()).collect::<Vec<_>>(), client_then);
    assert!(client_through.iter().all(|(id, _)| *id <= first));
    assert_eq!(feed.scope_spans_through(Some("prod"), Some("ns1"), first, 10).await.expect("scope"), scope_then);
    let trace_then = feed.trace_spans_through(&[&format!("{:032x}", 1)], first).await.expect("trace then");
    assert_eq!(trace_then.iter().map(|(_, span)| span.start_unix_nano).collect::<Vec<_>>(), [T0, T0 + 1]);
    // As of `second`: the store's reads now.
    let client_now = feed.client_spans_through("c1", second, 10).await.expect("client now");
    let client_now: Vec<Span> = client_now.into_iter().map(|(_, span)| span).collect();
    assert_eq!(client_now, store.client_spans("c1", TimeRange::ALL, 10).await.expect("client"));
    assert_eq!(client_now.len(), 5, "the server span of the past joined its trace");
    // Everything committed between the two, by start time, the span sent again not in it.
    let gained = feed.spans_between(first, second, 100).await.expect("between");
    assert_eq!(
        gained.iter().map(|(_, span)| span.start_unix_nano).collect::<Vec<_>>(),
        [T0 + 2, T0 + 30 * SECOND, T0 + 31 * SECOND]
    );
    assert!(gained.iter().all(|(id, _)| (first + 1..=second).contains(id)));
    assert_eq!(feed.spans_between(first, second, 1).await.expect("limit").len(), 1);
    assert!(feed.spans_between(second, second, 100).await.expect("nothing").is_empty());
    let scopes = [(Some("prod".to_string()), Some("ns1".to_string())), (Some("prod".to_string()), None)];
    let scope_gained = feed.scope_spans_between(&scopes, first, second, 100).await.expect("scope between");
    assert_eq!(scope_gained.iter().map(|span| span.start_unix_nano).collect::<Vec<_>>(), [T0 + 2, T0 + 30 * SECOND]);
    assert!(feed.scope_spans_between(&[], first, second, 100).await.expect("no scopes").is_empty());
    // Scope text is bound, never spliced.
    let hostile = [(Some("prod' OR '1'='1".to_string()), Some("ns1".to_string()))];
    assert!(feed.scope_spans_between(&hostile, 0, second, 100).await.expect("hostile").is_empty());
    // The lines after the one read before: only the new one.
    let (lines, latest) = feed.recognised_logs_after(Some("prod"), 60 * SECOND, after_line, 10).await.expect("lines");
    assert_eq!(lines.iter().map(|(_, line)| line.time_unix_nano).collect::<Vec<_>>(), [T0 + SECOND]);
    assert_eq!(latest, Some(T0 + SECOND));
}

/// On PostgreSQL two ingests run at once and the one with the later ids may commit first: the
/// feed must not answer an id past rows still being written, or a reader that has read past
/// them never reads them. An ingest that has drawn ids and not committed holds the feed back;
/// once it commits, the feed answers past both, and the rows of both are read between. So
/// does the newest transaction of all (which a snapshot's list of transactions in progress
/// leaves out: waiting on that list alone lost most stale reads of a live PostgreSQL test).
#[tokio::test]
async fn postgres_feed_waits_for_an_ingest_in_flight_with_lower_ids() {
    let (store, ()) = open_postgres().await;
    let feed = store.span_feed().expect("PostgreSQL offers the span feed");
    // An ingest in flight, as `PgStore::ingest` starts one: the feed's lock and a transaction
    // id, then rows with ids drawn from the sequence.
    let (in_flight, early) = ingest_in_flight(&store, 9, T0).await;
    // A later ingest draws higher ids and commits first.
    let later = span(Some("c1"), Component::Client, 1, 1, None, T0 + SECOND);
    store.ingest(&IngestBatch { spans: vec![later], ..IngestBatch::default() }).await.expect("ingest");
    let latest = answered_once_committed(&store, in_flight).await;
    assert!(latest > early, "{latest} past {early}");
    let read = feed.spans_between(0, latest, 100).await.expect("between");
    assert_eq!(read.iter().map(|(_, span)| span.start_unix_nano).collect::<Vec<_>>(), [T0, T0 + SECOND]);

    // The newest transaction of all in flight, none after it: a snapshot lists no transaction
    // from its `xmax` on as in progress, so that list alone would take it for ended.
    let (newest, last) = ingest_in_flight(&store, 10, T0 + 2 * SECOND).await;
    let settled = answered_once_committed(&store, newest).await;
    assert!(settled >= last, "{settled} reaches {last}");
}

/// Each feed waits for the ingests in flight that write its table, and only for those: a batch
/// of spans still being written does not hold back a read of new log lines (it waited for it,
/// and failed if it ran longer than the feed waits), nor a batch of log records a read of spans.
#[tokio::test]
async fn postgres_each_feed_waits_only_for_ingests_that_write_its_table() {
    let (store, ()) = open_postgres().await;
    let feed = store.span_feed().expect("PostgreSQL offers the feed");
    let line = "NoNamenodesAvailableException: No namenodes available under nameservice ns60";
    store.ingest(&IngestBatch { logs: vec![log(T0, line)], ..IngestBatch::default() }).await.expect("ingest");
    let window = 60 * SECOND;
    // Spans in flight, holding the ingest lock every ingest takes.
    let (spans_in_flight, _) = ingest_in_flight(&store, 11, T0).await;
    let read = feed
        .recognised_logs_after_each(&[(Some("prod"), 0)], window, 100)
        .await
        .expect("a span ingest in flight does not hold back the log feed");
    assert_eq!(read[0].0.len(), 1, "{read:?}");
    spans_in_flight.rollback().await.expect("rollback");
    // Log records in flight, as `PgStore::ingest` writes a batch of them alone: the log lines'
    // lock, then a row.
    let mut logs_in_flight = store.pool().begin().await.expect("begin");
    sqlx::query("SELECT pg_current_xact_id(), pg_advisory_xact_lock_shared(1818322803, 2)")
        .execute(&mut *logs_in_flight)
        .await
        .expect("the log ingest lock");
    // (The body as the store writes it: JSON.)
    sqlx::query("INSERT INTO logs (time_unix_nano, severity_number, body, cluster) VALUES ($1, 13, $2, 'prod')")
        .bind(T0 + SECOND)
        .bind(json!(format!("{line} (again)")).to_string())
        .execute(&mut *logs_in_flight)
        .await
        .expect("a log row in flight");
    feed.latest_span_id().await.expect("a log ingest in flight does not hold back the span feed");
    let waiting = tokio::spawn({
        let store = store.clone();
        async move {
            let feed = store.span_feed().expect("feed");
            feed.recognised_logs_after_each(&[(Some("prod"), 0)], window, 100).await.expect("read")
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the log feed answered past a log ingest still in flight");
    logs_in_flight.commit().await.expect("commit");
    let read = tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
        .await
        .expect("the log feed answers once the ingest commits")
        .expect("task");
    assert_eq!(read[0].0.len(), 2, "{read:?}");
}

/// Two instances on one PostgreSQL store two versions of one incident at once (around a lease
/// hand-over): the partial window, from an upsert still in flight, and the whole. The upsert of
/// the whole must not look for the partial before that upsert commits, or each misses the other
/// and both stay listed. Here the partial's upsert is held, its row written and not committed,
/// by a reader that locked another row it updates; the whole's upsert starts meanwhile.
#[tokio::test]
async fn postgres_instances_storing_two_versions_of_a_window_at_once_keep_the_whole() {
    let url = postgres_support::fresh_database().await;
    let first = PgStore::connect(&url).await.expect("first instance");
    let second = PgStore::connect(&url).await.expect("second instance");
    let window = |start: i64, end: i64| unfair_window(start, end, "primary");
    // Upserts lock rows in fingerprint order: this one comes after the partial window's.
    let held = anomaly("zz-held", "c1", T0);
    first.upsert_anomalies(std::slice::from_ref(&held), T0).await.expect("the held row");
    let mut holder = first.pool().begin().await.expect("begin");
    sqlx::query("SELECT id FROM anomalies WHERE fingerprint = 'zz-held' FOR UPDATE")
        .execute(&mut *holder)
        .await
        .expect("lock the row");
    let waiting = || async {
        let (count,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(first.pool())
        .await
        .expect("activity");
        count
    };
    let partial = tokio::spawn({
        let (store, changed) = (first.clone(), Anomaly { summary: "changed".to_string(), ..held });
        let batch = [window(65, 68), changed];
        async move { store.upsert_anomalies(&batch, T0 + SECOND).await.expect("partial") }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while waiting().await < 1 {
        assert!(std::time::Instant::now() < deadline, "the partial's upsert never reached the held row");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let whole = tokio::spawn({
        let (store, batch) = (second.clone(), [window(64, 79)]);
        async move { store.upsert_anomalies(&batch, T0 + 2 * SECOND).await.expect("whole") }
    });
    // The whole's upsert either waits for the partial's (a second waiter) or has ended.
    while !whole.is_finished() && waiting().await < 2 {
        assert!(std::time::Instant::now() < deadline, "the whole's upsert neither ended nor waited");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    holder.rollback().await.expect("release the row");
    let (partial, whole) = (partial.await.expect("task"), whole.await.expect("task"));
    assert_eq!((partial.inserted.len(), partial.updated, partial.superseded), (1, 1, 0));
    assert_eq!((whole.inserted.len(), whole.superseded), (1, 1), "the whole found the partial");
    let listed = first
        .anomalies(&AnomalyFilter { kind: Some(AnomalyKind::UnfairRejection), limit: 10, ..AnomalyFilter::default() })
        .await
        .expect("list");
    assert_eq!(
        listed.iter().map(|stored| stored.anomaly.fingerprint.as_str()).collect::<Vec<_>>(),
        [window(64, 79).fingerprint]
    );
    let replaced = first.anomaly(partial.inserted[0]).await.expect("get").expect("kept");
    assert_eq!(replaced.superseded_by, Some(whole.inserted[0]));
}

/// An ingest in flight, as `PgStore::ingest` starts one: the feed's lock and a transaction id,
/// then a client span (trace and span id `n`, starting at `start`) with an id drawn from the
/// sequence, not committed; the transaction and that id.
async fn ingest_in_flight(store: &PgStore, n: u32, start: i64) -> (sqlx::Transaction<'static, sqlx::Postgres>, i64) {
    let mut transaction = store.pool().begin().await.expect("begin");
    sqlx::query("SELECT pg_advisory_xact_lock_shared(1818322803, 1), pg_current_xact_id()")
        .execute(&mut *transaction)
        .await
        .expect("the ingest lock");
    let (id,): (i64,) = sqlx::query_as(
        "INSERT INTO spans (trace_id, span_id, name, kind, start_unix_nano, end_unix_nano, status_code, client_id)
         VALUES ($1, $2, 'getFileInfo', 3, $3, $3 + 1, 0, 'c1') RETURNING id",
    )
    .bind(format!("{n:032x}"))
    .bind(format!("{n:016x}"))
    .bind(start)
    .fetch_one(&mut *transaction)
    .await
    .expect("a row in flight");
    (transaction, id)
}

/// What the feed answers when asked while `in_flight` runs: nothing for 300 ms, then, once it
/// commits, within 5 s.
async fn answered_once_committed(store: &PgStore, in_flight: sqlx::Transaction<'static, sqlx::Postgres>) -> i64 {
    let waiting = tokio::spawn({
        let store = store.clone();
        async move { store.span_feed().expect("feed").latest_span_id().await.expect("latest") }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the feed answered past an ingest still in flight");
    in_flight.commit().await.expect("commit");
    tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
        .await
        .expect("the feed answers once the ingest commits")
        .expect("task")
}
