//! Paging: anomalies become incidents, incidents become messages in the store's outbox, and
//! the outbox is delivered to Alertmanager, PagerDuty and webhooks at least once.
//!
//! The alerter reads the store's feed of anomaly changes from its saved cursor, so nothing the
//! analyzer stored is skipped across restarts; each pass commits its cursor, incidents and
//! messages in one transaction. The deliverer sends each (receiver, dedup key)'s messages in
//! order (a resolve never overtakes its trigger), retries what was not taken with exponential
//! back-off and jitter (honouring `Retry-After`), and records every attempt.

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

/// The body `receiver` takes for `alert`, as an outbox message.
pub fn message(receiver: &Receiver, alert: &Alert, event: &str, external_url: &str, now: i64) -> NewAlertMessage {
    let body = match &receiver.kind {
        ReceiverKind::Alertmanager { .. } => alertmanager_body(std::slice::from_ref(alert)),
        ReceiverKind::Pagerduty { routing_key, .. } => pagerduty_body(alert, routing_key),
        ReceiverKind::Webhook { .. } => webhook_body(alert, &receiver.name, external_url),
    };
    NewAlertMessage {
        receiver: receiver.name.clone(),
        dedup_key: alert.incident.dedup_key(),
        event: event.to_string(),
        body: body.to_string(),
        created_unix_nano: now,
    }
}

/// Where a receiver's messages are posted.
fn endpoint(receiver: &Receiver) -> String {
    match &receiver.kind {
        ReceiverKind::Alertmanager { url } => format!("{}/api/v2/alerts", url.trim_end_matches('/')),
        ReceiverKind::Pagerduty { url, .. } | ReceiverKind::Webhook { url } => url.clone(),
    }
}

/// What one POST came to, before back-off is applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    Delivered,
    /// Not taken: try again (after `Retry-After` seconds when the receiver said).
    Retry {
        error: String,
        retry_after: Option<Duration>,
    },
    Refused {
        error: String,
    },
}

/// Posts one message body to a receiver.
pub async fn send(client: &reqwest::Client, receiver: &Receiver, body: &str) -> Sent {
    let url = endpoint(receiver);
    let response =
        match client.post(&url).header("content-type", "application/json").body(body.to_string()).send().await {
            Ok(response) => response,
            Err(error) => return Sent::Retry { error: format!("{url}: {error}"), retry_after: None },
        };
    let status = response.status();
    if status.is_success() {
        return Sent::Delivered;
    }
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let text = response.text().await.unwrap_or_default();
    let error = format!("{url} answered {status}: {}", text.chars().take(300).collect::<String>());
    if status.as_u16() == 429 || status.is_server_error() {
        Sent::Retry { error, retry_after }
    } else {
        Sent::Refused { error }
    }
}

/// The wait before attempt `attempts + 1` of message `id`: `first` doubling per attempt up to
/// `longest`, times a jitter (0.5 to 1.5) drawn from the id and attempt so that a receiver
/// coming back is not hit by every message at once; never shorter than its `Retry-After`.
pub fn back_off(id: i64, attempts: i64, retry_after: Option<Duration>, first: Duration, longest: Duration) -> Duration {
    let doubled = first.saturating_mul(1u32 << attempts.clamp(0, 16) as u32).min(longest);
    let mut hash =
        (id as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (attempts as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash ^= hash >> 31;
    let jitter = 0.5 + (hash % 1_000) as f64 / 1_000.0;
    doubled.mul_f64(jitter).max(retry_after.unwrap_or_default())
}

async fn run_deliverer(
    store: Arc<dyn Store>,
    config: AlertsConfig,
    client: reqwest::Client,
    wake: Arc<Notify>,
    metrics: Arc<SelfMetrics>,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    loop {
        let wait = match deliver_pass(store.as_ref(), &config, &client, &metrics).await {
            Ok(wait) => wait,
            Err(error) => {
                metrics.alert_errors.add(1);
                tracing::error!(%error, "alert delivery pass failed");
                Duration::from_secs(1)
            }
        };
        if wait.is_zero() {
            continue;
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = wake.notified() => {}
            _ = shutdown.wait_for(|stop| *stop) => return Ok(()),
        }
    }
}

/// Sends every due message that is the oldest pending one of its (receiver, dedup key);
/// returns how long to wait before the next pass (zero: go again at once).
async fn deliver_pass(
    store: &dyn Store,
    config: &AlertsConfig,
    client: &reqwest::Client,
    metrics: &SelfMetrics,
) -> Result<Duration, StoreError> {
    let pending = store.pending_alert_messages(MESSAGES_PER_PASS).await?;
    let now = now_unix_nano();
    let mut heads = HashSet::new();
    let mut next_due: Option<i64> = None;
    let mut sent_any = false;
    for message in &pending {
        if !heads.insert((message.receiver.as_str(), message.dedup_key.as_str())) {
            continue;
        }
        if message.next_attempt_unix_nano > now {
            next_due =
                Some(next_due.map_or(message.next_attempt_unix_nano, |due| due.min(message.next_attempt_unix_nano)));
            continue;
        }
        let sent = match config.receiver(&message.receiver) {
            Some(receiver) => send(client, receiver, &message.body).await,
            None => Sent::Refused { error: format!("no receiver {:?} in the configuration", message.receiver) },
        };
        let at = now_unix_nano();
        let outcome = match sent {
            Sent::Delivered => {
                metrics.alerts_delivered.add(1);
                sent_any = true;
                DeliveryOutcome::Delivered
            }
            Sent::Retry { error, retry_after } => {
                metrics.alert_retries.add(1);
                let wait = back_off(
                    message.id,
                    message.attempts,
                    retry_after,
                    Duration::from_millis(config.retry_first_ms),
                    Duration::from_secs(config.retry_longest_seconds),
                );
                tracing::warn!(receiver = %message.receiver, %error, retry_in = ?wait, "alert not taken; will retry");
                DeliveryOutcome::Retry { next_attempt_unix_nano: at + wait.as_nanos() as i64, error }
            }
            Sent::Refused { error } => {
                metrics.alerts_failed.add(1);
                tracing::error!(receiver = %message.receiver, %error, "alert refused for good");
                sent_any = true;
                DeliveryOutcome::Failed { error }
            }
        };
        store.alert_message_attempted(message.id, at, &outcome).await?;
        if let DeliveryOutcome::Retry { next_attempt_unix_nano, .. } = outcome {
            next_due = Some(next_due.map_or(next_attempt_unix_nano, |due| due.min(next_attempt_unix_nano)));
        }
    }
    // A delivered message may uncover the next of its key, and a full page more messages.
    if sent_any || pending.len() >= MESSAGES_PER_PASS as usize {
        return Ok(Duration::ZERO);
    }
    let until_due = next_due.map(|due| Duration::from_nanos((due - now_unix_nano()).max(1) as u64));
    // Messages another process (or a previous run) enqueued are found within a second.
    Ok(until_due.unwrap_or(Duration::from_secs(1)).min(Duration::from_secs(1)))
}

/// `lagscope alerts test --receiver NAME`: a test alert straight to one receiver (not through
/// the outbox), for set-up; returns what the receiver answered.
pub async fn send_test(config: &AlertsConfig, name: &str) -> anyhow::Result<String> {
    let Some(receiver) = config.receiver(name) else {
        let known: Vec<&str> = config.receivers.iter().map(|receiver| receiver.name.as_str()).collect();
        anyhow::bail!("no receiver {name:?} in [[alerts.receiver]] (there are: {})", known.join(", "));
    };
    let now = now_unix_nano();
    let test = Anomaly {
        kind: AnomalyKind::StaleRead,
        severity: lagscope_model::Severity::Info,
        cluster: Some("lagscope-test".to_string()),
        namespace: None,
        client_id: None,
        node_id: Some("lagscope-test".to_string()),
        start_unix_nano: now,
        end_unix_nano: now,
        summary: "lagscope test alert: this receiver is set up (it resolves by itself in 5 minutes)".to_string(),
        cause: "sent by `lagscope alerts test`".to_string(),
        evidence: serde_json::json!({ "test": true }).into(),
        open: false,
        fingerprint: format!("lagscope-test-{now}"),
    };
    let key = IncidentKey(format!("test|{name}|{now}"));
    let mut alert = Alert::of(&key, &test, 0, now, 1, &config.external_url);
    alert.labels.insert("alertname".to_string(), "lagscope_test".to_string());
    // Alertmanager drops it after five minutes; PagerDuty and webhooks get a trigger only.
    if matches!(receiver.kind, ReceiverKind::Alertmanager { .. }) {
        alert.ends_at = Some(now + 300_000_000_000);
    }
    let body = message(receiver, &alert, "test", &config.external_url, now).body;
    let client = reqwest::Client::builder().timeout(SEND_TIMEOUT).build()?;
    match send(&client, receiver, &body).await {
        Sent::Delivered => Ok(format!("receiver {name:?} took the test alert at {}", endpoint(receiver))),
        Sent::Retry { error, .. } => anyhow::bail!("receiver {name:?} did not take the test alert: {error}"),
        Sent::Refused { error } => anyhow::bail!("receiver {name:?} refused the test alert: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store in a new directory (kept while the directory lives) and alerting that routes
    /// everything to one webhook receiver (nothing listens there: the outbox keeps what is
    /// sent), with `settings` (TOML lines of `[alerts]`) before the receiver.
    async fn hook_alerting(settings: &str) -> (tempfile::TempDir, lagscope_store::SqliteStore, AlertsConfig) {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = lagscope_store::SqliteStore::open_dir(dir.path()).await.expect("store");
        let config: AlertsConfig = toml::from_str(&format!(
            "{settings}\n[[receiver]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"http://127.0.0.1:9/\"\n\
             [[route]]\nreceiver = \"hook\"\n"
        ))
        .expect("config");
        (dir, store, config)
    }

    /// The outbox's messages in the order sent: what `field` reads of each one and its body.
    async fn outbox<T>(
        store: &lagscope_store::SqliteStore,
        field: impl Fn(&lagscope_store::AlertMessage, &serde_json::Value) -> T,
    ) -> Vec<T> {
        let mut messages = store.alert_messages(None, 100).await.expect("outbox");
        messages.reverse();
        messages.iter().map(|message| field(message, &serde_json::from_str(&message.body).expect("json"))).collect()
    }

    /// A per-read anomaly of its own incident (node), as the analyzer stores it.
    fn stale_read(fingerprint: &str, node: &str, start: i64) -> Anomaly {
        Anomaly {
            kind: AnomalyKind::StaleRead,
            severity: lagscope_model::Severity::Critical,
            cluster: Some("prod".to_string()),
            namespace: Some("ns1".to_string()),
            client_id: Some("c1".to_string()),
            node_id: Some(node.to_string()),
            start_unix_nano: start,
            end_unix_nano: start,
            summary: "stale".to_string(),
            cause: "lag".to_string(),
            evidence: serde_json::json!({"floor": 120, "served": 110}).into(),
            open: false,
            fingerprint: fingerprint.to_string(),
        }
    }

    /// A row committed after the alerter read past its last-seen time (another instance's
    /// analyzer, or a slow transaction) is still paged, once; rows already taken are not
    /// taken again; a restart re-reads the settle window without sending anything twice.
    #[tokio::test]
    async fn a_change_committed_late_behind_the_cursor_is_paged_once() {
        const SECOND: i64 = 1_000_000_000;
        let (_dir, store, config) = hook_alerting("").await;
        let now = 1_767_225_600 * SECOND;
        let triggers = |messages: &[lagscope_store::AlertMessage]| -> Vec<String> {
            let mut nodes: Vec<String> = messages
                .iter()
                .filter(|message| message.event == "trigger")
                .map(|message| serde_json::from_str::<serde_json::Value>(&message.body).expect("json"))
                .map(|body| body["commonLabels"]["node"].as_str().unwrap_or_default().to_string())
                .collect();
            nodes.sort();
            nodes
        };
        let mut alerter = Alerter::load(&store, config.clone()).await.expect("load");
        store.upsert_anomalies(&[stale_read("a", "nn-1", now)], now).await.expect("a");
        alerter.pass(&store, now).await.expect("pass 1");
        // Committed now, but seen 5 s earlier than the row the cursor stands on.
        store.upsert_anomalies(&[stale_read("b", "nn-2", now)], now - 5 * SECOND).await.expect("late b");
        alerter.pass(&store, now + SECOND).await.expect("pass 2");
        alerter.pass(&store, now + 2 * SECOND).await.expect("pass 3");
        let messages = store.pending_alert_messages(100).await.expect("outbox");
        assert_eq!(triggers(&messages), ["nn-1", "nn-2"], "{messages:?}");
        // A restart reads the window again: nothing new goes out.
        let mut restarted = Alerter::load(&store, config).await.expect("reload");
        restarted.pass(&store, now + 3 * SECOND).await.expect("pass after restart");
        let messages = store.pending_alert_messages(100).await.expect("outbox");
        assert_eq!(triggers(&messages), ["nn-1", "nn-2"], "{messages:?}");
        // Beyond the settle window a row that late is behind what the alerter reads.
        store.upsert_anomalies(&[stale_read("c", "nn-3", now)], now - 2 * FEED_SETTLE).await.expect("too late c");
        restarted.pass(&store, now + 4 * SECOND).await.expect("pass 5");
        assert_eq!(triggers(&store.pending_alert_messages(100).await.expect("outbox")), ["nn-1", "nn-2"]);
    }

    /// A router's NoNamenodesAvailable window, open or closed at `end`.
    fn window(start: i64, end: i64, open: bool) -> Anomaly {
        Anomaly {
            kind: AnomalyKind::NoNamenodesWindow,
            severity: lagscope_model::Severity::Critical,
            cluster: Some("prod".to_string()),
            namespace: Some("ns1".to_string()),
            client_id: None,
            node_id: Some("router-1".to_string()),
            start_unix_nano: start,
            end_unix_nano: end,
            summary: "router-1 answered NoNamenodesAvailable".to_string(),
            cause: "stale membership cache".to_string(),
            evidence: serde_json::json!({"attempts": 3}).into(),
            open,
            fingerprint: format!("no_namenodes_window|prod|ns1|router-1|{start}"),
        }
    }

    /// A window the analyzer closes and opens again (one source's telemetry ran ahead of the
    /// rest) pages once: it resolves only after staying closed for `window_resolve_after`,
    /// across a restart, with the end it was last seen with; one that opens again after it
    /// resolved pages again.
    #[tokio::test]
    async fn a_window_closed_and_opened_again_pages_once_and_resolves_after_staying_closed() {
        const SECOND: i64 = 1_000_000_000;
        let (_dir, store, config) = hook_alerting("window_resolve_after = \"30s\"").await;
        let now = 1_767_225_600 * SECOND;
        let start = now - 60 * SECOND;
        let events = async || -> Vec<(String, Option<String>)> {
            outbox(&store, |message, body| {
                let ends = body["alerts"][0]["endsAt"].as_str().filter(|at| !at.starts_with("0001"));
                (message.event.clone(), ends.map(str::to_string))
            })
            .await
        };
        let trigger = ("trigger".to_string(), None);
        let mut alerter = Alerter::load(&store, config.clone()).await.expect("load");
        let at = |offset: i64, anomaly: Anomaly| {
            let store = &store;
            async move { store.upsert_anomalies(&[anomaly], now + offset * SECOND).await.expect("upsert") }
        };
        at(0, window(start, now - 20 * SECOND, true)).await;
        alerter.pass(&store, now).await.expect("pass");
        assert_eq!(events().await, std::slice::from_ref(&trigger));
        // Closed, then open again as the late spans arrive, then closed for good.
        at(1, window(start, now - 19 * SECOND, false)).await;
        alerter.pass(&store, now + SECOND).await.expect("pass");
        at(2, window(start, now - 10 * SECOND, true)).await;
        alerter.pass(&store, now + 2 * SECOND).await.expect("pass");
        at(3, window(start, now - 5 * SECOND, false)).await;
        alerter.pass(&store, now + 3 * SECOND).await.expect("pass");
        // Stored again, unchanged, by later passes: the window has been closed since 3 s.
        at(20, window(start, now - 5 * SECOND, false)).await;
        alerter.pass(&store, now + 20 * SECOND).await.expect("pass");
        alerter.pass(&store, now + 32 * SECOND).await.expect("pass");
        assert_eq!(
            events().await,
            std::slice::from_ref(&trigger),
            "nothing but the trigger while the window may open again"
        );
        // A restart keeps the closing state; 30 s after it closed, it resolves at its end.
        let mut alerter = Alerter::load(&store, config.clone()).await.expect("reload");
        alerter.pass(&store, now + 33 * SECOND).await.expect("pass");
        let resolved = ("resolve".to_string(), Some(lagscope_alerts::rfc3339(now - 5 * SECOND)));
        assert_eq!(events().await, [trigger.clone(), resolved.clone()]);
        alerter.pass(&store, now + 40 * SECOND).await.expect("pass");
        assert_eq!(events().await, [trigger.clone(), resolved.clone()], "resolved once");
        // Open again after it resolved: the condition is back, and pages again.
        at(50, window(start, now + 45 * SECOND, true)).await;
        alerter.pass(&store, now + 50 * SECOND).await.expect("pass");
        assert_eq!(events().await, [trigger.clone(), resolved, trigger]);
    }

    /// A window paged from part of its telemetry and then found whole, starting earlier (the
    /// store replaces the partial row, `superseded_by`): the partial's incident resolves as a
    /// closed window does and the whole one pages. A partial replaced before the alerter saw
    /// it pages nothing.
    #[tokio::test]
    async fn a_window_replaced_by_its_whole_resolves_and_one_replaced_unseen_pages_nothing() {
        const SECOND: i64 = 1_000_000_000;
        let (_dir, store, config) = hook_alerting("window_resolve_after = \"30s\"").await;
        let now = 1_767_225_600 * SECOND;
        let events = async || -> Vec<(String, String)> {
            outbox(&store, |message, body| {
                (message.event.clone(), body["alerts"][0]["startsAt"].as_str().unwrap_or_default().to_string())
            })
            .await
        };
        let starts = |at: i64| lagscope_alerts::rfc3339(at);
        let mut alerter = Alerter::load(&store, config.clone()).await.expect("load");
        let partial = now - 50 * SECOND;
        store.upsert_anomalies(&[window(partial, now, true)], now).await.expect("partial");
        alerter.pass(&store, now).await.expect("pass");
        assert_eq!(events().await, [("trigger".to_string(), starts(partial))]);
        let whole = now - 60 * SECOND;
        let outcome = store.upsert_anomalies(&[window(whole, now + SECOND, true)], now + SECOND).await.expect("whole");
        assert_eq!(outcome.superseded, 1);
        alerter.pass(&store, now + SECOND).await.expect("pass");
        alerter.pass(&store, now + 40 * SECOND).await.expect("pass");
        let expected = [
            ("trigger".to_string(), starts(partial)),
            ("trigger".to_string(), starts(whole)),
            ("resolve".to_string(), starts(partial)),
        ];
        assert_eq!(events().await, expected);
        // A partial of a later window, stored after its whole and replaced at once: nothing.
        let later = now + 100 * SECOND;
        store.upsert_anomalies(&[window(later, later + 20 * SECOND, true)], now + 41 * SECOND).await.expect("w");
        alerter.pass(&store, now + 41 * SECOND).await.expect("pass");
        let again = window(later + 5 * SECOND, later + 10 * SECOND, true);
        let outcome = store.upsert_anomalies(&[again], now + 42 * SECOND).await.expect("partial again");
        assert_eq!((outcome.inserted.len(), outcome.superseded), (0, 1));
        alerter.pass(&store, now + 42 * SECOND).await.expect("pass");
        alerter.pass(&store, now + 80 * SECOND).await.expect("pass");
        let paged = events().await;
        assert_eq!(paged.len(), 4, "{paged:?}");
        assert_eq!(paged[3], ("trigger".to_string(), starts(later)));
    }

    /// Per-read anomalies of one node group into one incident while they keep coming; it
    /// resolves once none has come for `resolve_after` (wall clock, as the alerter sees the
    /// changes); the same anomaly stored again does not page, a new one after the resolve
    /// opens the node's next incident, under the same dedup key.
    #[tokio::test]
    async fn per_read_anomalies_of_a_node_page_once_until_quiet_then_again() {
        const SECOND: i64 = 1_000_000_000;
        let (_dir, store, config) = hook_alerting("resolve_after = \"2s\"").await;
        let now = 1_767_225_600 * SECOND;
        let events = async || -> Vec<(String, String, String)> {
            outbox(&store, |message, body| {
                let node = body["commonLabels"]["node"].as_str().unwrap_or_default().to_string();
                (message.event.clone(), node, message.dedup_key.clone())
            })
            .await
        };
        let mut alerter = Alerter::load(&store, config).await.expect("load");
        let at = async |offset_ms: i64, anomalies: &[Anomaly], alerter: &mut Alerter| {
            let when = now + offset_ms * SECOND / 1_000;
            if !anomalies.is_empty() {
                store.upsert_anomalies(anomalies, when).await.expect("upsert");
            }
            alerter.pass(&store, when).await.expect("pass");
        };
        at(0, &[stale_read("a", "nn-1", now)], &mut alerter).await;
        at(1_500, &[stale_read("b", "nn-1", now), stale_read("c", "nn-2", now)], &mut alerter).await;
        at(3_000, &[stale_read("d", "nn-1", now)], &mut alerter).await;
        // nn-2 has been quiet for 3.4 s, nn-1 for 1.9 s only.
        at(4_900, &[], &mut alerter).await;
        let kinds = |events: &[(String, String, String)]| -> Vec<(String, String)> {
            events.iter().map(|(event, node, _)| (event.clone(), node.clone())).collect()
        };
        let pair = |event: &str, node: &str| (event.to_string(), node.to_string());
        assert_eq!(
            kinds(&events().await),
            [pair("trigger", "nn-1"), pair("trigger", "nn-2"), pair("resolve", "nn-2")],
            "one incident per node, nn-2 resolved after 2 s without a new anomaly"
        );
        at(5_000, &[], &mut alerter).await;
        // Stored again by a later analyzer pass, unchanged: nothing pages.
        at(6_000, &[stale_read("a", "nn-1", now), stale_read("c", "nn-2", now)], &mut alerter).await;
        // A new stale read served by nn-1: its next incident.
        at(7_000, &[stale_read("e", "nn-1", now + 7 * SECOND)], &mut alerter).await;
        at(9_000, &[], &mut alerter).await;
        let all = events().await;
        assert_eq!(
            kinds(&all),
            [
                pair("trigger", "nn-1"),
                pair("trigger", "nn-2"),
                pair("resolve", "nn-2"),
                pair("resolve", "nn-1"),
                pair("trigger", "nn-1"),
                pair("resolve", "nn-1"),
            ]
        );
        let keys_of = |node: &str| -> HashSet<&String> {
            all.iter().filter(|(_, of, _)| of == node).map(|(_, _, key)| key).collect()
        };
        assert_eq!(keys_of("nn-1").len(), 1, "one dedup key per node's incidents");
        assert_ne!(keys_of("nn-1"), keys_of("nn-2"));
    }

    #[test]
    fn back_off_doubles_with_jitter_caps_and_honours_retry_after() {
        let (first, longest) = (Duration::from_secs(1), Duration::from_secs(300));
        let waits: Vec<Duration> = (0..12).map(|attempt| back_off(7, attempt, None, first, longest)).collect();
        assert!(waits[0] >= Duration::from_millis(500) && waits[0] <= Duration::from_millis(1_500), "{waits:?}");
        assert!(waits[3] >= Duration::from_secs(4) && waits[3] <= Duration::from_secs(12), "{waits:?}");
        assert!(waits.iter().all(|wait| *wait <= longest.mul_f64(1.5)), "{waits:?}");
        assert!(waits[11] >= longest / 2, "{waits:?}");
        assert_ne!(back_off(7, 2, None, first, longest), back_off(8, 2, None, first, longest), "messages spread out");
        assert!(back_off(7, 0, Some(Duration::from_secs(30)), first, longest) >= Duration::from_secs(30));
    }

    #[test]
    fn receivers_and_routes_parse_from_toml_and_are_checked() {
        let text = r#"
            external_url = "http://lagscope:8080"
            [[receiver]]
            name = "am"
            kind = "alertmanager"
            url = "http://127.0.0.1:9093"
            [[receiver]]
            name = "pd"
            kind = "pagerduty"
            routing_key = "R0UT1NG"
            [[route]]
            receiver = "am"
            [[route]]
            receiver = "pd"
            kinds = ["stale_read"]
            severities = ["critical"]
        "#;
        let config: AlertsConfig = toml::from_str(text).expect("parses");
        config.validate().expect("valid");
        assert!(config.is_enabled());
        assert!(
            matches!(&config.receivers[1].kind, ReceiverKind::Pagerduty { url, .. } if url.contains("pagerduty.com"))
        );
        let mut bad = config.clone();
        bad.routes[1].receiver = "ops".to_string();
        assert!(bad.validate().expect_err("unknown receiver").contains("\"ops\""));
        let mut bad = config.clone();
        bad.routes[1].kinds = vec!["stale_reads".to_string()];
        assert!(bad.validate().expect_err("unknown kind").contains("stale_reads"));
        let mut bad = config;
        bad.resolve_after = "soon".to_string();
        assert!(bad.validate().expect_err("bad duration").contains("alerts.resolve_after"));
        let unknown = "[[receiver]]\nname = \"x\"\nkind = \"email\"\nurl = \"http://x\"\n";
        assert!(toml::from_str::<AlertsConfig>(unknown).is_err());
    }
}
