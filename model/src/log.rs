//! Log records: what a process printed, with its resource and attributes.

use serde::{Deserialize, Serialize};

use crate::UnixNanos;
use crate::span::{Attributes, ResourceFields};

/// One log record, as OTLP carries it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogRecord {
    /// When the event happened (OTLP `timeUnixNano`, or the observed time when that is unset).
    pub time_unix_nano: UnixNanos,
    pub observed_time_unix_nano: Option<UnixNanos>,
    /// OTLP severity number (1–24; 0 unspecified) and the sender's text for it.
    pub severity_number: i32,
    pub severity_text: Option<String>,
    /// The body as JSON (a string for plain log lines).
    pub body: serde_json::Value,
    pub event_name: Option<String>,
    pub trace_id: Option<String>,
    pub span_id: Option<String>,
    pub resource: ResourceFields,
    pub scope_name: Option<String>,
    pub scope_version: Option<String>,
    pub attributes: Attributes,
}

impl LogRecord {
    /// The body as text: the string itself, or its JSON.
    pub fn body_text(&self) -> String {
        match &self.body {
            serde_json::Value::String(text) => text.clone(),
            other => other.to_string(),
        }
    }
}
