//! What a pass has written, so that the next writes only what changed: rollups, anomalies;
//! the findings stored in pass order; new anomalies logged.

use super::*;

/// Takes what a cache's catch-up found late: counted on `counter`, and the settling widened
/// for it (its gauge with it).
pub(super) fn take_late<K: Eq + std::hash::Hash + std::fmt::Debug>(
    late: &mut LateSpans<K>,
    counter: &Counter,
    settling: &mut Settling,
    metrics: &SelfMetrics,
) {
    let (count, wanted) = late.take();
    counter.add(count);
    settling.observe(wanted, Instant::now());
    metrics.analysis_settle_seconds.set(settling.seconds());
}

/// The read rollups this analyzer last wrote, per scope: a pass writes only the rows that
/// changed. Holds the minutes of each scope's latest pass (the scope window), no more.
#[derive(Default)]
pub(super) struct WrittenRollups {
    by_scope: HashMap<ScopeKey, HashMap<(i64, Option<String>), ReadRollup>>,
}

/// (cluster, namespace).
pub(super) type ScopeKey = (Option<String>, Option<String>);

impl WrittenRollups {
    /// Of the scopes' read rollups (from the minute their reads are complete), those that
    /// differ from what was written before.
    fn changed(&self, rollups_of_scopes: &[(ScopeKey, Vec<ReadRollup>)]) -> Vec<ReadRollup> {
        let mut changed: Vec<ReadRollup> = Vec::new();
        for (scope, rollups) in rollups_of_scopes {
            let written = self.by_scope.get(scope);
            changed.extend(
                rollups
                    .iter()
                    .filter(|rollup| {
                        written.and_then(|written| written.get(&(rollup.minute_unix_nano, rollup.node.clone())))
                            != Some(*rollup)
                    })
                    .cloned(),
            );
        }
        changed
    }

    /// The scopes' rollups are stored: each scope's replace what was held of it.
    pub(super) fn wrote(&mut self, rollups_of_scopes: Vec<(ScopeKey, Vec<ReadRollup>)>) {
        for (scope, rollups) in rollups_of_scopes {
            let written = rollups.into_iter().map(|rollup| ((rollup.minute_unix_nano, rollup.node.clone()), rollup));
            self.by_scope.insert(scope, written.collect());
        }
    }
}

/// What one pass found, stored in one write ([`Recorder::store`]): every anomaly of its
/// clients, scopes and clusters, and its scopes' read rollups.
#[derive(Default)]
pub(super) struct Findings {
    pub(super) anomalies: Vec<Arc<lagscope_model::Anomaly>>,
    pub(super) rollups: Vec<(ScopeKey, Vec<ReadRollup>)>,
}

/// What the passes' writes keep from one to the next: what was written (not written again
/// unchanged), and the new anomalies not logged yet.
#[derive(Default)]
pub(super) struct Recorder {
    rollups: WrittenRollups,
    pub(super) found: NewAnomalies,
    written: WrittenAnomalies,
}

impl Recorder {
    /// Stores what the pass found that was not written before as it is now, anomalies and
    /// rollups in one transaction ([`Store::upsert_findings`]).
    pub(super) async fn store(
        &mut self,
        store: &dyn Store,
        metrics: &SelfMetrics,
        findings: Findings,
    ) -> Result<(), lagscope_store::StoreError> {
        let Recorder { rollups, found, written } = self;
        written.next_pass();
        let hashed: Vec<_> =
            findings.anomalies.iter().map(|anomaly| (anomaly, written.content_hash(anomaly))).collect();
        let (anomalies, unchanged): (Vec<_>, Vec<_>) =
            hashed.into_iter().partition(|(anomaly, hash)| !written.seen(anomaly, *hash));
        metrics.anomalies_unchanged.add(unchanged.len() as u64);
        let changed_rollups = rollups.changed(&findings.rollups);
        let upsert: Vec<lagscope_model::Anomaly> =
            anomalies.iter().map(|(anomaly, _)| lagscope_model::Anomaly::clone(anomaly)).collect();
        let outcome = store.upsert_findings(&upsert, &changed_rollups, now_unix_nano()).await?;
        for (anomaly, hash) in anomalies {
            written.wrote(anomaly, hash);
        }
        rollups.wrote(findings.rollups);
        metrics.anomalies_new.add(outcome.inserted.len() as u64);
        metrics.anomalies_changed.add(outcome.updated);
        metrics.anomalies_unchanged.add(outcome.unchanged);
        metrics.anomalies_superseded.add(outcome.superseded);
        for &id in &outcome.inserted {
            tracing::debug!(anomaly_id = id, "new anomaly");
            found.add(id);
        }
        Ok(())
    }
}

/// What this analyzer last stored of each anomaly (by fingerprint, a hash of all of it): an
/// anomaly found again exactly as it was written is not sent to the store at all. (The store
/// would leave it unchanged too, but in a transaction of its own per client and scope: most
/// of a pass's writes under sustained load.) An anomaly not found for [`FORGET_AFTER_PASSES`]
/// passes (to twice that: forgetting runs every that many) is forgotten; found again later,
/// the store compares it.
#[derive(Default)]
pub(super) struct WrittenAnomalies {
    by_fingerprint: HashMap<String, (u64, u64)>,
    pass: u64,
    /// Seeded at random per process: the text hashed comes from telemetry.
    hasher: foldhash::quality::RandomState,
}

/// Passes after which [`WrittenAnomalies`] forgets an anomaly not found meanwhile.
pub(super) const FORGET_AFTER_PASSES: u64 = 256;

impl WrittenAnomalies {
    pub(super) fn next_pass(&mut self) {
        self.pass += 1;
        if self.pass.is_multiple_of(FORGET_AFTER_PASSES) {
            let pass = self.pass;
            self.by_fingerprint.retain(|_, (_, seen)| pass - *seen < FORGET_AFTER_PASSES);
        }
    }

    /// Whether the anomaly was written as it is now (and so need not be again).
    pub(super) fn seen(&mut self, anomaly: &lagscope_model::Anomaly, hash: u64) -> bool {
        match self.by_fingerprint.get_mut(&anomaly.fingerprint) {
            Some((written, seen)) if *written == hash => {
                *seen = self.pass;
                true
            }
            _ => false,
        }
    }

    pub(super) fn wrote(&mut self, anomaly: &lagscope_model::Anomaly, hash: u64) {
        self.by_fingerprint.insert(anomaly.fingerprint.clone(), (hash, self.pass));
    }

    pub(super) fn content_hash(&self, anomaly: &lagscope_model::Anomaly) -> u64 {
        content_hash(anomaly, self.hasher.build_hasher())
    }
}

/// A hash of everything an anomaly says, field by field (the evidence as the JSON text its
/// detector wrote: found again unchanged, it is written the same). Every field is named, so
/// that a field added to `Anomaly` cannot be left out. (Serializing the whole anomaly to hash
/// it cost a busy pass tens of milliseconds: every pass finds hundreds again. Hashed with
/// SipHash, the hundreds cost a twentieth of a busy run's passes; foldhash takes a fraction
/// of that.)
pub(super) fn content_hash(anomaly: &lagscope_model::Anomaly, mut hasher: impl std::hash::Hasher) -> u64 {
    use std::hash::Hash;
    let lagscope_model::Anomaly {
        kind,
        severity,
        cluster,
        namespace,
        client_id,
        node_id,
        start_unix_nano,
        end_unix_nano,
        summary,
        cause,
        evidence,
        fingerprint,
        open,
    } = anomaly;
    (kind, severity, cluster, namespace, client_id, node_id, start_unix_nano, end_unix_nano).hash(&mut hasher);
    (summary, cause, evidence.as_json(), fingerprint, open).hash(&mut hasher);
    hasher.finish()
}

/// How often the live analyzer logs the anomalies it found since it last did.
pub(super) const NEW_ANOMALIES_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// New anomalies not logged yet: a stale-read storm finds thousands a minute, and a log line
/// each (kept at debug level) would bury everything else the service logs. At info level the
/// live analyzer says how many it found, and their ids, at most once per interval (the first
/// right away).
#[derive(Debug)]
pub(super) struct NewAnomalies {
    pub(super) count: u64,
    pub(super) first_id: i64,
    pub(super) last_id: i64,
    /// When the last line was logged; `None` before the first.
    pub(super) logged_at: Option<Instant>,
}

impl Default for NewAnomalies {
    fn default() -> Self {
        NewAnomalies { count: 0, first_id: i64::MAX, last_id: i64::MIN, logged_at: None }
    }
}

impl NewAnomalies {
    pub(super) fn add(&mut self, id: i64) {
        self.count += 1;
        self.first_id = self.first_id.min(id);
        self.last_id = self.last_id.max(id);
    }

    /// Logs what was found and starts counting again, unless nothing was, or the last line
    /// is younger than `interval`.
    pub(super) fn log_every(&mut self, interval: Duration) {
        if self.count == 0 || self.logged_at.is_some_and(|at| at.elapsed() < interval) {
            return;
        }
        tracing::info!(new = self.count, first_id = self.first_id, last_id = self.last_id, "new anomalies");
        *self = NewAnomalies { logged_at: Some(Instant::now()), ..NewAnomalies::default() };
    }
}
