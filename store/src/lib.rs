//! lagscope's storage: the [`Store`] trait every backend implements, and its embedded SQLite
//! backend ([`SqliteStore`]).
//!
//! The trait is the contract between the store and everything above it (collectors, the
//! live analyzer, the API): they never see SQL, rows or connections, only domain types.
//! Backends must make [`Store::ingest`] atomic (all of a batch or none of it) and durable
//! before it returns, because receivers acknowledge data on its return. Every value that
//! reaches SQL is bound, never spliced into the statement text.

mod anomaly_query;
mod cluster_latest;
mod coordination;
mod error;
pub mod paging;
mod postgres;
mod rows;
mod sqlite;
mod supersede;

use async_trait::async_trait;
use lagscope_model::{Anomaly, AnomalyKind, LogRecord, ReadRollup, Sample, SeriesKey, SeriesMeta, Span, UnixNanos};
use serde_json::Value;

pub use coordination::{ClusterStatus, Coordinator, InstanceStatus, Leases, Mark, PendingMark, SHARDS};
pub use error::StoreError;
pub use postgres::{PARTITIONED_TABLES, PgStore, day_partition_name, redact as redact_url};
pub use sqlite::SqliteStore;
pub use supersede::same_incident;

/// The file name of the SQLite database inside a data directory.
pub fn sqlite_database_file() -> &'static str {
    sqlite::DATABASE_FILE
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// What one receiver request delivers: committed together or not at all.
#[derive(Debug, Default, Clone)]
pub struct IngestBatch {
    pub spans: Vec<Span>,
    pub samples: Vec<Sample>,
    pub logs: Vec<LogRecord>,
}

impl IngestBatch {
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty() && self.samples.is_empty() && self.logs.is_empty()
    }
}

/// What an ingest committed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct IngestReceipt {
    /// Spans written (a span re-sent with a trace and span id already stored is not written
    /// twice, so that an exporter's retry after a lost response does no harm).
    pub spans_written: u64,
    pub samples_written: u64,
    pub logs_written: u64,
}

/// Which series of a cluster a scope read takes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Namespaces<'a> {
    /// Those naming this namespace (`None`: naming none), and those naming none.
    One(Option<&'a str>),
    /// The series of these metric names, whatever namespace they name.
    Every(&'a [&'a str]),
}

impl<'a> Namespaces<'a> {
    /// The binds of the scope queries: the namespace, and the metric names as a JSON array
    /// when every namespace is taken.
    pub(crate) fn binds(self) -> (Option<&'a str>, Option<String>) {
        match self {
            Namespaces::One(namespace) => (namespace, None),
            Namespaces::Every(names) => (None, Some(serde_json::json!(names).to_string())),
        }
    }
}

/// How far from the client's own spans in a trace (before the first one's start, after the
/// last one's end) a span of that trace may start and still be read as part of the client's
/// timeline: an hour. Hops are joined within a horizon of their attempt anyway (90 s by
/// default); the bound lets PostgreSQL look a trace up in the partitions of its time only,
/// instead of in every day kept.
pub const TRACE_WINDOW_NANOS: i64 = 3_600 * 1_000_000_000;

/// A half-open time range `[from, to)` in Unix nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeRange {
    pub from: UnixNanos,
    pub to: UnixNanos,
}

impl TimeRange {
    pub const ALL: TimeRange = TimeRange { from: i64::MIN, to: i64::MAX };
}

/// Which anomalies to list. `None` means "any".
#[derive(Debug, Default, Clone)]
pub struct AnomalyFilter {
    pub kind: Option<AnomalyKind>,
    pub cluster: Option<String>,
    pub namespace: Option<String>,
    pub client_id: Option<String>,
    /// Anomalies whose window ends at or after this time.
    pub since: Option<UnixNanos>,
    /// Anomalies whose window starts before this time.
    pub until: Option<UnixNanos>,
    /// Only anomalies with an id below this one (for paging, newest first).
    pub before_id: Option<i64>,
    /// Only open (true) or only resolved (false) anomalies.
    pub open: Option<bool>,
    pub limit: u32,
    /// Leave each anomaly's evidence out (`Value::Null`): what lists and tables of many
    /// anomalies show, without reading kilobytes of evidence per row.
    pub skip_evidence: bool,
}

/// An anomaly as stored: with its id and when it was first and last reported.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredAnomaly {
    pub id: i64,
    pub anomaly: Anomaly,
    pub first_seen_unix_nano: UnixNanos,
    pub last_seen_unix_nano: UnixNanos,
    /// The anomaly that replaced this one: the same incident found whole, starting earlier
    /// (`supersede`). Such rows are not listed; the alerter's feed and reads by id still see them.
    pub superseded_by: Option<i64>,
}

impl StoredAnomaly {
    /// Where this change stands in the alerter's feed.
    pub fn change_key(&self) -> AlertCursor {
        AlertCursor { last_seen_unix_nano: self.last_seen_unix_nano, anomaly_id: self.id }
    }
}

/// `anomalies`, each seen at `seen_at`, as the backends' upserts take them.
pub(crate) fn seen_at_once(anomalies: &[Anomaly], seen_at: UnixNanos) -> Vec<(&Anomaly, UnixNanos)> {
    anomalies.iter().map(|anomaly| (anomaly, seen_at)).collect()
}

/// Anomalies each seen at its own time, as the backends' upserts take them.
pub(crate) fn seen_each(anomalies: &[(Anomaly, UnixNanos)]) -> Vec<(&Anomaly, UnixNanos)> {
    anomalies.iter().map(|(anomaly, seen_at)| (anomaly, *seen_at)).collect()
}

/// What upserting anomalies changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct UpsertOutcome {
    /// Ids of anomalies that were not stored before (new incidents).
    pub inserted: Vec<i64>,
    /// Anomalies stored before that changed (their window grew, their evidence or summary
    /// changed): written, with a new `last_seen`.
    pub updated: u64,
    /// Anomalies found again exactly as stored: not written, `last_seen` kept.
    pub unchanged: u64,
    /// Stored anomalies replaced by a version of the same incident that starts earlier
    /// (`supersede`): closed, no longer listed. (A new anomaly replaced at once by one stored
    /// before is counted here, not in `inserted`.)
    pub superseded: u64,
}

impl UpsertOutcome {
    /// Counts what an upsert's `RETURNING id, first_seen, last_seen` says of one anomaly: no
    /// row, unchanged; a row seen before, updated. A new row's id is returned, to be
    /// superseded and then counted by [`UpsertOutcome::inserted`] (both backends).
    pub(crate) fn found(&mut self, returned: Option<(i64, i64, i64)>) -> Option<i64> {
        match returned {
            Some((id, first_seen, last_seen)) if first_seen == last_seen => return Some(id),
            Some(_) => self.updated += 1,
            None => self.unchanged += 1,
        }
        None
    }

    /// Counts a new row `id` once superseding replaced the stored anomalies `superseded` (the
    /// new row itself among them, when one stored before replaced it at once).
    pub(crate) fn inserted(&mut self, id: i64, superseded: &[i64]) {
        self.superseded += superseded.len() as u64;
        if !superseded.contains(&id) {
            self.inserted.push(id);
        }
    }
}

/// One series with its samples in a time range.
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesSamples {
    pub key: SeriesKey,
    pub meta: SeriesMeta,
    pub points: Vec<(UnixNanos, Option<f64>, Option<Value>)>,
}

/// How [`Store::series_buckets`] reduces the samples of one slice of a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reduce {
    /// The slice's last sample.
    Last,
    /// The smallest value of the slice.
    Min,
    /// The largest value of the slice.
    Max,
}

/// The width of each of `buckets` equal slices of `range` (the last may be shorter), or
/// `None` when the range is too wide to cut (more than `i64::MAX` nanoseconds).
pub fn bucket_width(range: TimeRange, buckets: u32) -> Option<i64> {
    let length = range.to.checked_sub(range.from).filter(|length| *length > 0)?;
    let buckets = i64::from(buckets.max(1));
    Some((length / buckets + i64::from(length % buckets != 0)).max(1))
}

/// Where the alerter is in the anomalies' stream of changes: the (last seen, id) of the last
/// change it has handled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct AlertCursor {
    pub last_seen_unix_nano: UnixNanos,
    pub anomaly_id: i64,
}

/// What one receiver has been told about one incident.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct AlertIncident {
    pub receiver: String,
    /// `lagscope_alerts::IncidentKey`.
    pub incident: String,
    pub dedup_key: String,
    pub firing: bool,
    /// The `lagscope_alerts::Alert` last built, as JSON.
    pub alert: String,
    pub latest_anomaly_id: i64,
    pub members: i64,
    /// Wall clock of the latest change of a member.
    pub last_member_unix_nano: UnixNanos,
    /// Wall clock of the latest message enqueued for it.
    pub last_sent_unix_nano: UnixNanos,
}

/// A message to enqueue for a receiver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAlertMessage {
    pub receiver: String,
    pub dedup_key: String,
    /// `trigger`, `refresh`, `resolve` or `test`.
    pub event: String,
    /// The body the receiver is sent (JSON).
    pub body: String,
    pub created_unix_nano: UnixNanos,
}

/// A message of the outbox and how its delivery went.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct AlertMessage {
    pub id: i64,
    pub receiver: String,
    pub dedup_key: String,
    pub event: String,
    pub body: String,
    pub created_unix_nano: UnixNanos,
    pub attempts: i64,
    pub next_attempt_unix_nano: UnixNanos,
    /// `pending`, `delivered` or `failed` (refused for good: a 4xx other than 429).
    pub state: String,
    pub finished_unix_nano: Option<UnixNanos>,
    pub last_error: Option<String>,
}

/// What one delivery attempt of a message came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryOutcome {
    Delivered,
    /// Not taken (unreachable, 429, 5xx): try again then.
    Retry {
        next_attempt_unix_nano: UnixNanos,
        error: String,
    },
    /// Refused for good.
    Failed {
        error: String,
    },
}

/// Retention: rows older than a signal's cut-off (Unix nanoseconds; spans by start, samples
/// and logs by time, anomalies resolved before it by end) are removed. `None` keeps all.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RetentionCutoffs {
    pub spans: Option<UnixNanos>,
    pub samples: Option<UnixNanos>,
    pub logs: Option<UnixNanos>,
    pub anomalies: Option<UnixNanos>,
}

/// What one retention pass removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RetentionReport {
    /// Rows deleted one by one (SQLite; PostgreSQL's default partitions and anomalies).
    pub spans: u64,
    pub samples: u64,
    pub logs: u64,
    pub anomalies: u64,
    /// Read rollups of minutes before the spans' cut-off.
    pub rollups: u64,
    /// Delivered or failed alert messages, and resolved incidents, older than the anomalies'
    /// cut-off.
    pub alerts: u64,
    /// Whole time partitions dropped (PostgreSQL), by name.
    pub partitions_dropped: Vec<String>,
}

/// Rows deleted per statement by retention: small enough that ingest, which shares the
/// writer, never waits long behind a retention pass.
pub const RETENTION_BATCH_ROWS: i64 = 5_000;

/// One schema migration and whether a database has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationState {
    pub version: i64,
    pub description: String,
    pub applied: bool,
    /// Applied, but from a file that has changed since (the database needs attention).
    pub modified: bool,
}

/// The migrations this build carries, against the `_sqlx_migrations` rows (version,
/// checksum) a database holds.
fn migration_states(migrator: &sqlx::migrate::Migrator, applied: &[(i64, bool, Vec<u8>)]) -> Vec<MigrationState> {
    migrator
        .iter()
        .filter(|migration| migration.migration_type.is_up_migration())
        .map(|migration| {
            let row = applied.iter().find(|(version, success, _)| *version == migration.version && *success);
            MigrationState {
                version: migration.version,
                description: migration.description.to_string(),
                applied: row.is_some(),
                modified: row.is_some_and(|(_, _, checksum)| checksum.as_slice() != &*migration.checksum),
            }
        })
        .collect()
}

/// Row counts, for health and the service's own metrics.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StoreStats {
    pub spans: u64,
    pub series: u64,
    pub samples: u64,
    pub logs: u64,
    pub anomalies: u64,
}

/// A number of anomalies of one kind, cluster, severity and status.
/// A committed state a span reported: its cluster and namespace, when the span ended, the state.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct CommittedOnSpan {
    pub cluster: Option<String>,
    pub namespace: Option<String>,
    pub end_unix_nano: UnixNanos,
    pub state_committed: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct AnomalyCount {
    pub kind: String,
    pub cluster: Option<String>,
    pub severity: String,
    pub open: bool,
    pub count: i64,
}

/// A (cluster, namespace, node) that metric series name; any part may be absent.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, sqlx::FromRow)]
pub struct Scope {
    pub cluster: Option<String>,
    pub namespace: Option<String>,
    pub node_id: Option<String>,
}

/// Where telemetry and anomalies live. SQLite today; PostgreSQL is a second implementation.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Commits a batch atomically and durably.
    async fn ingest(&self, batch: &IngestBatch) -> Result<IngestReceipt>;

    /// One client's spans whose start lies in `range`, plus every span sharing a trace with
    /// them (the router and server hops) that starts within [`TRACE_WINDOW_NANOS`] of the
    /// client's spans in that trace, ordered by start time. At most `limit` of the client's
    /// own spans are read, the most recent ones.
    async fn client_spans(&self, client_id: &str, range: TimeRange, limit: u32) -> Result<Vec<Span>>;

    /// Spans of one (cluster, namespace) whose start lies in `range`, the most recent `limit`,
    /// ordered by start time: what the namespace-level detectors look at.
    async fn scope_spans(
        &self,
        cluster: Option<&str>,
        namespace: Option<&str>,
        range: TimeRange,
        limit: u32,
    ) -> Result<Vec<Span>>;

    /// Metric samples of one (cluster, namespace), plus the cluster's samples that name no
    /// namespace, from `window` before the scope's latest sample on.
    async fn scope_samples(&self, cluster: Option<&str>, namespace: Option<&str>, window: i64) -> Result<Vec<Sample>> {
        Ok(self
            .scope_samples_from(cluster, namespace, window, i64::MIN)
            .await?
            .into_iter()
            .map(|(_, sample)| sample)
            .collect())
    }

    /// Of [`Store::scope_samples`], those whose time is `from` or later, each with its series'
    /// id, in the same order (by time, then series id): what a reader that holds the scope's
    /// earlier samples reads of what was committed since (the live analyzer's sample cache).
    async fn scope_samples_from(
        &self,
        cluster: Option<&str>,
        namespace: Option<&str>,
        window: i64,
        from: i64,
    ) -> Result<Vec<(i64, Sample)>>;

    /// Metric samples of the series of `cluster` named `names`, whatever namespace they name,
    /// from `window` before the latest of them on: for detectors that compare a node's
    /// namespaces (shards) with each other.
    async fn cluster_samples(&self, cluster: Option<&str>, names: &[&str], window: i64) -> Result<Vec<Sample>>;

    /// Spans of `cluster`/`namespace` (`None` = any) whose start lies in `range`, the oldest
    /// `limit`, ordered by start time and then by arrival (a total order, so a reader can
    /// page through them): what lag analytics and exports read.
    async fn spans_in_range(
        &self,
        cluster: Option<&str>,
        namespace: Option<&str>,
        range: TimeRange,
        limit: u32,
    ) -> Result<Vec<Span>>;

    /// Metric samples of `cluster`/`namespace` (`None` = any; a namespace also takes the
    /// series that name none) whose time lies in `range`, the oldest `limit`, oldest first
    /// (samples of one time by series, a total order).
    async fn samples_in_range(
        &self,
        cluster: Option<&str>,
        namespace: Option<&str>,
        range: TimeRange,
        limit: u32,
    ) -> Result<Vec<Sample>>;

    /// Metric samples of the series named `names` whose time lies in `range`, the oldest
    /// `limit`, in [`Store::samples_in_range`]'s order: what a reader of a few metrics takes
    /// without reading every series' samples.
    async fn named_samples_in_range(&self, names: &[&str], range: TimeRange, limit: u32) -> Result<Vec<Sample>>;

    /// The committed states spans whose start lies in `range` report
    /// (`lagscope.state.committed`), oldest first, at most `limit`: what the apply-lag gauges
    /// read beside the `lagscope.server.committed_state` samples, without reading spans whole.
    async fn committed_on_spans(&self, range: TimeRange, limit: u32) -> Result<Vec<CommittedOnSpan>>;

    /// The client ids appearing in the given traces (for spans that name no client).
    async fn clients_of_traces(&self, trace_ids: &[String]) -> Result<Vec<String>>;

    /// Stores anomalies, updating those whose fingerprint is already stored when they changed
    /// (a window that grew, another summary, evidence, severity, node or status): the live
    /// analyzer finds a client's anomalies of the last minutes again on every pass, and a row
    /// written again unchanged would cost a write and a change in the alerter's feed.
    /// `last_seen` is therefore when the anomaly last changed.
    async fn upsert_anomalies(&self, anomalies: &[Anomaly], seen_at: UnixNanos) -> Result<UpsertOutcome>;

    /// [`Store::upsert_anomalies`] of anomalies each seen at its own time, in one transaction
    /// and in their order: what `import` stores of a dump, where every anomaly keeps when it
    /// was first reported (a transaction each cost a commit, and on SQLite a sync to disk,
    /// per anomaly).
    async fn upsert_anomalies_seen_at(&self, anomalies: &[(Anomaly, UnixNanos)]) -> Result<UpsertOutcome>;

    /// Anomalies matching the filter, newest first.
    async fn anomalies(&self, filter: &AnomalyFilter) -> Result<Vec<StoredAnomaly>>;

    /// Up to `limit` anomalies of `kind` in `range` (ending at or after its start, starting
    /// before its end), without evidence, newest id first: those ending inside the range, the
    /// latest ending first (an index read backwards that stops at `limit`, however many the
    /// range holds); then, when there is room, those ending after it (windows across its end).
    /// What a page reads to show a range's newest anomalies of each kind.
    async fn newest_of_kind(&self, kind: AnomalyKind, range: TimeRange, limit: u32) -> Result<Vec<StoredAnomaly>>;

    /// One anomaly by id.
    async fn anomaly(&self, id: i64) -> Result<Option<StoredAnomaly>>;

    /// How many anomalies match the filter (its `limit` and `before_id` ignored), per kind,
    /// cluster, severity and open: what an overview counts, without reading evidence.
    async fn anomaly_counts(&self, filter: &AnomalyFilter) -> Result<Vec<AnomalyCount>>;

    /// The series of a metric whose labels include every `(label, value)` in `matchers`,
    /// with their samples in `range`.
    async fn series_samples(
        &self,
        name: &str,
        matchers: &[(String, String)],
        range: TimeRange,
    ) -> Result<Vec<SeriesSamples>>;

    /// The series of a metric (matched as by [`Store::series_samples`]), each cut down to at
    /// most `buckets` points: `range` is cut into equal slices ([`bucket_width`]), and each
    /// slice with samples gives one point at the time of its last sample, valued as `reduce`
    /// says. Samples without a value are left out. What a chart draws, without reading every
    /// sample out of the store; `buckets = 1` with [`Reduce::Last`] is each series' latest
    /// value in the range.
    async fn series_buckets(
        &self,
        name: &str,
        matchers: &[(String, String)],
        range: TimeRange,
        buckets: u32,
        reduce: Reduce,
    ) -> Result<Vec<SeriesSamples>>;

    /// Stores read rollups, each replacing the stored one of its minute and scope (a later
    /// analysis pass has seen more of the minute).
    async fn upsert_read_rollups(&self, rollups: &[ReadRollup]) -> Result<()>;

    /// What one live analysis pass found: [`Store::upsert_anomalies`] and then
    /// [`Store::upsert_read_rollups`], nothing written when both are empty. SQLite writes both
    /// in one transaction (its one writer is shared with ingest: each transaction waits for it
    /// and syncs the log once); by default, each in its own.
    async fn upsert_findings(
        &self,
        anomalies: &[Anomaly],
        rollups: &[ReadRollup],
        seen_at: UnixNanos,
    ) -> Result<UpsertOutcome> {
        let outcome = if anomalies.is_empty() {
            UpsertOutcome::default()
        } else {
            self.upsert_anomalies(anomalies, seen_at).await?
        };
        self.upsert_read_rollups(rollups).await?;
        Ok(outcome)
    }

    /// The read rollups of the minutes starting in `range`, in (minute, scope) order, at most
    /// `limit`.
    async fn read_rollups(&self, range: TimeRange, limit: u32) -> Result<Vec<ReadRollup>>;

    /// Anomalies changed (inserted or updated) after `after`, in the order of their change
    /// (last seen, id), at most `limit`: the alerter's feed.
    async fn anomaly_changes(&self, after: AlertCursor, limit: u32) -> Result<Vec<StoredAnomaly>>;

    /// The (last seen, id) keys of the changes after `after` up to and including `through`, in
    /// change order, at most `limit`: the alerter re-reads these behind its cursor, where
    /// nearly every change is one it has taken, without reading their rows.
    async fn anomaly_change_keys(
        &self,
        after: AlertCursor,
        through: AlertCursor,
        limit: u32,
    ) -> Result<Vec<AlertCursor>>;

    /// The alerter's saved state: its cursor (none before its first pass), and the incidents
    /// still firing or last sent at or after `since`.
    async fn alert_state(&self, since: UnixNanos) -> Result<(Option<AlertCursor>, Vec<AlertIncident>)>;

    /// In one transaction: moves the cursor, stores the incidents (each replacing its
    /// (receiver, incident) row) and enqueues the messages.
    async fn commit_alerts(
        &self,
        cursor: Option<AlertCursor>,
        incidents: &[AlertIncident],
        messages: &[NewAlertMessage],
    ) -> Result<()>;

    /// Pending messages, oldest first, at most `limit`.
    async fn pending_alert_messages(&self, limit: u32) -> Result<Vec<AlertMessage>>;

    /// Records one delivery attempt of a message at `now`.
    async fn alert_message_attempted(&self, id: i64, now: UnixNanos, outcome: &DeliveryOutcome) -> Result<()>;

    /// Messages newest first (below `before_id`), at most `limit`: the delivery record.
    async fn alert_messages(&self, before_id: Option<i64>, limit: u32) -> Result<Vec<AlertMessage>>;

    /// Log records whose time lies in `range`, oldest first, at most `limit`.
    async fn logs(&self, range: TimeRange, limit: u32) -> Result<Vec<LogRecord>>;

    /// The log lines of one cluster (`None`: records naming none) that carry a failure
    /// phrase the analyzer recognises (`lagscope_analyzer::log_events::PHRASES`), from
    /// `window` before the cluster's latest record on, the most recent `limit`, oldest first.
    async fn recognised_logs(&self, cluster: Option<&str>, window: i64, limit: u32) -> Result<Vec<LogRecord>>;

    async fn stats(&self) -> Result<StoreStats>;

    /// The latest time any span starts or sample is taken (`None` for an empty store): where
    /// dashboards put the end of their default range, so that data from the past (an imported
    /// capture, a paused simulator) is shown rather than an empty "now". Two index look-ups.
    async fn latest_time(&self) -> Result<Option<UnixNanos>>;

    /// The latest time `cluster` (`None`: telemetry naming no cluster) sent anything: the
    /// latest start of its spans, time of its samples or time of its log lines; `None` when
    /// it sent none. Index seeks only: one per namespace of its spans and one per series.
    async fn cluster_latest_time(&self, cluster: Option<&str>) -> Result<Option<UnixNanos>>;

    /// Every (cluster, namespace, node) some metric series names, sorted: what discovery lists
    /// as clusters, namespaces and nodes. Read from the series table (one row per series).
    async fn scopes(&self) -> Result<Vec<Scope>>;

    /// Client ids after `after` (all when `None`), in order, at most `limit`: one index seek
    /// per client (a loose index scan), however many spans each has.
    async fn clients(&self, after: Option<&str>, limit: u32) -> Result<Vec<String>>;

    /// Removes what the retention no longer covers, in bounded steps that interleave with
    /// ingest (see [`RetentionCutoffs`]).
    async fn enforce_retention(&self, cutoffs: &RetentionCutoffs) -> Result<RetentionReport>;

    /// Leases and marks shared by several instances, where the backend supports them
    /// (PostgreSQL); `None` for a store only one process uses.
    fn coordinator(&self) -> Option<&dyn Coordinator> {
        None
    }

    /// Spans in the order they were committed, where the backend can tell that order (SQLite
    /// by its row ids, PostgreSQL by ids it has settled); `None` otherwise.
    fn span_feed(&self) -> Option<&dyn SpanFeed> {
        None
    }

    /// How many ingest transactions the committer may have in flight at once. One for a
    /// single-writer store (SQLite); more where one transaction's COPY can run while another
    /// waits for its WAL flush (PostgreSQL). Concurrent ingests must not deadlock each other:
    /// every row lock an ingest takes on shared rows (series, marks) is taken in key order.
    fn concurrent_ingests(&self) -> usize {
        1
    }
}

/// What a read of a cluster's recognised lines committed after an id brings
/// ([`SpanFeed::recognised_logs_after`]): the lines with their ids, and the time the cluster's
/// window ends at (`None`: it has no lines).
pub type RecognisedRead = (Vec<(i64, LogRecord)>, Option<i64>);

/// Spans in the order they were committed, for a reader that keeps a scope's spans between
/// reads and adds only what was committed since (the live analyzer's scope passes).
///
/// Offered by a store whose span ids, as the feed answers them, grow in commit order and are
/// never handed out again. SQLite: one writer commits at a time and retention never deletes
/// the newest span (SQLite gives a new row the largest id plus one). PostgreSQL: concurrent
/// ingests take ids from a sequence and may commit in another order (a reader that has seen
/// id 10 may later find 9), so its feed answers an id only once every ingest that could
/// still write a row at or below it has ended (`postgres/feed.rs`).
#[async_trait]
pub trait SpanFeed: Send + Sync {
    /// The newest span's id (0 for a store without spans). Every span with this id or a lower
    /// one is committed, and a span committed later has a higher one.
    async fn latest_span_id(&self) -> Result<i64>;

    /// [`Store::scope_spans`] over all time as of `through` (a [`SpanFeed::latest_span_id`]):
    /// the newest `limit` spans of (cluster, namespace) among those with ids up to it.
    async fn scope_spans_through(
        &self,
        cluster: Option<&str>,
        namespace: Option<&str>,
        through: i64,
        limit: u32,
    ) -> Result<Vec<Span>>;

    /// Every span whose id lies in `after..=through`, with its id, ordered by start time (then
    /// id), the lowest `limit` ids: everything committed between two
    /// [`SpanFeed::latest_span_id`]s (a reader that gets `limit` of them should start again).
    async fn spans_between(&self, after: i64, through: i64, limit: u32) -> Result<Vec<(i64, Span)>>;

    /// [`Store::client_spans`] over all time as of `through`, each span with its id: the
    /// client's newest `limit` spans with ids up to it, and the spans of their traces (with
    /// ids up to it) within [`TRACE_WINDOW_NANOS`] of the client's spans in each trace.
    async fn client_spans_through(&self, client_id: &str, through: i64, limit: u32) -> Result<Vec<(i64, Span)>>;

    /// Every span with a span id (what [`Store::client_spans`] takes of a trace) of the given
    /// traces, with an id up to `through`, with its id, ordered by start time (then id).
    async fn trace_spans_through(&self, trace_ids: &[&str], through: i64) -> Result<Vec<(i64, Span)>>;

    /// The spans of the given (cluster, namespace) scopes whose ids lie in `after..=through`:
    /// what those scopes gained between two [`SpanFeed::latest_span_id`]s, ordered by start
    /// time, at most `limit` (a reader that gets `limit` of them should read the scopes anew).
    async fn scope_spans_between(
        &self,
        scopes: &[(Option<String>, Option<String>)],
        after: i64,
        through: i64,
        limit: u32,
    ) -> Result<Vec<Span>>;

    /// The log lines are fed alike (one writer, ids in commit order, the newest line kept by
    /// retention; a line sent again is not stored again). [`Store::recognised_logs`] of the
    /// lines with ids above `after` (0: all), each with its id, and the time the window ends
    /// at (the cluster's latest log time; `None` when it has no lines). A reader holding what
    /// it read before merges the new lines in and keeps the newest `limit` of the window: what
    /// [`Store::recognised_logs`] returns.
    async fn recognised_logs_after(
        &self,
        cluster: Option<&str>,
        window: i64,
        after: i64,
        limit: u32,
    ) -> Result<(Vec<(i64, LogRecord)>, Option<i64>)>;

    /// [`SpanFeed::recognised_logs_after`] of each (cluster, after) asked, in that order, as of
    /// one settled id for them all: a pass that needs several clusters' new lines waits for the
    /// ingests in flight once, not once per cluster.
    async fn recognised_logs_after_each(
        &self,
        asked: &[(Option<&str>, i64)],
        window: i64,
        limit: u32,
    ) -> Result<Vec<RecognisedRead>>;
}
