//! OTLP log requests to domain log records.

use lagscope_model::LogRecord;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;

use super::attributes::{any_value_to_json, key_values_to_json};
use super::traces::hex_id;
use super::{Converted, Rejection, resource_fields, unix_nanos};

/// Converts every log record of a request; a record with a malformed id or time is refused
/// alone, with a message naming it.
pub fn logs_from_request(request: &ExportLogsServiceRequest) -> Converted<LogRecord> {
    let mut converted = Converted::default();
    for (resource_index, resource_logs) in request.resource_logs.iter().enumerate() {
        let resource = resource_fields(resource_logs.resource.as_ref());
        for (scope_index, scope_logs) in resource_logs.scope_logs.iter().enumerate() {
            let scope = scope_logs.scope.as_ref();
            for (record_index, record) in scope_logs.log_records.iter().enumerate() {
                // (Written only for a record refused: most are not.)
                let path =
                    || format!("resourceLogs[{resource_index}].scopeLogs[{scope_index}].logRecords[{record_index}]");
                let result = (|| {
                    let observed = unix_nanos(record.observed_time_unix_nano, "observedTimeUnixNano")?;
                    let time = unix_nanos(record.time_unix_nano, "timeUnixNano")?;
                    Ok::<_, String>(LogRecord {
                        time_unix_nano: if time != 0 { time } else { observed },
                        observed_time_unix_nano: Some(observed).filter(|observed| *observed != 0),
                        severity_number: record.severity_number,
                        severity_text: Some(record.severity_text.clone()).filter(|text| !text.is_empty()),
                        body: any_value_to_json(record.body.as_ref()),
                        event_name: Some(record.event_name.clone()).filter(|name| !name.is_empty()),
                        trace_id: hex_id(&record.trace_id, 16, "traceId")?,
                        span_id: hex_id(&record.span_id, 8, "spanId")?,
                        resource: resource.clone(),
                        scope_name: scope.map(|scope| scope.name.clone()).filter(|name| !name.is_empty()),
                        scope_version: scope.map(|scope| scope.version.clone()).filter(|version| !version.is_empty()),
                        attributes: key_values_to_json(&record.attributes),
                    })
                })();
                match result {
                    Ok(log) => converted.items.push(log),
                    Err(message) => converted.rejections.push(Rejection { path: path(), message }),
                }
            }
        }
    }
    converted
}
