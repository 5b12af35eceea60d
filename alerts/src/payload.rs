//! The bodies each paging system takes.

use std::collections::BTreeMap;

use lagscope_model::{Severity, UnixNanos};
use serde_json::{Value, json};

use crate::Alert;

/// PagerDuty refuses a `payload.summary` longer than this.
pub const PAGERDUTY_SUMMARY_LIMIT: usize = 1024;

/// Alertmanager's "no end" time, as its webhook writes it.
const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// Unix nanoseconds as RFC 3339 (UTC, nanosecond precision as Alertmanager writes it).
pub fn rfc3339(at: UnixNanos) -> String {
    jiff::Timestamp::from_nanosecond(i128::from(at))
        .map(|timestamp| timestamp.to_string())
        .unwrap_or_else(|_| ZERO_TIME.to_string())
}

/// Text cut to at most `limit` bytes on a character boundary, with `…` when cut.
fn cut(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_string();
    }
    let mut end = limit.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// `POST /api/v2/alerts` of Alertmanager: a list of postable alerts. A resolved alert carries
/// its `endsAt`; a firing one none (Alertmanager then keeps it for its `resolve_timeout`, so
/// firing alerts are sent again within it).
pub fn alertmanager_body(alerts: &[Alert]) -> Value {
    Value::Array(
        alerts
            .iter()
            .map(|alert| {
                let mut object = json!({
                    "labels": alert.labels,
                    "annotations": alert.annotations,
                    "startsAt": rfc3339(alert.starts_at),
                    "generatorURL": alert.generator_url,
                });
                if let Some(ends_at) = alert.ends_at {
                    object["endsAt"] = json!(rfc3339(ends_at));
                }
                object
            })
            .collect(),
    )
}

fn pagerduty_severity(severity: Severity) -> &'static str {
    match severity {
        Severity::Critical => "critical",
        Severity::Warning => "warning",
        _ => "info",
    }
}

/// A PagerDuty Events API v2 event: `trigger` while the incident holds (PagerDuty folds
/// repeats of one `dedup_key` into one incident), `resolve` when it ends.
pub fn pagerduty_body(alert: &Alert, routing_key: &str) -> Value {
    let dedup_key = alert.incident.dedup_key();
    if alert.ends_at.is_some() {
        return json!({ "routing_key": routing_key, "event_action": "resolve", "dedup_key": dedup_key });
    }
    let summary = alert.annotations.get("summary").map(String::as_str).unwrap_or_default();
    json!({
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": dedup_key,
        "payload": {
            "summary": cut(summary, PAGERDUTY_SUMMARY_LIMIT),
            "source": alert.source,
            "severity": pagerduty_severity(alert.severity),
            "timestamp": rfc3339(alert.starts_at),
            "component": alert.labels.get("namespace"),
            "group": alert.labels.get("cluster"),
            "class": alert.labels.get("alertname"),
            "custom_details": {
                "cause": alert.annotations.get("cause"),
                "anomalies": alert.members,
                "labels": alert.labels,
                "evidence": alert.evidence,
            },
        },
        "links": [{ "href": alert.generator_url, "text": "lagscope anomaly" }],
        "client": "lagscope",
        "client_url": alert.generator_url,
    })
}

/// Alertmanager's webhook JSON (version 4) for one incident's alert, as a receiver of
/// `receiver` sees it: `status` firing or resolved, the group's labels, the alert with its
/// Alertmanager-style fingerprint.
pub fn webhook_body(alert: &Alert, receiver: &str, external_url: &str) -> Value {
    let status = if alert.ends_at.is_some() { "resolved" } else { "firing" };
    let group_labels: BTreeMap<&String, &String> = alert
        .labels
        .iter()
        .filter(|(name, _)| matches!(name.as_str(), "alertname" | "cluster" | "namespace" | "node"))
        .collect();
    let dedup_key = alert.incident.dedup_key();
    json!({
        "version": "4",
        "groupKey": format!("{{}}:{{incident=\"{dedup_key}\"}}"),
        "truncatedAlerts": 0,
        "status": status,
        "receiver": receiver,
        "groupLabels": group_labels,
        "commonLabels": alert.labels,
        "commonAnnotations": alert.annotations,
        "externalURL": external_url,
        "alerts": [{
            "status": status,
            "labels": alert.labels,
            "annotations": alert.annotations,
            "startsAt": rfc3339(alert.starts_at),
            "endsAt": alert.ends_at.map(rfc3339).unwrap_or_else(|| ZERO_TIME.to_string()),
            "generatorURL": alert.generator_url,
            "fingerprint": dedup_key.rsplit('-').next().unwrap_or_default(),
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IncidentKey;

    fn alert(summary: &str) -> Alert {
        let mut labels = BTreeMap::new();
        labels.insert("alertname".to_string(), "apply_lag".to_string());
        labels.insert("node".to_string(), "obs1".to_string());
        let mut annotations = BTreeMap::new();
        annotations.insert("summary".to_string(), summary.to_string());
        Alert {
            incident: IncidentKey("apply_lag|f1".to_string()),
            labels,
            annotations,
            starts_at: 1_767_225_600_000_000_000,
            ends_at: None,
            generator_url: "http://ls/anomalies/3".to_string(),
            severity: Severity::Warning,
            source: "obs1".to_string(),
            evidence: json!({"behind_states": 20_000}),
            members: 1,
            closed: None,
        }
    }

    #[test]
    fn alertmanager_alerts_carry_their_end_only_when_resolved() {
        let mut firing = alert("observer behind");
        let body = alertmanager_body(std::slice::from_ref(&firing));
        assert_eq!(body[0]["startsAt"], "2026-01-01T00:00:00Z");
        assert_eq!(body[0]["labels"]["alertname"], "apply_lag");
        assert!(body[0].get("endsAt").is_none());
        firing.ends_at = Some(firing.starts_at + 62_000_000_000);
        assert_eq!(alertmanager_body(&[firing])[0]["endsAt"], "2026-01-01T00:01:02Z");
    }

    #[test]
    fn pagerduty_events_trigger_with_a_bounded_summary_and_resolve_by_key() {
        let long = "é".repeat(2_000);
        let trigger = pagerduty_body(&alert(&long), "R0UT1NG");
        let summary = trigger["payload"]["summary"].as_str().expect("summary");
        assert!(summary.len() <= PAGERDUTY_SUMMARY_LIMIT && summary.ends_with('…'), "{}", summary.len());
        assert_eq!(trigger["event_action"], "trigger");
        assert_eq!(trigger["payload"]["severity"], "warning");
        assert_eq!(trigger["payload"]["custom_details"]["evidence"]["behind_states"], 20_000);
        assert_eq!(trigger["links"][0]["href"], "http://ls/anomalies/3");
        let mut ended = alert("x");
        ended.ends_at = Some(ended.starts_at + 1);
        let resolve = pagerduty_body(&ended, "R0UT1NG");
        assert_eq!(resolve["event_action"], "resolve");
        assert_eq!(resolve["dedup_key"], trigger["dedup_key"]);
    }

    #[test]
    fn webhooks_follow_alertmanager_version_4() {
        let body = webhook_body(&alert("behind"), "hooks", "http://ls");
        assert_eq!(body["version"], "4");
        assert_eq!(body["status"], "firing");
        assert_eq!(body["alerts"][0]["endsAt"], "0001-01-01T00:00:00Z");
        assert_eq!(body["groupLabels"]["node"], "obs1");
        assert_eq!(body["receiver"], "hooks");
    }
}
