//! OTLP attribute values to JSON, and the conventions' typed attributes out of them.

use base64::Engine;
use lagscope_model::Attributes;
use lagscope_model::conventions as conv;
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

/// The conventions' call attributes a span may carry ([`AttributeTaker`]).
const CALL_KEYS: [&str; 21] = [
    conv::CLIENT_ID,
    conv::CALL_ID,
    conv::ATTEMPT,
    conv::NAMESPACE,
    conv::OP,
    conv::RPC_METHOD,
    conv::TARGET_NODE,
    conv::TARGET_ROLE,
    conv::NODE_ROLE,
    conv::CONSISTENCY,
    conv::FOLLOWER_READ,
    conv::STATE_CARRIED,
    conv::STATE_RETURNED,
    conv::STATE_SERVED,
    conv::STATE_COMMITTED,
    conv::STATE_ROUTER,
    conv::OUTCOME,
    conv::ERROR_TYPE,
    conv::REQUEUES,
    conv::RETRY_DELAY_MS,
    conv::BYTES,
];

/// Where `key` is in [`CALL_KEYS`].
fn call_key_index(key: &str) -> Option<usize> {
    Some(match key {
        conv::CLIENT_ID => 0,
        conv::CALL_ID => 1,
        conv::ATTEMPT => 2,
        conv::NAMESPACE => 3,
        conv::OP => 4,
        conv::RPC_METHOD => 5,
        conv::TARGET_NODE => 6,
        conv::TARGET_ROLE => 7,
        conv::NODE_ROLE => 8,
        conv::CONSISTENCY => 9,
        conv::FOLLOWER_READ => 10,
        conv::STATE_CARRIED => 11,
        conv::STATE_RETURNED => 12,
        conv::STATE_SERVED => 13,
        conv::STATE_COMMITTED => 14,
        conv::STATE_ROUTER => 15,
        conv::OUTCOME => 16,
        conv::ERROR_TYPE => 17,
        conv::REQUEUES => 18,
        conv::RETRY_DELAY_MS => 19,
        conv::BYTES => 20,
        _ => return None,
    })
}

/// A span's call attributes (the conventions' [`CALL_KEYS`]), set apart from the others as its
/// key-values are read, for their typed fields to be taken.
///
/// Setting them apart while the others go into a map, rather than taking them out of a map of
/// all of them, keeps the others in the order they were sent (a map's removal moves its last
/// entry into the gap) and spares a string copy for each call attribute and a hashed lookup
/// for each of the 21 keys, present or not: every span received goes through it.
pub struct AttributeTaker {
    call: [Option<Value>; CALL_KEYS.len()],
}

impl AttributeTaker {
    /// The call attributes of `key_values`, and every other attribute as JSON in the order
    /// sent; of a key sent twice the later value counts (as [`key_values_to_json`]).
    pub fn split(key_values: &[KeyValue]) -> (Self, Attributes) {
        let mut call: [Option<Value>; CALL_KEYS.len()] = Default::default();
        let mut rest = Attributes::new();
        for key_value in key_values {
            let value = any_value_to_json(key_value.value.as_ref());
            match call_key_index(&key_value.key) {
                Some(index) => call[index] = Some(value),
                None => {
                    rest.insert(key_value.key.clone(), value);
                }
            }
        }
        (Self { call }, rest)
    }

    fn take(&mut self, key: &str) -> Option<Value> {
        let index = call_key_index(key);
        debug_assert!(index.is_some(), "{key:?} is not a call attribute");
        index.and_then(|index| self.call[index].take())
    }

    /// A string attribute; numbers and booleans are accepted in their text form.
    pub fn string(&mut self, key: &str) -> Result<Option<String>, WrongType> {
        match self.take(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Ok(Some(text)),
            Some(Value::Number(number)) => Ok(Some(number.to_string())),
            Some(Value::Bool(flag)) => Ok(Some(flag.to_string())),
            Some(found) => Err(wrong(key, "a string", found)),
        }
    }

    /// An integer attribute; integral doubles and decimal strings are accepted.
    pub fn int(&mut self, key: &str) -> Result<Option<i64>, WrongType> {
        match self.take(key) {
            None | Some(Value::Null) => Ok(None),
            Some(found) => match integer_of(&found) {
                Some(number) => Ok(Some(number)),
                None => Err(wrong(key, "an integer", found)),
            },
        }
    }

    /// A boolean attribute; the strings "true" and "false" are accepted.
    pub fn bool(&mut self, key: &str) -> Result<Option<bool>, WrongType> {
        match self.take(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(flag)) => Ok(Some(flag)),
            Some(Value::String(text)) if text == "true" => Ok(Some(true)),
            Some(Value::String(text)) if text == "false" => Ok(Some(false)),
            Some(found) => Err(wrong(key, "a boolean", found)),
        }
    }
}

fn wrong(key: &str, expected: &'static str, found: Value) -> WrongType {
    WrongType { key: key.to_string(), expected, found }
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

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::AnyValue;

    fn key_value(key: &str, value: any_value::Value) -> KeyValue {
        KeyValue { key: key.to_string(), value: Some(AnyValue { value: Some(value) }), ..Default::default() }
    }

    #[test]
    fn every_call_key_is_found_at_its_place() {
        for (index, key) in CALL_KEYS.iter().enumerate() {
            assert_eq!(call_key_index(key), Some(index), "{key}");
        }
        assert_eq!(call_key_index("lagscope.cluster"), None);
    }

    #[test]
    fn call_attributes_are_set_apart_and_the_others_kept_in_the_order_sent() {
        let text = |text: &str| any_value::Value::StringValue(text.to_string());
        let (mut call, rest) = AttributeTaker::split(&[
            key_value("zeta", text("first")),
            key_value(conv::CLIENT_ID, text("c1")),
            key_value("alpha", text("a")),
            key_value(conv::STATE_CARRIED, any_value::Value::IntValue(41)),
            key_value("mid", any_value::Value::BoolValue(true)),
            key_value(conv::STATE_CARRIED, any_value::Value::StringValue("42".to_string())),
            key_value("zeta", text("second")),
        ]);
        let keys: Vec<&str> = rest.keys().map(String::as_str).collect();
        assert_eq!(keys, ["zeta", "alpha", "mid"], "the order sent; a key sent twice keeps its first place");
        assert_eq!(rest["zeta"], Value::from("second"), "and its later value");
        assert_eq!(call.string(conv::CLIENT_ID), Ok(Some("c1".to_string())));
        assert_eq!(call.int(conv::STATE_CARRIED), Ok(Some(42)), "the later value, a decimal string");
        assert_eq!(call.int(conv::STATE_CARRIED), Ok(None), "taken once");
        assert_eq!(call.string(conv::CALL_ID), Ok(None));
        let (mut call, _) = AttributeTaker::split(&[key_value(conv::FOLLOWER_READ, text("sometimes"))]);
        let wrong = call.bool(conv::FOLLOWER_READ).expect_err("not a boolean");
        assert_eq!(wrong.to_string(), r#"attribute "lagscope.follower_read" must be a boolean, got "sometimes""#);
    }
}
