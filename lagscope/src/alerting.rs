//! Paging: anomalies become incidents, incidents become messages in the store's outbox, and
//! the outbox is delivered to Alertmanager, PagerDuty and webhooks at least once.
//!
//! The alerter reads the store's feed of anomaly changes from its saved cursor, so nothing the
//! analyzer stored is skipped across restarts; each pass commits its cursor, incidents and
//! messages in one transaction. The deliverer sends each (receiver, dedup key)'s messages in
//! order (a resolve never overtakes its trigger), retries what was not taken with exponential
//! back-off and jitter (honouring `Retry-After`), and records every attempt.
//!
//! This file holds the configuration and the alerter; `deliver.rs` the deliverer.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use lagscope_alerts::{
    Alert, IncidentKey, Receiver, ReceiverKind, Route, WindowClosed, alertmanager_body, incident_of, inhibits,
    pagerduty_body, webhook_body,
};
use lagscope_model::{Anomaly, AnomalyKind};
use lagscope_selfmetrics::SelfMetrics;
use lagscope_store::{
    AlertCursor, AlertIncident, AnomalyFilter, DeliveryOutcome, NewAlertMessage, Store, StoreError, StoredAnomaly,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, watch};

use crate::config::parse_duration;
use crate::live::now_unix_nano;

mod deliver;
#[cfg(test)]
mod tests;

pub use deliver::send_test;
use deliver::{message, run_deliverer};

/// `[alerts]`: where anomalies are paged. Nothing is sent until a receiver and a route name it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AlertsConfig {
    /// The address people open lagscope's pages at: the links in alerts.
    pub external_url: String,
    /// A per-read incident (a node's stale reads, say) resolves after this long without a new
    /// anomaly. Windows resolve when their condition ends (`window_resolve_after`).
    pub resolve_after: String,
    /// A window incident resolves once its window has stayed closed this long. The live
    /// analyzer judges a window closed when the telemetry it is found in has moved past it,
    /// and that telemetry comes from many exporters, each batching on its own clock: a window
    /// closed while one of them ran ahead opens again as the rest arrives, and pages once.
    pub window_resolve_after: String,
    /// Firing incidents are sent to Alertmanager again this often (Alertmanager resolves an
    /// alert it has not heard of for its `resolve_timeout`, 5m by default).
    pub repeat_interval: String,
    /// Hold stale-read pages while the node that served the reads has an open `apply_lag`
    /// (which pages already, as their cause).
    pub inhibit_stale_reads_by_apply_lag: bool,
    /// How often the alerter looks for new anomalies.
    pub poll_interval_ms: u64,
    /// A message a receiver did not take is tried again after this long, doubling per attempt
    /// up to `retry_longest_seconds` (times a jitter between 0.5 and 1.5), for as long as it
    /// takes: a receiver down for an hour gets its alerts when it returns.
    pub retry_first_ms: u64,
    pub retry_longest_seconds: u64,
    #[serde(rename = "receiver")]
    pub receivers: Vec<Receiver>,
    #[serde(rename = "route")]
    pub routes: Vec<Route>,
}

impl Default for AlertsConfig {
    fn default() -> Self {
        Self {
            external_url: "http://127.0.0.1:8080".to_string(),
            resolve_after: "5m".to_string(),
            window_resolve_after: "30s".to_string(),
            repeat_interval: "1m".to_string(),
            inhibit_stale_reads_by_apply_lag: true,
            poll_interval_ms: 200,
            retry_first_ms: 1_000,
            retry_longest_seconds: 300,
            receivers: Vec::new(),
            routes: Vec::new(),
        }
    }
}

impl AlertsConfig {
    pub fn is_enabled(&self) -> bool {
        !self.receivers.is_empty() && !self.routes.is_empty()
    }

    /// Checks what the types cannot: durations, unique receiver names, routes naming them.
    pub fn validate(&self) -> Result<(), String> {
        for (name, text) in [
            ("resolve_after", &self.resolve_after),
            ("window_resolve_after", &self.window_resolve_after),
            ("repeat_interval", &self.repeat_interval),
        ] {
            parse_duration(text).map_err(|problem| format!("alerts.{name} = {text:?}: {problem}"))?;
        }
        if self.poll_interval_ms == 0 || self.retry_first_ms == 0 || self.retry_longest_seconds == 0 {
            return Err(
                "alerts.poll_interval_ms, retry_first_ms and retry_longest_seconds must be at least 1".to_string()
            );
        }
        let mut names = HashSet::new();
        for receiver in &self.receivers {
            if receiver.name.is_empty() || !names.insert(receiver.name.as_str()) {
                return Err(format!("alerts.receiver: name {:?} is empty or given twice", receiver.name));
            }
            let url = match &receiver.kind {
                ReceiverKind::Alertmanager { url } | ReceiverKind::Webhook { url } => url,
                ReceiverKind::Pagerduty { url, routing_key } => {
                    if routing_key.is_empty() {
                        return Err(format!("alerts.receiver {:?}: routing_key is empty", receiver.name));
                    }
                    url
                }
            };
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(format!("alerts.receiver {:?}: url {url:?} is not http(s)", receiver.name));
            }
        }
        for route in &self.routes {
            if !names.contains(route.receiver.as_str()) {
                return Err(format!("alerts.route: receiver {:?} is not an alerts.receiver", route.receiver));
            }
            for kind in &route.kinds {
                if AnomalyKind::parse(kind).is_none() {
                    return Err(format!("alerts.route: {kind:?} is not an anomaly kind"));
                }
            }
        }
        Ok(())
    }

    fn resolve_after_nanos(&self) -> i64 {
        parse_duration(&self.resolve_after).unwrap_or(300_000_000_000)
    }

    fn window_resolve_after_nanos(&self) -> i64 {
        parse_duration(&self.window_resolve_after).unwrap_or(30_000_000_000)
    }

    fn repeat_interval_nanos(&self) -> i64 {
        parse_duration(&self.repeat_interval).unwrap_or(60_000_000_000)
    }

    pub fn receiver(&self, name: &str) -> Option<&Receiver> {
        self.receivers.iter().find(|receiver| receiver.name == name)
    }
}

/// Changes read per alerter pass.
const CHANGES_PER_PASS: u32 = 1_000;
/// How far behind its cursor the alerter reads the change feed again. The feed is ordered by
/// (last seen, id), and a row can be committed after rows the alerter has already read while
/// carrying an earlier last-seen time: another instance's analyzer on the same PostgreSQL (its
/// clock, its slower transaction), or a slow transaction of this one. Rows of this window the
/// alerter already took are skipped by (id, last seen); the others are taken late, not lost.
pub const FEED_SETTLE: i64 = 30 * 1_000_000_000;
/// Keys read per query behind the cursor.
const KEYS_PER_READ: u32 = 10_000;
/// Messages looked at per delivery pass.
const MESSAGES_PER_PASS: u32 = 1_000;
/// How long one delivery may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs the alerter and the deliverer until shutdown.
pub async fn run_alerting(
    store: Arc<dyn Store>,
    config: AlertsConfig,
    metrics: Arc<SelfMetrics>,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let delivered = Arc::new(Notify::new());
    let client = reqwest::Client::builder().timeout(SEND_TIMEOUT).connect_timeout(SEND_TIMEOUT).build()?;
    let deliverer = tokio::spawn(run_deliverer(
        store.clone(),
        config.clone(),
        client,
        delivered.clone(),
        metrics.clone(),
        shutdown.clone(),
    ));
    let mut shutdown = shutdown;
    let mut alerter = loop {
        match Alerter::load(store.as_ref(), config.clone()).await {
            Ok(alerter) => break alerter,
            Err(error) => {
                tracing::error!(%error, "cannot read the alerter's state; trying again");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = shutdown.wait_for(|stop| *stop) => return Ok(()),
                }
            }
        }
    };
    let poll = Duration::from_millis(config.poll_interval_ms);
    loop {
        match alerter.pass(store.as_ref(), now_unix_nano()).await {
            Ok((more, enqueued)) => {
                if enqueued > 0 {
                    metrics.alerts_enqueued.add(enqueued as u64);
                    delivered.notify_one();
                }
                if more {
                    continue;
                }
            }
            Err(error) => {
                metrics.alert_errors.add(1);
                tracing::error!(%error, "alerter pass failed; its changes are read again");
                // What was committed is the truth: start again from the store.
                if let Ok(reloaded) = Alerter::load(store.as_ref(), config.clone()).await {
                    alerter = reloaded;
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(poll) => {}
            _ = shutdown.wait_for(|stop| *stop) => break,
        }
    }
    deliverer.await??;
    Ok(())
}

/// How long a resolved incident is remembered: the live analyzer stores its anomalies again
/// while they are within its window (`live.scope_window_seconds`, 15 minutes by default), and
/// a change of an anomaly already paged must not page again.
const REMEMBER_RESOLVED: i64 = 3_600 * 1_000_000_000;

/// Turns anomaly changes into incidents and messages.
struct Alerter {
    config: AlertsConfig,
    cursor: Option<AlertCursor>,
    /// The changes taken within [`FEED_SETTLE`] of the cursor: id -> last seen.
    settled: HashMap<i64, i64>,
    /// Incidents firing, or resolved within `REMEMBER_RESOLVED`, by (receiver, incident).
    known: HashMap<(String, String), AlertIncident>,
}

impl Alerter {
    async fn load(store: &dyn Store, config: AlertsConfig) -> Result<Self, StoreError> {
        let (cursor, incidents) = store.alert_state(now_unix_nano() - REMEMBER_RESOLVED).await?;
        let known = incidents
            .into_iter()
            .map(|incident| ((incident.receiver.clone(), incident.incident.clone()), incident))
            .collect();
        // After a restart, the settle window's changes are read again: taking a change twice
        // sends nothing twice (incidents are stored, a trigger goes out only for a new one).
        Ok(Self { config, cursor, settled: HashMap::new(), known })
    }

    /// One pass at wall-clock `now`: returns whether more changes wait, and how many
    /// messages were enqueued.
    async fn pass(&mut self, store: &dyn Store, now: i64) -> Result<(bool, usize), StoreError> {
        let changes = self.read_changes(store, now).await?;
        let inhibitors = if self.config.inhibit_stale_reads_by_apply_lag
            && changes.iter().any(|change| change.anomaly.kind == AnomalyKind::StaleRead)
        {
            let filter = AnomalyFilter {
                kind: Some(AnomalyKind::ApplyLag),
                open: Some(true),
                limit: 1_000,
                skip_evidence: true,
                ..AnomalyFilter::default()
            };
            store.anomalies(&filter).await?.into_iter().map(|stored| stored.anomaly).collect()
        } else {
            Vec::new()
        };
        let mut changed: BTreeMap<(String, String), AlertIncident> = BTreeMap::new();
        let mut messages = Vec::new();
        for stored in &changes {
            if inhibitors.iter().any(|inhibitor| inhibits(inhibitor, &stored.anomaly)) {
                continue;
            }
            for receiver in self.receivers_of(&stored.anomaly) {
                self.take(&receiver, stored, now, &mut changed, &mut messages);
            }
        }
        self.sweep(now, &mut changed, &mut messages);
        // The cursor only moves forward: a late row taken from behind it leaves it where it is.
        let cursor = changes
            .iter()
            .map(StoredAnomaly::change_key)
            .chain(self.cursor)
            .max_by_key(|cursor| (cursor.last_seen_unix_nano, cursor.anomaly_id));
        if changes.is_empty() && changed.is_empty() {
            return Ok((false, 0));
        }
        let incidents: Vec<AlertIncident> = changed.values().cloned().collect();
        store.commit_alerts(cursor, &incidents, &messages).await?;
        self.cursor = cursor;
        self.settled.extend(changes.iter().map(|change| (change.id, change.last_seen_unix_nano)));
        if let Some(cursor) = cursor {
            self.settled.retain(|_, last_seen| *last_seen > cursor.last_seen_unix_nano - FEED_SETTLE);
        }
        self.known.extend(changed);
        self.known.retain(|_, incident| incident.firing || now - incident.last_sent_unix_nano < REMEMBER_RESOLVED);
        Ok((changes.len() >= CHANGES_PER_PASS as usize, messages.len()))
    }

    /// The feed from [`FEED_SETTLE`] before the cursor on, without the changes already taken.
    /// Behind the cursor only keys are read (nearly all are changes taken already) and the
    /// rows of the others fetched one by one; after it, up to [`CHANGES_PER_PASS`] rows. A row
    /// can still come late only within `FEED_SETTLE` of wall-clock `now`: once the feed has been
    /// quiet that long, the window closes up to the cursor and idle passes read nothing again.
    async fn read_changes(&self, store: &dyn Store, now: i64) -> Result<Vec<StoredAnomaly>, StoreError> {
        let Some(cursor) = self.cursor else {
            return store.anomaly_changes(AlertCursor::default(), CHANGES_PER_PASS).await;
        };
        let mut changes = Vec::new();
        let settled_before = (cursor.last_seen_unix_nano - FEED_SETTLE).max(now - 2 * FEED_SETTLE);
        if settled_before < cursor.last_seen_unix_nano {
            let mut from = AlertCursor { last_seen_unix_nano: settled_before, anomaly_id: 0 };
            // (A batch of anomalies shares one last-seen time: keys page by (last seen, id).)
            loop {
                let keys = store.anomaly_change_keys(from, cursor, KEYS_PER_READ).await?;
                for key in &keys {
                    if self.settled.get(&key.anomaly_id) != Some(&key.last_seen_unix_nano)
                        && let Some(stored) = store.anomaly(key.anomaly_id).await?
                        // Changed again since the key was read: a later read has it.
                        && stored.last_seen_unix_nano == key.last_seen_unix_nano
                    {
                        changes.push(stored);
                    }
                }
                match keys.last() {
                    Some(last) if keys.len() >= KEYS_PER_READ as usize => from = *last,
                    _ => break,
                }
            }
        }
        changes.extend(store.anomaly_changes(cursor, CHANGES_PER_PASS).await?);
        Ok(changes)
    }

    /// The receivers whose routes match the anomaly, each once.
    fn receivers_of(&self, anomaly: &Anomaly) -> Vec<Receiver> {
        let mut found: Vec<Receiver> = Vec::new();
        for route in self.config.routes.iter().filter(|route| route.matches(anomaly)) {
            if found.iter().any(|receiver| receiver.name == route.receiver) {
                continue;
            }
            if let Some(receiver) = self.config.receiver(&route.receiver) {
                found.push(receiver.clone());
            }
        }
        found
    }

    /// One anomaly change for one receiver: opens its incident (a trigger), adds to it, or
    /// marks its window closed (resolved by [`Self::sweep`] once it stays closed).
    fn take(
        &self,
        receiver: &Receiver,
        stored: &StoredAnomaly,
        now: i64,
        changed: &mut BTreeMap<(String, String), AlertIncident>,
        messages: &mut Vec<NewAlertMessage>,
    ) {
        let anomaly = &stored.anomaly;
        let key = incident_of(anomaly);
        let slot = (receiver.name.clone(), key.0.clone());
        let known = changed.get(&slot).or_else(|| self.known.get(&slot)).cloned();
        // Replaced by the whole of the same incident (`StoredAnomaly::superseded_by`): pages
        // nothing; a window paged for it is closed by it (it was closed as it was replaced),
        // and resolves as windows do.
        if stored.superseded_by.is_some()
            && !(anomaly.kind.is_window() && known.as_ref().is_some_and(|incident| incident.firing))
        {
            return;
        }
        // Stored again after it was paged and resolved (the analyzer re-reads its window), it
        // does not page again; a window that opens again does.
        if let Some(resolved) = known.as_ref().filter(|incident| !incident.firing)
            && stored.id <= resolved.latest_anomaly_id
            && !(anomaly.kind.is_window() && anomaly.open)
        {
            return;
        }
        let external_url = &self.config.external_url;
        // A window that closed: when it was first seen closed (since it was last seen open).
        let closed = |previous: Option<&Alert>| {
            (anomaly.kind.is_window() && !anomaly.open).then(|| WindowClosed {
                end_unix_nano: anomaly.end_unix_nano,
                seen_unix_nano: previous.and_then(|alert| alert.closed).map_or(now, |closed| closed.seen_unix_nano),
            })
        };
        let incident = match known.filter(|incident| incident.firing) {
            None => {
                let mut alert = Alert::of(&key, anomaly, stored.id, anomaly.start_unix_nano, 1, external_url);
                messages.push(message(receiver, &alert, "trigger", external_url, now));
                alert.closed = closed(None);
                AlertIncident {
                    receiver: receiver.name.clone(),
                    incident: key.0.clone(),
                    dedup_key: key.dedup_key(),
                    firing: true,
                    alert: serde_json::to_string(&alert).unwrap_or_default(),
                    latest_anomaly_id: stored.id,
                    members: 1,
                    last_member_unix_nano: now,
                    last_sent_unix_nano: now,
                }
            }
            Some(mut incident) => {
                if stored.id > incident.latest_anomaly_id {
                    incident.members += 1;
                    incident.latest_anomaly_id = stored.id;
                }
                let previous = alert_of(&incident);
                let starts_at = previous.as_ref().map_or(anomaly.start_unix_nano, |alert| alert.starts_at);
                let mut alert = Alert::of(&key, anomaly, stored.id, starts_at, incident.members as u64, external_url);
                alert.closed = closed(previous.as_ref());
                incident.alert = serde_json::to_string(&alert).unwrap_or_default();
                incident.last_member_unix_nano = now;
                incident
            }
        };
        changed.insert(slot, incident);
    }

    /// Resolves per-read incidents idle for `resolve_after` and window incidents whose window
    /// has stayed closed for `window_resolve_after`; sends firing incidents to Alertmanager
    /// again every `repeat_interval`.
    fn sweep(
        &self,
        now: i64,
        changed: &mut BTreeMap<(String, String), AlertIncident>,
        messages: &mut Vec<NewAlertMessage>,
    ) {
        let (resolve_after, repeat) = (self.config.resolve_after_nanos(), self.config.repeat_interval_nanos());
        let window_resolve_after = self.config.window_resolve_after_nanos();
        let slots: Vec<(String, String)> =
            self.known.keys().chain(changed.keys()).cloned().collect::<HashSet<_>>().into_iter().collect();
        for slot in slots {
            let Some(mut incident) = changed.get(&slot).or_else(|| self.known.get(&slot)).cloned() else { continue };
            let Some(receiver) = self.config.receiver(&slot.0).cloned() else { continue };
            if !incident.firing {
                continue;
            }
            let window = IncidentKey(incident.incident.clone()).is_window();
            // (Only a window's alert is read: per-read incidents never close this way.)
            let window_closed = if window { alert_of(&incident).and_then(|alert| alert.closed) } else { None };
            if !window && now - incident.last_member_unix_nano >= resolve_after {
                resolve(&receiver, &mut incident, Some(now), &self.config.external_url, now, messages);
                changed.insert(slot, incident);
            } else if let Some(closed) =
                window_closed.filter(|closed| now - closed.seen_unix_nano >= window_resolve_after)
            {
                resolve(&receiver, &mut incident, Some(closed.end_unix_nano), &self.config.external_url, now, messages);
                changed.insert(slot, incident);
            } else if matches!(receiver.kind, ReceiverKind::Alertmanager { .. })
                && now - incident.last_sent_unix_nano >= repeat
                && let Some(alert) = alert_of(&incident)
            {
                messages.push(message(&receiver, &alert, "refresh", &self.config.external_url, now));
                incident.last_sent_unix_nano = now;
                changed.insert(slot, incident);
            }
        }
    }
}

fn alert_of(incident: &AlertIncident) -> Option<Alert> {
    serde_json::from_str(&incident.alert).ok()
}

/// Marks the incident resolved (at `ends_at`) and enqueues its resolve message.
fn resolve(
    receiver: &Receiver,
    incident: &mut AlertIncident,
    ends_at: Option<i64>,
    external_url: &str,
    now: i64,
    messages: &mut Vec<NewAlertMessage>,
) {
    let Some(mut alert) = alert_of(incident) else { return };
    alert.ends_at = ends_at.map(|end| end.max(alert.starts_at));
    alert.closed = None;
    incident.alert = serde_json::to_string(&alert).unwrap_or_default();
    incident.firing = false;
    incident.last_sent_unix_nano = now;
    messages.push(message(receiver, &alert, "resolve", external_url, now));
}
