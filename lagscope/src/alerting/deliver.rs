//! Delivery of the outbox: each (receiver, dedup key)'s messages in order, retried with
//! back-off and jitter (honouring `Retry-After`), every attempt recorded; and `alerts test`.

use super::*;

/// The body `receiver` takes for `alert`, as an outbox message.
pub(super) fn message(
    receiver: &Receiver,
    alert: &Alert,
    event: &str,
    external_url: &str,
    now: i64,
) -> NewAlertMessage {
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
pub(super) fn endpoint(receiver: &Receiver) -> String {
    match &receiver.kind {
        ReceiverKind::Alertmanager { url } => format!("{}/api/v2/alerts", url.trim_end_matches('/')),
        ReceiverKind::Pagerduty { url, .. } | ReceiverKind::Webhook { url } => url.clone(),
    }
}

/// What one POST came to, before back-off is applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Sent {
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
pub(super) async fn send(client: &reqwest::Client, receiver: &Receiver, body: &str) -> Sent {
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
pub(super) fn back_off(
    id: i64,
    attempts: i64,
    retry_after: Option<Duration>,
    first: Duration,
    longest: Duration,
) -> Duration {
    let doubled = first.saturating_mul(1u32 << attempts.clamp(0, 16) as u32).min(longest);
    let mut hash =
        (id as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (attempts as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash ^= hash >> 31;
    let jitter = 0.5 + (hash % 1_000) as f64 / 1_000.0;
    doubled.mul_f64(jitter).max(retry_after.unwrap_or_default())
}

pub(super) async fn run_deliverer(
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
pub(super) async fn deliver_pass(
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
