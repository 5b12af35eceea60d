use super::analysis::Took;
use super::written::{FORGET_AFTER_PASSES, NewAnomalies, WrittenAnomalies};
use super::*;

#[test]
fn a_process_with_one_calling_client_owns_its_lines_until_another_calls_or_it_is_forgotten() {
    let start = Instant::now();
    let mut callers = AddressCallers::default();
    let east = |node: &str| (Some("pulsar-east".to_string()), node.to_string());
    callers.note((Some("pulsar-east"), "app-1"), "producer-1", start);
    callers.note((Some("pulsar-east"), "app-1"), "producer-1", start);
    callers.note((Some("pulsar-west"), "app-1"), "producer-9", start);
    assert_eq!(callers.owner(&east("app-1")), Some("producer-1"));
    assert_eq!(callers.owner(&(Some("pulsar-west".to_string()), "app-1".to_string())), Some("producer-9"));
    assert_eq!(callers.owner(&east("app-2")), None);
    // A second client calling from the process: the lines are no one's.
    callers.note((Some("pulsar-east"), "app-1"), "producer-2", start);
    assert_eq!(callers.owner(&east("app-1")), None);
    // Not seen for a window: forgotten (and known anew from the next pass that sees it).
    let window = Duration::from_secs(600);
    callers.note((Some("pulsar-east"), "app-2"), "producer-3", start + window);
    // Each client is forgotten on its own: app-1's second client, seen again, is its one.
    callers.note((Some("pulsar-east"), "app-1"), "producer-2", start + window);
    assert!(callers.prune(window, start + window + Duration::from_secs(1)));
    assert_eq!(callers.processes.len(), 2);
    assert_eq!(callers.owner(&east("app-2")), Some("producer-3"));
    assert_eq!(callers.owner(&east("app-1")), Some("producer-2"));
    // Looked at once per window at most.
    assert!(!callers.prune(window, start + window + Duration::from_secs(2)));
}

/// With several instances, a pair is written to the database when first seen, and again
/// once a quarter of the window has passed (the database forgets it after a window).
#[test]
fn a_seen_pair_is_written_again_before_the_database_forgets_it() {
    let start = Instant::now();
    let window = Duration::from_secs(600);
    let mut callers = AddressCallers::default();
    let process = (Some("pulsar-east"), "app-1");
    let pair = |client: &str| (Some("pulsar-east".to_string()), "app-1".to_string(), client.to_string());
    assert!(callers.write_due(process, "producer-1", window, start));
    // Due until written.
    assert!(callers.write_due(process, "producer-1", window, start + window / 8));
    callers.wrote(vec![pair("producer-1")], start + window / 8);
    assert!(!callers.write_due(process, "producer-1", window, start + window / 4));
    assert!(callers.write_due(process, "producer-2", window, start + window / 4));
    assert!(callers.write_due(process, "producer-1", window, start + window / 8 + window / 4));
    assert!(callers.write_due((None, "app-1"), "producer-1", window, start + window / 4));
}

/// An `apply_lag` anomaly of observer nn-obs1 in prod/ns1, from 10 to `end`.
fn apply_lag(end: i64, summary: &str) -> lagscope_model::Anomaly {
    lagscope_model::Anomaly {
        kind: AnomalyKind::ApplyLag,
        severity: lagscope_model::Severity::Warning,
        cluster: Some("prod".to_string()),
        namespace: Some("ns1".to_string()),
        client_id: None,
        node_id: Some("nn-obs1".to_string()),
        start_unix_nano: 10,
        end_unix_nano: end,
        summary: summary.to_string(),
        cause: "apply lag".to_string(),
        evidence: Default::default(),
        fingerprint: "f1".to_string(),
        open: true,
    }
}

/// The writer stores each pass's findings in pass order (a later pass's version of an
/// anomaly or rollup wins), and counts a pass's batches as analysed only once its findings
/// are in the store; a failed pass counts as an error and still lets its batches go.
#[tokio::test]
async fn pass_findings_are_stored_in_pass_order_before_their_batches_count_as_analysed() {
    use lagscope_store::{AnomalyFilter, SqliteStore, StoreError};
    let directory = tempfile::tempdir().expect("temp dir");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(directory.path()).await.expect("store"));
    let metrics = Arc::new(SelfMetrics::default());
    let (to_writer, passes) = tokio::sync::mpsc::channel(1);
    let writer = tokio::spawn(write_passes(Arc::clone(&store), Arc::clone(&metrics), passes));
    let anomaly = |end: i64| Arc::new(apply_lag(end, "observer nn-obs1 is behind"));
    let scope: ScopeKey = (Some("prod".to_string()), Some("ns1".to_string()));
    let rollup = |reads: u64| ReadRollup {
        cluster: scope.0.clone(),
        namespace: scope.1.clone(),
        node: Some("nn-obs1".to_string()),
        minute_unix_nano: 60_000_000_000,
        reads,
        compared: reads,
        ..ReadRollup::default()
    };
    let pass = |findings, through_batch| Analysed {
        findings,
        started: Instant::now(),
        analysed: Duration::ZERO,
        first_queued: Some(Instant::now()),
        through_batch,
    };
    let stored = |store: Arc<dyn Store>| async move {
        let anomalies = store.anomalies(&AnomalyFilter { limit: 10, ..AnomalyFilter::default() }).await;
        let ends: Vec<i64> = anomalies.expect("anomalies").iter().map(|a| a.anomaly.end_unix_nano).collect();
        let rollups = store.read_rollups(TimeRange::ALL, 10).await.expect("rollups");
        (ends, rollups.iter().map(|rollup| rollup.reads).collect::<Vec<_>>())
    };
    let analysed_through = |batch: u64| {
        let metrics = Arc::clone(&metrics);
        async move {
            // Looked at as soon as the writer yields: a count raised before the write
            // ended would be seen before its findings are.
            while metrics.batches_analyzed.get() < batch {
                tokio::task::yield_now().await;
            }
        }
    };

    let first = Findings { anomalies: vec![anomaly(20)], rollups: vec![(scope.clone(), vec![rollup(3)])] };
    to_writer.send(pass(Ok(first), 1)).await.expect("sent");
    analysed_through(1).await;
    assert_eq!(stored(Arc::clone(&store)).await, (vec![20], vec![3]), "stored when counted");
    // Two passes queued at once: the later one's findings win.
    let grown = Findings { anomalies: vec![anomaly(30)], rollups: vec![(scope.clone(), vec![rollup(4)])] };
    let again = Findings { anomalies: vec![anomaly(40)], rollups: vec![(scope.clone(), vec![rollup(5)])] };
    to_writer.send(pass(Ok(grown), 2)).await.expect("sent");
    to_writer.send(pass(Ok(again), 3)).await.expect("sent");
    let failed = StoreError::Corrupt { what: "pass", detail: "failed on purpose".to_string() };
    to_writer.send(pass(Err(failed), 4)).await.expect("sent");
    drop(to_writer);
    writer.await.expect("writer");
    assert_eq!(stored(Arc::clone(&store)).await, (vec![40], vec![5]));
    assert_eq!(metrics.batches_analyzed.get(), 4, "a failed pass's batches are let go too");
    assert_eq!((metrics.analysis_passes.get(), metrics.analysis_errors.get()), (3, 1));
    assert_eq!((metrics.anomalies_new.get(), metrics.anomalies_changed.get()), (1, 2));
}

/// Only an analysis that took `SLOW_ANALYSIS` or longer, its settling included, is slow.
#[test]
fn an_analysis_is_slow_from_a_tenth_of_a_second_with_its_settling() {
    let took = |analysed: u64, settled: u64| Took {
        analysed: Duration::from_millis(analysed),
        settled: Duration::from_millis(settled),
        spans: 10,
        let_go: 0,
    };
    assert!(!took(60, 39).is_slow());
    assert!(took(60, 40).is_slow(), "the settling counts");
    assert!(took(250, 0).is_slow());
}

/// An anomaly found again as written is not written again; changed, it is; one not found
/// for a while is forgotten (and so compared by the store again).
#[test]
fn anomalies_written_before_are_not_written_again_unless_changed() {
    let mut anomaly = apply_lag(20, "observer nn-obs1 is 12 000 states behind");
    let mut written = WrittenAnomalies::default();
    written.next_pass();
    let hash = written.content_hash(&anomaly);
    assert!(!written.seen(&anomaly, hash), "never written");
    written.wrote(&anomaly, hash);
    assert!(written.seen(&anomaly, written.content_hash(&anomaly)));
    for change in [
        |anomaly: &mut lagscope_model::Anomaly| anomaly.open = false,
        |anomaly: &mut lagscope_model::Anomaly| anomaly.end_unix_nano = 30,
        |anomaly: &mut lagscope_model::Anomaly| anomaly.severity = lagscope_model::Severity::Critical,
        |anomaly: &mut lagscope_model::Anomaly| anomaly.summary.push_str(" (13 000 now)"),
        |anomaly: &mut lagscope_model::Anomaly| anomaly.node_id = Some("nn-obs2".to_string()),
        |anomaly: &mut lagscope_model::Anomaly| {
            anomaly.evidence.insert("lag_states", serde_json::json!(12_001));
        },
    ] {
        let mut changed = anomaly.clone();
        change(&mut changed);
        assert!(!written.seen(&changed, written.content_hash(&changed)), "{changed:?}");
    }
    anomaly.open = false;
    written.wrote(&anomaly, written.content_hash(&anomaly));
    for _ in 0..2 * FORGET_AFTER_PASSES {
        written.next_pass();
    }
    assert!(!written.seen(&anomaly, written.content_hash(&anomaly)), "forgotten after passes without it");
}

/// Every item is analysed once, on at most as many threads as asked (and items), and the
/// results come back in the items' order whatever order they were taken in.
#[test]
fn work_on_threads_is_done_once_each_and_returned_in_order() {
    for (count, threads) in [(0, 2), (1, 4), (7, 1), (7, 2), (30, 3), (5, 16)] {
        let items: Vec<usize> = (0..count).collect();
        let seen = std::sync::Mutex::new(Vec::new());
        let on = std::sync::Mutex::new(HashSet::new());
        // Sizes out of order, so the largest-first order differs from the items'.
        let results = on_threads(
            items,
            threads,
            |item| (item * 7) % 5,
            |item| {
                seen.lock().expect("lock").push(item);
                on.lock().expect("lock").insert(std::thread::current().id());
                item * 10
            },
        );
        assert_eq!(results, (0..count).map(|item| item * 10).collect::<Vec<_>>(), "{count} on {threads}");
        let mut seen = seen.into_inner().expect("lock");
        seen.sort_unstable();
        assert_eq!(seen, (0..count).collect::<Vec<_>>(), "each once");
        let used = on.into_inner().expect("lock").len();
        assert!(used <= threads.min(count).max(1), "{count} items on {threads} threads used {used}");
    }
}

/// Two items on two threads run at the same time: each waits to hear from the other, which
/// on one thread the first would wait for in vain.
#[test]
fn two_items_on_two_threads_run_together() {
    let (to_first, first_hears) = std::sync::mpsc::channel::<()>();
    let (to_second, second_hears) = std::sync::mpsc::channel::<()>();
    let ends = std::sync::Mutex::new([(to_second, first_hears), (to_first, second_hears)].map(Some));
    let met = on_threads(
        vec![0, 1],
        2,
        |_| 1,
        |item: usize| {
            let (tell, hear) = ends.lock().expect("lock")[item].take().expect("each item once");
            tell.send(()).expect("the other item's end");
            hear.recv_timeout(Duration::from_secs(20)).is_ok()
        },
    );
    assert_eq!(met, [true, true]);
}

/// A panic in an analysis is the pass's, on whichever thread it happened.
#[test]
fn a_panic_on_a_helper_thread_reaches_the_pass() {
    let outcome = std::panic::catch_unwind(|| {
        on_threads(
            (0..8).collect::<Vec<usize>>(),
            2,
            |_| 1,
            |item| {
                std::thread::sleep(Duration::from_millis(5));
                assert!(item != 5, "analysis of item 5 failed");
                item
            },
        )
    });
    assert!(outcome.is_err());
}

#[test]
fn new_anomalies_are_logged_at_once_then_at_most_once_per_interval() {
    let mut found = NewAnomalies::default();
    found.log_every(Duration::from_secs(3600));
    assert!(found.logged_at.is_none(), "nothing found, nothing logged");
    found.add(7);
    found.add(5);
    assert_eq!((found.count, found.first_id, found.last_id), (2, 5, 7));
    // The first line right away.
    found.log_every(Duration::from_secs(3600));
    assert_eq!(found.count, 0, "logged and counting again");
    assert!(found.logged_at.is_some());
    // The next waits for the interval.
    found.add(8);
    found.log_every(Duration::from_secs(3600));
    assert_eq!((found.count, found.first_id, found.last_id), (1, 8, 8), "held until the interval passes");
    found.log_every(Duration::ZERO);
    assert_eq!(found.count, 0);
}
