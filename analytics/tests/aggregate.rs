//! Aggregation and Parquet export over rows whose percentiles are worked out by hand.

use lagscope_analytics::{aggregate, export_parquet};
use lagscope_analyzer::{ApplyLagPoint, LagRows, ReadLag, RejectionCount};
use lagscope_model::{LagQuery, Percentiles};
use polars::prelude::*;

const S: i64 = 1_000_000_000;

fn read(node: &str, second: i64, served: i64, committed: Option<i64>, seconds: f64) -> ReadLag {
    ReadLag {
        cluster: Some("c1".into()),
        namespace: Some("ns1".into()),
        node: Some(node.into()),
        role: Some("observer".into()),
        client_id: "client-1".into(),
        time_unix_nano: second * S,
        served,
        committed,
        behind_states: committed.map(|committed| (committed - served).max(0)),
        behind_seconds: committed.map(|_| seconds),
    }
}

fn rows() -> LagRows {
    LagRows {
        reads: vec![
            read("nn1", 1, 100, Some(100), 0.0),
            read("nn1", 2, 100, Some(100), 0.0),
            read("nn1", 3, 90, Some(100), 2.0),
            read("nn1", 14, 80, Some(100), 4.0),
            // No committed state known: counted as a read, not compared.
            read("nn1", 15, 80, None, 0.0),
            read("nn2", 5, 100, Some(100), 0.0),
            // Another namespace, filtered out by the query's scope.
            ReadLag { namespace: Some("ns2".into()), ..read("nn3", 5, 1, Some(1000), 9.0) },
            // Outside the range.
            read("nn1", 40, 1, Some(1000), 9.0),
        ],
        apply: (0..4)
            .map(|second| ApplyLagPoint {
                cluster: Some("c1".into()),
                namespace: Some("ns1".into()),
                node: Some("nn2".into()),
                time_unix_nano: second * S,
                applied: 100,
                committed: 100 + second * 10,
                behind_states: second * 10,
                behind_seconds: second as f64,
            })
            .collect(),
        rejections: vec![
            RejectionCount {
                cluster: Some("c1".into()),
                namespace: Some("ns1".into()),
                node: Some("es-1".into()),
                role: "primary".into(),
                time_unix_nano: S,
                rejections: 3.0,
            },
            RejectionCount {
                cluster: Some("c1".into()),
                namespace: Some("ns1".into()),
                node: Some("es-1".into()),
                role: "primary".into(),
                time_unix_nano: 12 * S,
                rejections: 4.0,
            },
            RejectionCount {
                cluster: Some("c1".into()),
                namespace: Some("ns1".into()),
                node: Some("es-1".into()),
                role: "replica".into(),
                time_unix_nano: 2 * S,
                rejections: 1.0,
            },
        ],
    }
}

fn query(step: Option<i64>) -> LagQuery {
    LagQuery {
        cluster: Some("c1".into()),
        namespace: Some("ns1".into()),
        from_unix_nano: 0,
        to_unix_nano: 30 * S,
        step_seconds: step,
    }
}

#[test]
fn whole_range_gives_one_distribution_per_node() {
    let report = aggregate(&rows(), &query(None)).expect("aggregate");
    assert_eq!(report.reads.len(), 2, "{:#?}", report.reads);
    let nn1 = &report.reads[0];
    assert_eq!(nn1.node.as_deref(), Some("nn1"));
    assert_eq!((nn1.reads, nn1.stale_reads), (5, 2));
    // behind_states 0, 0, 10, 20: linear p50 = 5, p99 = 19.7, max 20.
    let states = nn1.behind_states.expect("states");
    assert_eq!((states.p50, states.max), (5.0, 20.0));
    assert!((states.p99 - 19.7).abs() < 1e-9, "{states:?}");
    assert_eq!(nn1.behind_seconds.map(|seconds| seconds.max), Some(4.0));
    let nn2 = &report.reads[1];
    assert_eq!((nn2.reads, nn2.stale_reads), (1, 0));
    assert_eq!(nn2.behind_states, Some(Percentiles { p50: 0.0, p99: 0.0, max: 0.0 }));

    assert_eq!(report.apply_lag.len(), 1);
    let apply = &report.apply_lag[0];
    assert_eq!(apply.reports, 4);
    assert_eq!((apply.behind_states.p50, apply.behind_states.max), (15.0, 30.0));
    assert_eq!(apply.behind_seconds.max, 3.0);

    let rejections: Vec<_> = report.rejections.iter().map(|row| (row.role.as_str(), row.rejections)).collect();
    assert_eq!(rejections, [("primary", 7.0), ("replica", 1.0)]);
}

#[test]
fn step_buckets_percentiles_over_time() {
    let report = aggregate(&rows(), &query(Some(10))).expect("aggregate");
    let nn1: Vec<_> = report
        .reads
        .iter()
        .filter(|row| row.node.as_deref() == Some("nn1"))
        .map(|row| (row.bucket_start_unix_nano / S, row.reads, row.stale_reads, row.behind_states.map(|p| p.max)))
        .collect();
    assert_eq!(nn1, [(0, 3, 1, Some(10.0)), (10, 2, 1, Some(20.0))]);
    let primary: Vec<_> = report
        .rejections
        .iter()
        .filter(|row| row.role == "primary")
        .map(|row| (row.bucket_start_unix_nano / S, row.rejections))
        .collect();
    assert_eq!(primary, [(0, 3.0), (10, 4.0)]);
}

#[test]
fn empty_rows_give_an_empty_report() {
    let report = aggregate(&LagRows::default(), &query(Some(10))).expect("aggregate");
    assert!(report.reads.is_empty() && report.apply_lag.is_empty() && report.rejections.is_empty());
}

#[test]
fn parquet_export_reads_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let written = export_parquet(dir.path(), &rows(), &query(Some(10))).expect("export");
    let names: Vec<_> =
        written.iter().map(|file| file.path.file_name().expect("name").to_string_lossy().into_owned()).collect();
    assert_eq!(
        names,
        [
            "reads.parquet",
            "apply_lag.parquet",
            "rejections.parquet",
            "reads_by_step.parquet",
            "apply_lag_by_step.parquet",
            "rejections_by_step.parquet"
        ]
    );
    let reads = ParquetReader::new(std::fs::File::open(dir.path().join("reads.parquet")).expect("open"))
        .finish()
        .expect("read parquet");
    assert_eq!(reads.height(), 8);
    assert_eq!(written[0].rows, 8);
    let served: Vec<_> = reads.column("served").expect("served").i64().expect("i64").into_no_null_iter().collect();
    assert_eq!(served, [100, 100, 90, 80, 80, 100, 1, 1]);
    assert!(matches!(reads.column("time").expect("time").dtype(), DataType::Datetime(TimeUnit::Nanoseconds, _)));
    let by_step = ParquetReader::new(std::fs::File::open(dir.path().join("reads_by_step.parquet")).expect("open"))
        .finish()
        .expect("read parquet");
    assert_eq!(by_step.height(), 3);
    assert!(by_step.column("behind_states_p99").is_ok(), "{:?}", by_step.get_column_names());
}
