//! OTLP attribute values to JSON, and the conventions' typed attributes out of them.

use base64::Engine;
use lagscope_model::Attributes;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use serde_json::Value;

/// Converts an OTLP value to plain JSON. Bytes become base64 strings; an empty value is null.
pub fn any_value_to_json(value: Option<&AnyValue>) -> Value {
    let Some(inner) = value.and_then(|value| value.value.as_ref()) else {
        return Value::Null;
    };
    match inner {
        any_value::Value::StringValue(text) => Value::String(text.clone()),
        any_value::Value::BoolValue(flag) => Value::Bool(*flag),
        any_value::Value::IntValue(number) => Value::from(*number),
        any_value::Value::DoubleValue(number) => {
            serde_json::Number::from_f64(*number).map_or_else(|| Value::String(number.to_string()), Value::Number)
        }
        any_value::Value::BytesValue(bytes) => Value::String(base64::engine::general_purpose::STANDARD.encode(bytes)),
        any_value::Value::ArrayValue(array) => {
            Value::Array(array.values.iter().map(|item| any_value_to_json(Some(item))).collect())
        }
        any_value::Value::KvlistValue(list) => Value::Object(key_values_to_json(&list.values)),
        // Reference-style values (profiles) are not used by traces, metrics or logs.
        #[allow(unreachable_patterns)]
        _ => Value::Null,
    }
}

/// Converts a list of OTLP key-values into a JSON object; a later duplicate key wins.
pub fn key_values_to_json(key_values: &[KeyValue]) -> Attributes {
    key_values.iter().map(|key_value| (key_value.key.clone(), any_value_to_json(key_value.value.as_ref()))).collect()
}

/// A typed attribute that had the wrong type, for the sender's error message.
#[derive(Debug, Clone, PartialEq)]
pub struct WrongType {
    pub key: String,
    pub expected: &'static str,
    pub found: Value,
}

impl std::fmt::Display for WrongType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "attribute {:?} must be {}, got {}", self.key, self.expected, self.found)
    }
}

/// Takes the conventions' attributes out of a JSON attribute map, leaving the rest.
pub struct AttributeTaker<'a> {
    attributes: &'a mut Attributes,
}

impl<'a> AttributeTaker<'a> {
    pub fn new(attributes: &'a mut Attributes) -> Self {
        Self { attributes }
    }

    /// A string attribute; numbers and booleans are accepted in their text form.
    pub fn string(&mut self, key: &str) -> Result<Option<String>, WrongType> {
        match self.attributes.remove(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Ok(Some(text)),
            Some(Value::Number(number)) => Ok(Some(number.to_string())),
            Some(Value::Bool(flag)) => Ok(Some(flag.to_string())),
            Some(found) => Err(self.wrong(key, "a string", found)),
        }
    }

    /// An integer attribute; integral doubles and decimal strings are accepted.
    pub fn int(&mut self, key: &str) -> Result<Option<i64>, WrongType> {
        match self.attributes.remove(key) {
            None | Some(Value::Null) => Ok(None),
            Some(found) => match integer_of(&found) {
                Some(number) => Ok(Some(number)),
                None => Err(self.wrong(key, "an integer", found)),
            },
        }
    }

    /// A boolean attribute; the strings "true" and "false" are accepted.
    pub fn bool(&mut self, key: &str) -> Result<Option<bool>, WrongType> {
        match self.attributes.remove(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(flag)) => Ok(Some(flag)),
            Some(Value::String(text)) if text == "true" => Ok(Some(true)),
            Some(Value::String(text)) if text == "false" => Ok(Some(false)),
            Some(found) => Err(self.wrong(key, "a boolean", found)),
        }
    }

    fn wrong(&mut self, key: &str, expected: &'static str, found: Value) -> WrongType {
        WrongType { key: key.to_string(), expected, found }
    }
}

fn integer_of(value: &Value) -> Option<i64> {
    match value {
        Value::Number(number) => number.as_i64().or_else(|| {
            let float = number.as_f64()?;
            (float.fract() == 0.0 && float.abs() < 9.0e18).then_some(float as i64)
        }),
        Value::String(text) => text.trim().parse().ok(),
        _ => None,
    }
}

/// Renders a JSON attribute value as a metric label value: strings as they are, anything
/// else as its JSON text.
pub fn label_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}
