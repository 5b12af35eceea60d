//! The recognised log lines the live analyzer's passes read, kept between passes.
//!
//! A pass whose batches brought log lines of a cluster needs what
//! `Store::recognised_logs(cluster, window, limit)` returns: the cluster's recognised lines of
//! the scope window, the newest `limit`. Read anew and classified on every such pass, those
//! reads grew with the window to a tenth of the analyzer's time by minute 13 of a `mixed` run
//! (BENCHMARKS.md, forty-sixth session). Here each cluster's lines are held, classified once,
//! and a pass reads only the lines committed since ([`SpanFeed::recognised_logs_after`]). A pass
//! that needs several clusters' lines up to date (several instances on one database, each
//! analysing clusters whose lines another instance's marks bring) reads every one's new lines
//! in one read ([`LineCache::refresh`]).
//!
//! Invariant: a held cluster holds exactly what `Store::recognised_logs` returned as of its
//! last read, each line with its id, in its order (time, then id), and the id of the last line
//! committed then. Lines committed later have higher ids (one writer; retention keeps the
//! newest) and are what the next read brings; merged in, the window cut at the cluster's latest
//! time and the newest `limit` kept, the held lines are again what the store would return: a
//! new line not brought (beyond `limit`) is older than `limit` lines that were.

use std::collections::HashMap;
use std::sync::Arc;

use lagscope_analyzer::log_events::{LogEvent, classify, take_once_by};
use lagscope_model::UnixNanos;
use lagscope_store::{SpanFeed, StoreError};

#[derive(Debug, Default)]
pub struct LineCache {
    clusters: HashMap<Option<String>, Held>,
}

#[derive(Debug, Default)]
struct Held {
    /// By time, then id.
    lines: Vec<Line>,
    /// The highest id read.
    after: i64,
}

#[derive(Debug)]
struct Line {
    time: UnixNanos,
    id: i64,
    /// What the line says, and its identity ([`LogEvent::identity`]); `None`: the store's
    /// filter took a line `classify` does not.
    event: Option<(Arc<LogEvent>, (UnixNanos, u64))>,
}

impl LineCache {
    /// The recognised lines of each of `clusters` ([`lagscope_store::Store::recognised_logs`]),
    /// each line classified, in time order, a line sent again (the same identity) taken once, as
    /// a pass takes them from a read of the store; the lines committed since the last refresh
    /// read for all the clusters at once ([`SpanFeed::recognised_logs_after_each`]). Held lines
    /// older than `kept_from` (the logs' retention cut-off) go, as the store's retention takes
    /// them. Returns the lines of the clusters whose lines changed (new lines, or old ones cut at
    /// the window's start); the others' are as last returned.
    pub async fn refresh(
        &mut self,
        feed: &dyn SpanFeed,
        clusters: &[Option<String>],
        (window, limit): (i64, u32),
        kept_from: Option<UnixNanos>,
    ) -> Result<Vec<(Option<String>, Vec<Arc<LogEvent>>)>, StoreError> {
        let asked: Vec<(Option<&str>, i64)> = (clusters.iter())
            .map(|cluster| (cluster.as_deref(), self.clusters.get(cluster).map_or(0, |held| held.after)))
            .collect();
        let answers = feed.recognised_logs_after_each(&asked, window, limit).await?;
        let mut changed = Vec::new();
        for (cluster, (read, latest)) in clusters.iter().zip(answers) {
            let held = self.clusters.entry(cluster.clone()).or_default();
            // The window from the cluster's latest log time, not before the retention cut-off.
            let from = latest.map(|latest| latest.saturating_sub(window).max(kept_from.unwrap_or(UnixNanos::MIN)));
            if held.merge(read, from, limit as usize) {
                changed.push((cluster.clone(), held.events()));
            }
        }
        Ok(changed)
    }

    /// The lines of `cluster` as last returned.
    #[cfg(test)]
    fn events(&self, cluster: &Option<String>) -> Vec<Arc<LogEvent>> {
        self.clusters.get(cluster).map(Held::events).unwrap_or_default()
    }

    /// Lines held over all clusters.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.clusters.values().map(|held| held.lines.len()).sum()
    }
}

impl Held {
    /// Adds the lines `read`, and keeps the newest `limit` from time `from` on (`None`: the
    /// cluster has no lines left). Whether what it holds changed.
    fn merge(&mut self, read: Vec<(i64, lagscope_model::LogRecord)>, from: Option<UnixNanos>, limit: usize) -> bool {
        let before = self.lines.len();
        let Some(from) = from else {
            self.lines.clear();
            return before > 0;
        };
        self.lines.retain(|line| line.time >= from);
        if read.is_empty() {
            return self.lines.len() != before;
        }
        for (id, record) in read {
            self.after = self.after.max(id);
            if record.time_unix_nano < from {
                continue;
            }
            let event = classify(&record).map(|event| {
                let identity = event.identity();
                (Arc::new(event), identity)
            });
            self.lines.push(Line { time: record.time_unix_nano, id, event });
        }
        // Mostly in order already: the new lines are the newest.
        self.lines.sort_by_key(|line| (line.time, line.id));
        if self.lines.len() > limit {
            self.lines.drain(..self.lines.len() - limit);
        }
        true
    }

    fn events(&self) -> Vec<Arc<LogEvent>> {
        let mut events: Vec<&(Arc<LogEvent>, (UnixNanos, u64))> =
            self.lines.iter().filter_map(|line| line.event.as_ref()).collect();
        take_once_by(&mut events, |(_, identity)| *identity);
        events.into_iter().map(|(event, _)| Arc::clone(event)).collect()
    }
}

#[cfg(test)]
mod tests {
    use lagscope_analyzer::log_events::take_once;
    use lagscope_model::{LogRecord, ResourceFields};
    use lagscope_store::{IngestBatch, SqliteStore, Store};

    use super::*;

    const WINDOW: i64 = 60_000_000_000;

    fn line(cluster: &str, node: &str, at: i64, body: &str) -> LogRecord {
        LogRecord {
            time_unix_nano: at,
            observed_time_unix_nano: Some(at),
            severity_number: 13,
            severity_text: Some("WARN".to_string()),
            body: serde_json::json!(body),
            event_name: None,
            trace_id: None,
            span_id: None,
            resource: ResourceFields {
                cluster: Some(cluster.to_string()),
                node_id: Some(node.to_string()),
                ..ResourceFields::default()
            },
            scope_name: None,
            scope_version: None,
            attributes: serde_json::Map::new(),
        }
    }

    /// What a pass took from a read of the store before the cache.
    async fn read_anew(store: &dyn Store, cluster: &Option<String>, limit: u32) -> Vec<LogEvent> {
        let logs = store.recognised_logs(cluster.as_deref(), WINDOW, limit).await.expect("read");
        let mut events: Vec<LogEvent> = logs.iter().filter_map(classify).collect();
        take_once(&mut events);
        events
    }

    /// Batches of lines (recognised and not, some sent again by a second shipper, some late,
    /// the window moving past the oldest), read after each: the held lines are what a read of
    /// the store returns, at several limits.
    #[tokio::test]
    async fn held_lines_are_what_the_store_returns() {
        let directory = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open_file(&directory.path().join("store.db")).await.expect("open");
        held_lines_are_what(&store).await;
    }

    #[tokio::test]
    async fn on_postgresql_held_lines_are_what_the_store_returns() {
        let url = crate::postgres_support::fresh_database().await;
        let store = lagscope_store::PgStore::connect(&url).await.expect("postgres");
        held_lines_are_what(&store).await;
    }

    async fn held_lines_are_what(store: &dyn Store) {
        let feed = store.span_feed().expect("a span feed");
        let clusters = [Some("c1".to_string()), Some("c2".to_string()), None];
        let mut caches: Vec<(u32, LineCache)> =
            [3_u32, 7, 1_000].into_iter().map(|limit| (limit, LineCache::default())).collect();
        // The same limits through `refresh`, every cluster at once, with what each last gave.
        type Given = HashMap<Option<String>, Vec<Arc<LogEvent>>>;
        let mut refreshed: Vec<(u32, LineCache, Given)> =
            [3_u32, 7, 1_000].into_iter().map(|limit| (limit, LineCache::default(), HashMap::new())).collect();
        let mut unchanged = 0;
        let second = 1_000_000_000_i64;
        let mut random = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move |bound: u64| {
            random ^= random << 13;
            random ^= random >> 7;
            random ^= random << 17;
            random % bound
        };
        let mut now = 1_700_000_000 * second;
        for batch in 0..40 {
            let mut logs = Vec::new();
            for _ in 0..next(6) {
                let cluster = ["c1", "c2"][next(2) as usize];
                let node = ["r1", "r2", "nn1"][next(3) as usize];
                // Late lines too: up to 20 s before the batch's time.
                let at = now - (next(20) as i64) * second;
                let body = match next(5) {
                    0 => format!(
                        "org.apache.hadoop.hdfs.server.federation.router.NoNamenodesAvailableException: No namenodes available under nameservice ns{}",
                        next(2)
                    ),
                    1 => format!(
                        "Encountered OMNotLeaderException from om{}. Disable OM follower read and retry OM leader directly.",
                        next(3)
                    ),
                    2 => format!("an ordinary line {}", next(1_000)),
                    // Recognised by the store's phrases, not by `classify`.
                    3 => {
                        "Failed to switch to service pulsar://b:6650, will switch to the service pulsar://b:6650 later"
                            .to_string()
                    }
                    _ => format!(
                        "Current Pulsar service is pulsar://a:6650, it has been down for {} ms, switch to the service pulsar://b:6650.",
                        next(3)
                    ),
                };
                let record = line(cluster, node, at, &body);
                if next(5) == 0 {
                    // The same line forwarded by a second shipper (observed again).
                    let mut copy = record.clone();
                    copy.observed_time_unix_nano = Some(at + 1);
                    logs.push(copy);
                }
                logs.push(record);
            }
            store.ingest(&IngestBatch { logs, ..IngestBatch::default() }).await.expect("ingest");
            for cluster in &clusters {
                for (limit, cache) in &mut caches {
                    cache.refresh(feed, std::slice::from_ref(cluster), (WINDOW, *limit), None).await.expect("read");
                    let held: Vec<LogEvent> = cache.events(cluster).iter().map(|event| (**event).clone()).collect();
                    assert_eq!(
                        held,
                        read_anew(store, cluster, *limit).await,
                        "batch {batch}, {cluster:?}, limit {limit}"
                    );
                }
            }
            for (limit, cache, given) in &mut refreshed {
                let changed = cache.refresh(feed, &clusters, (WINDOW, *limit), None).await.expect("refresh");
                unchanged += clusters.len() - changed.len();
                given.extend(changed);
                for cluster in &clusters {
                    let held: Vec<LogEvent> =
                        given.get(cluster).into_iter().flatten().map(|event| (**event).clone()).collect();
                    assert_eq!(
                        held,
                        read_anew(store, cluster, *limit).await,
                        "refreshed: batch {batch}, {cluster:?}, limit {limit}"
                    );
                }
            }
            now += (next(8) as i64) * second;
        }
        assert!(caches.iter().all(|(_, cache)| cache.held() > 0));
        // Some clusters were unchanged (and not given again), or the check proves nothing.
        assert!(unchanged > 0, "no refresh found a cluster unchanged");
    }
}
