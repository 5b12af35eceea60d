//! Spans: one per attempt of an RPC, from a client, a router or a server.

use serde::{Deserialize, Serialize};

use crate::{StateId, UnixNanos};

/// Attributes that have no column of their own, as plain JSON values (strings, numbers,
/// booleans, arrays, objects; OTLP bytes become base64 strings). Kept whole and queryable.
pub type Attributes = serde_json::Map<String, serde_json::Value>;

/// Declares a string-valued enum whose known values are listed and whose unknown values are
/// kept as `Other`, so that nothing a sender wrote is lost.
macro_rules! open_string_enum {
    ($(#[$meta:meta])* $name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($variant,)+
            /// A value outside the conventions, kept as sent.
            Other(String),
        }

        impl $name {
            pub fn parse(text: &str) -> Self {
                match text {
                    $($text => Self::$variant,)+
                    other => Self::Other(other.to_string()),
                }
            }

            pub fn as_str(&self) -> &str {
                match self {
                    $(Self::$variant => $text,)+
                    Self::Other(text) => text,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                Ok(Self::parse(&text))
            }
        }
    };
}

open_string_enum!(
    /// Which kind of participant emitted a span (`lagscope.component`).
    Component { Client => "client", Router => "router", Server => "server" }
);

open_string_enum!(
    /// What an attempt does to the namespace's state (`lagscope.op`).
    Op { Read => "read", Write => "write", Msync => "msync", Probe => "probe" }
);

open_string_enum!(
    /// How an attempt ended (`lagscope.outcome`).
    Outcome { Ok => "ok", Rejected => "rejected", Error => "error", Timeout => "timeout" }
);

/// OTLP span kind, kept as the protocol numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SpanKind {
    #[default]
    Unspecified,
    Internal,
    Server,
    Client,
    Producer,
    Consumer,
}

impl SpanKind {
    pub fn from_otlp(value: i32) -> Self {
        match value {
            1 => Self::Internal,
            2 => Self::Server,
            3 => Self::Client,
            4 => Self::Producer,
            5 => Self::Consumer,
            _ => Self::Unspecified,
        }
    }

    pub fn to_otlp(self) -> i32 {
        match self {
            Self::Unspecified => 0,
            Self::Internal => 1,
            Self::Server => 2,
            Self::Client => 3,
            Self::Producer => 4,
            Self::Consumer => 5,
        }
    }
}

/// The resource (process) a span or sample came from, with the conventions' fields promoted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResourceFields {
    pub service_name: Option<String>,
    pub system: Option<String>,
    pub cluster: Option<String>,
    pub component: Option<Component>,
    pub node_id: Option<String>,
    /// Every other resource attribute, as sent.
    pub attributes: Attributes,
}

/// The states an attempt carried, saw and returned (`lagscope.state.*`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateFields {
    pub carried: Option<StateId>,
    pub returned: Option<StateId>,
    pub served: Option<StateId>,
    pub committed: Option<StateId>,
    pub router: Option<StateId>,
}

/// The conventions' per-attempt fields (`lagscope.*`, `rpc.method`, `error.type`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CallFields {
    pub client_id: Option<String>,
    pub call_id: Option<String>,
    pub attempt: Option<i64>,
    pub namespace: Option<String>,
    pub op: Option<Op>,
    pub rpc_method: Option<String>,
    pub target_node: Option<String>,
    pub target_role: Option<String>,
    pub node_role: Option<String>,
    pub consistency: Option<String>,
    pub follower_read: Option<bool>,
    pub state: StateFields,
    pub outcome: Option<Outcome>,
    pub error_type: Option<String>,
    pub requeues: Option<i64>,
    pub retry_delay_ms: Option<i64>,
    pub bytes: Option<i64>,
}

/// A timestamped event inside a span (failover, follower read disabled, cache refresh).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpanEvent {
    pub time_unix_nano: UnixNanos,
    pub name: String,
    pub attributes: Attributes,
}

/// A link from a span to another span.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpanLink {
    pub trace_id: Option<String>,
    pub span_id: Option<String>,
    pub attributes: Attributes,
}

/// One attempt as one participant saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Span {
    /// Lowercase hex, 32 digits; `None` when the sender sent no trace context.
    pub trace_id: Option<String>,
    /// Lowercase hex, 16 digits.
    pub span_id: Option<String>,
    pub parent_span_id: Option<String>,
    pub name: String,
    pub kind: SpanKind,
    pub start_unix_nano: UnixNanos,
    pub end_unix_nano: UnixNanos,
    /// OTLP status code: 0 unset, 1 ok, 2 error.
    pub status_code: i32,
    pub status_message: Option<String>,
    pub resource: ResourceFields,
    pub scope_name: Option<String>,
    pub scope_version: Option<String>,
    /// The instrumentation scope's attributes, as sent.
    pub scope_attributes: Attributes,
    pub call: CallFields,
    /// Every span attribute without a column of its own, as sent.
    pub attributes: Attributes,
    pub events: Vec<SpanEvent>,
    pub links: Vec<SpanLink>,
}

impl Span {
    /// The participant kind: `lagscope.component` when sent, otherwise guessed from the span
    /// kind (a CLIENT span carrying a client id is a client attempt, a SERVER span a server
    /// execution).
    pub fn component(&self) -> Option<Component> {
        if let Some(component) = &self.resource.component {
            return Some(component.clone());
        }
        match self.kind {
            SpanKind::Client if self.call.client_id.is_some() => Some(Component::Client),
            SpanKind::Server => Some(Component::Server),
            _ => None,
        }
    }

    pub fn is_ok(&self) -> bool {
        match &self.call.outcome {
            Some(outcome) => *outcome == Outcome::Ok,
            None => self.status_code != 2 && self.call.error_type.is_none(),
        }
    }

    /// A short, stable reference to this span for evidence and links.
    pub fn reference(&self) -> SpanRef {
        SpanRef {
            trace_id: self.trace_id.clone(),
            span_id: self.span_id.clone(),
            service_name: self.resource.service_name.clone(),
            node_id: self.resource.node_id.clone(),
        }
    }
}

/// Identifies a stored span in evidence and timelines.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpanRef {
    pub trace_id: Option<String>,
    pub span_id: Option<String>,
    pub service_name: Option<String>,
    pub node_id: Option<String>,
}
