//! OTLP: decoding request bodies (protobuf or JSON, gzip) and converting them to the domain
//! model. Everything here is pure; the HTTP receiver in [`http`] does the I/O.

mod attributes;
pub mod decode;
pub mod grpc;
pub mod http;
pub mod ingest;
mod logs;
mod metrics;
mod traces;

use lagscope_model::conventions as conv;
use lagscope_model::{Component, ResourceFields, UnixNanos};
use opentelemetry_proto::tonic::resource::v1::Resource;

pub use attributes::any_value_to_json;
pub use logs::logs_from_request;
pub use metrics::samples_from_request;
pub use traces::spans_from_request;

/// Records converted from one request, and those refused (OTLP partial success).
#[derive(Debug)]
pub struct Converted<T> {
    pub items: Vec<T>,
    pub rejections: Vec<Rejection>,
}

impl<T> Default for Converted<T> {
    fn default() -> Self {
        Self { items: Vec::new(), rejections: Vec::new() }
    }
}

impl<T> Converted<T> {
    /// One message for the sender covering the first few rejections.
    pub fn rejection_message(&self) -> Option<String> {
        const SHOWN: usize = 5;
        let first = self.rejections.first()?;
        let mut message = format!("{}: {}", first.path, first.message);
        for rejection in self.rejections.iter().skip(1).take(SHOWN - 1) {
            message.push_str(&format!("; {}: {}", rejection.path, rejection.message));
        }
        if self.rejections.len() > SHOWN {
            message.push_str(&format!("; and {} more", self.rejections.len() - SHOWN));
        }
        Some(message)
    }
}

/// One record refused, with where it was in the request and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    pub path: String,
    pub message: String,
}

/// The resource's conventions promoted; every other resource attribute kept as sent.
pub(crate) fn resource_fields(resource: Option<&Resource>) -> ResourceFields {
    let mut attributes =
        resource.map(|resource| attributes::key_values_to_json(&resource.attributes)).unwrap_or_default();
    let mut take = |key: &str| match attributes.remove(key) {
        Some(serde_json::Value::String(text)) => Some(text),
        Some(serde_json::Value::Null) | None => None,
        Some(other) => Some(attributes::label_text(&other)),
    };
    ResourceFields {
        service_name: take(conv::SERVICE_NAME),
        system: take(conv::SYSTEM),
        cluster: take(conv::CLUSTER),
        component: take(conv::COMPONENT).as_deref().map(Component::parse),
        node_id: take(conv::NODE_ID),
        attributes,
    }
}

/// OTLP times are unsigned; the store's are signed (valid until 2262).
pub(crate) fn unix_nanos(value: u64, field: &str) -> Result<UnixNanos, String> {
    i64::try_from(value).map_err(|_| format!("{field} {value} is beyond the year 2262"))
}
