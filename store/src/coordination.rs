//! Several `serve` instances on one database: what each committed batch asks the live
//! analyzer to look at again ([`Mark`]), and how instances split that work ([`Coordinator`]).
//!
//! Work is split into [`SHARDS`] shards by a stable hash of the mark (a client id, a trace id,
//! a (cluster, namespace) scope, a log cluster). An instance analyses the marks of the shards
//! it holds a lease on; leases live in the database, are renewed on every balancing round and
//! move to the live instances when their holder stops renewing them. Marks are written in the
//! same transaction as the data that caused them, so no committed batch goes unanalysed when
//! an instance dies: its marks wait in the database for the shard's next holder. Anomalies are
//! unique by fingerprint in the database, so a shard analysed twice around a hand-over still
//! reports each anomaly once.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use async_trait::async_trait;
use lagscope_model::conventions::{CLUSTER, NAMESPACE};
use lagscope_model::{LogRecord, Sample, Span};

use crate::Result;

/// How many shards the analysis work is split into. Fixed by the schema
/// (`migrations/postgres`, `analysis_leases`): changing it needs a migration.
pub const SHARDS: i32 = 64;

/// Something the live analyzer must look at again because data about it was committed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mark {
    /// A client had spans ingested: its timelines are rebuilt.
    Client(String),
    /// A trace had spans ingested that name no client (router and server hops): the clients
    /// of the trace are looked up once the spans are committed.
    Trace(String),
    /// A (cluster, namespace) scope had spans or metric samples ingested: its node- and
    /// namespace-level detectors run again.
    Scope(Option<String>, Option<String>),
    /// A cluster had log records ingested: its recognised lines are read again.
    LogCluster(Option<String>),
}

impl Mark {
    /// Every mark a committed batch makes, each once.
    pub fn of_batch(spans: &[Span], samples: &[Sample], logs: &[LogRecord]) -> BTreeSet<Mark> {
        let mut marks = BTreeSet::new();
        for log in logs {
            marks.insert(Mark::LogCluster(log.resource.cluster.clone()));
        }
        for sample in samples {
            let cluster = sample.series.label(CLUSTER);
            if cluster.is_some() {
                let namespace = sample.series.label(NAMESPACE);
                marks.insert(Mark::Scope(cluster.map(str::to_string), namespace.map(str::to_string)));
            }
        }
        // Spans of one batch mostly share a scope: it is cloned once per run of them.
        let mut previous_scope: Option<(&Option<String>, &Option<String>)> = None;
        for span in spans {
            let scope = (&span.resource.cluster, &span.call.namespace);
            if (scope.0.is_some() || scope.1.is_some()) && previous_scope != Some(scope) {
                marks.insert(Mark::Scope(scope.0.clone(), scope.1.clone()));
                previous_scope = Some(scope);
            }
            match (&span.call.client_id, &span.trace_id) {
                (Some(client_id), _) => marks.insert(Mark::Client(client_id.clone())),
                (None, Some(trace_id)) => marks.insert(Mark::Trace(trace_id.clone())),
                (None, None) => false,
            };
        }
        marks
    }

    /// The oldest time of `samples` per (cluster, namespace) of their series' labels, every
    /// sample counted: what a reader holding a scope's samples must read again (the live
    /// analyzer's sample cache). A cluster's samples that name no namespace are under
    /// (cluster, None); they belong to every namespace of the cluster.
    pub fn sample_times(samples: &[Sample]) -> BTreeMap<(Option<&str>, Option<&str>), i64> {
        let mut times: BTreeMap<(Option<&str>, Option<&str>), i64> = BTreeMap::new();
        for sample in samples {
            let scope = (sample.series.label(CLUSTER), sample.series.label(NAMESPACE));
            let oldest = times.entry(scope).or_insert(sample.time_unix_nano);
            *oldest = (*oldest).min(sample.time_unix_nano);
        }
        times
    }

    /// The mark's kind as stored (`analysis_marks.kind`).
    pub(crate) fn kind(&self) -> i16 {
        match self {
            Mark::Client(_) => 0,
            Mark::Trace(_) => 1,
            Mark::Scope(..) => 2,
            Mark::LogCluster(_) => 3,
        }
    }

    /// The mark's key as stored (`analysis_marks.key`): the id itself, or the scope or
    /// cluster as JSON (which keeps "no namespace" apart from an empty one).
    pub(crate) fn key(&self) -> String {
        match self {
            Mark::Client(id) | Mark::Trace(id) => id.clone(),
            Mark::Scope(cluster, namespace) => serde_json::json!([cluster, namespace]).to_string(),
            Mark::LogCluster(cluster) => serde_json::json!(cluster).to_string(),
        }
    }

    /// The mark back from its stored kind and key.
    pub(crate) fn from_stored(kind: i16, key: String) -> Result<Mark> {
        let corrupt = |problem: String| crate::StoreError::Corrupt {
            what: "analysis mark",
            detail: format!("({kind}, {key:?}): {problem}"),
        };
        match kind {
            0 => Ok(Mark::Client(key)),
            1 => Ok(Mark::Trace(key)),
            2 => {
                let (cluster, namespace): (Option<String>, Option<String>) =
                    serde_json::from_str(&key).map_err(|error| corrupt(error.to_string()))?;
                Ok(Mark::Scope(cluster, namespace))
            }
            3 => Ok(Mark::LogCluster(serde_json::from_str(&key).map_err(|error| corrupt(error.to_string()))?)),
            other => Err(corrupt(format!("unknown kind {other}"))),
        }
    }

    /// The shard whose lease holder analyses this mark: FNV-1a over kind and key, stable
    /// across builds and machines (every instance must agree).
    pub fn shard(&self) -> i32 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let key = self.key();
        for byte in std::iter::once(self.kind() as u8).chain(key.bytes()) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        (hash % SHARDS as u64) as i32
    }
}

/// A mark waiting in the database, with the sequence number of its latest write: finishing
/// it removes it only if no batch marked it again since it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingMark {
    pub mark: Mark,
    pub seq: i64,
    /// Of a scope's mark: the oldest time of the metric samples committed to the scope
    /// since the mark was last finished ([`Mark::sample_times`]); `None`: no samples.
    pub samples_from: Option<i64>,
}

/// What one balancing round left this instance holding.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leases {
    /// The shards this instance holds now, ascending.
    pub shards: Vec<i32>,
    /// Shards taken in this round (free, or left to expire by an instance that died).
    pub claimed: Vec<i32>,
    /// Shards given up in this round so that a newer instance gets its share.
    pub released: Vec<i32>,
    /// Instances whose heartbeat is within their lease, this one included.
    pub live_instances: u32,
}

/// One instance as the database knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceStatus {
    pub instance: String,
    /// Milliseconds since its last heartbeat.
    pub heartbeat_age_ms: i64,
    pub lease_ms: i64,
    /// Heartbeat within its lease.
    pub alive: bool,
    /// Shards whose unexpired lease it holds.
    pub shards: Vec<i32>,
}

/// The whole cluster's view, for the API.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterStatus {
    pub shards: i32,
    pub instances: Vec<InstanceStatus>,
    /// Shards nobody holds an unexpired lease on.
    pub unowned_shards: Vec<i32>,
    /// Marks waiting to be analysed, over all shards.
    pub pending_marks: u64,
}

/// Leases and marks in the database. Implemented by backends that several instances can
/// share (PostgreSQL); SQLite, one process's file, analyses from in-memory marks instead.
#[async_trait]
pub trait Coordinator: Send + Sync {
    /// One balancing round: records this instance's heartbeat, renews its unexpired leases,
    /// gives up shards beyond its fair share (`ceil(SHARDS / live instances)`) and claims
    /// expired or free ones up to it. Every holder's lease lasts `lease` from its last round.
    async fn balance(&self, instance: &str, lease: Duration) -> Result<Leases>;

    /// Gives up every lease of `instance` and forgets it (a clean shutdown): the others take
    /// its shards on their next round instead of after the lease runs out.
    async fn release(&self, instance: &str) -> Result<()>;

    /// The oldest `limit` marks of `shards`.
    async fn pending_marks(&self, shards: &[i32], limit: u32) -> Result<Vec<PendingMark>>;

    /// Marks things again (a trace's clients, found once its spans are committed, go to
    /// their own shards' holders).
    async fn add_marks(&self, marks: &[Mark]) -> Result<()>;

    /// Removes analysed marks, each unless a batch committed since marked it again.
    async fn finish_marks(&self, marks: &[PendingMark]) -> Result<()>;

    async fn status(&self) -> Result<ClusterStatus>;

    /// Records that each (cluster, node, client) was seen: the client called cluster URLs
    /// (`server.address`) from the process of that cluster and node. A pair written again is
    /// seen anew.
    async fn note_process_clients(&self, seen: &[(Option<&str>, &str, &str)]) -> Result<()>;

    /// Of each process (cluster, node) asked, its one client seen within `window` (written by
    /// any instance), or `None` when it had none or several.
    async fn process_owners(&self, processes: &[(Option<&str>, &str)], window: Duration)
    -> Result<Vec<Option<String>>>;

    /// Forgets the pairs not seen within `window`.
    async fn forget_process_clients(&self, window: Duration) -> Result<()>;
}

/// A process's key as stored (`analysis_process_clients.process`): `[cluster, node]` as JSON,
/// which keeps "no cluster" apart from an empty one.
pub(crate) fn process_key(cluster: Option<&str>, node: &str) -> String {
    serde_json::json!([cluster, node]).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_survive_their_stored_form_and_keep_their_shard() {
        let marks = [
            Mark::Client("client-1".into()),
            Mark::Trace("0af7651916cd43dd8448eb211c80319c".into()),
            Mark::Scope(Some("prod".into()), None),
            Mark::Scope(Some("prod".into()), Some(String::new())),
            Mark::LogCluster(None),
            Mark::LogCluster(Some("\"quoted\" <cluster>".into())),
        ];
        for mark in &marks {
            let back = Mark::from_stored(mark.kind(), mark.key()).expect("round trip");
            assert_eq!(&back, mark);
            assert_eq!(back.shard(), mark.shard());
            assert!((0..SHARDS).contains(&mark.shard()));
        }
        // "No namespace" and "an empty namespace" are different scopes.
        assert_ne!(marks[2].key(), marks[3].key());
        assert!(Mark::from_stored(9, "x".into()).is_err());
        assert!(Mark::from_stored(2, "not json".into()).is_err());
    }

    #[test]
    fn shards_spread_clients_and_are_fixed_values() {
        let mut counts = [0u32; SHARDS as usize];
        for index in 0..6_400 {
            counts[Mark::Client(format!("client-{index}")).shard() as usize] += 1;
        }
        // Every shard gets work, none more than twice its share.
        assert!(counts.iter().all(|count| (1..=200).contains(count)), "{counts:?}");
        // The hash is part of the on-disk contract between instances of different builds.
        assert_eq!(Mark::Client("client-1".into()).shard(), Mark::Client("client-1".into()).shard());
        assert_eq!(fnv_reference(b"\x00client-1") % SHARDS as u64, Mark::Client("client-1".into()).shard() as u64);
    }

    /// FNV-1a 64 written out from its definition.
    fn fnv_reference(bytes: &[u8]) -> u64 {
        bytes
            .iter()
            .fold(14_695_981_039_346_656_037u64, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(1_099_511_628_211))
    }
}
