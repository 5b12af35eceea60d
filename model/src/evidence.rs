//! An anomaly's evidence: one JSON object, kept as the text the detector wrote.
//!
//! Detectors write evidence once, straight to JSON ([`Evidence::of`] an [`Object`] of fields);
//! the store keeps that text and the API and `analyze` send it on unchanged. Nothing on that
//! path builds a `serde_json::Value` tree: at one anomaly per twenty spans, building and
//! re-serializing maps was most of the analyzer's time. Readers that want fields (tests,
//! alert templates, the log-line pass) get a parsed [`Value`], made once and cached.

use std::fmt;
use std::sync::OnceLock;

use serde::de::Deserializer;
use serde::ser::{SerializeStruct, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::json::RAW_VALUE;

/// A JSON object of evidence (see the module documentation).
#[derive(Clone)]
pub struct Evidence {
    /// JSON text, written by a JSON serializer (never taken from outside unparsed).
    raw: Box<str>,
    parsed: OnceLock<Value>,
}

impl Evidence {
    /// `{}`.
    pub fn empty() -> Self {
        Self::from_json_text(String::from("{}"))
    }

    /// Evidence written from a serializable object (an [`Object`] of fields, a struct, a
    /// map) in one pass, without a `Value` in between. Values that serde_json cannot write
    /// (maps with non-string keys) leave `null`.
    ///
    /// Written by [`crate::json`] (serde_json's text, faster) into a buffer kept per thread,
    /// then copied once at its exact size; serde_json writes what that writer does not take.
    /// Either way the text comes from a serializer, so it is not parsed again to be checked.
    pub fn of<T: Serialize + ?Sized>(object: &T) -> Self {
        thread_local! {
            static SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
        }
        // Taken, not borrowed: a value that writes evidence while being written finds an
        // empty buffer of its own.
        let mut scratch = SCRATCH.take();
        scratch.clear();
        let written = crate::json::write(&mut scratch, object)
            .ok()
            .and_then(|()| std::str::from_utf8(&scratch).ok())
            .map(Box::<str>::from);
        SCRATCH.set(scratch);
        if let Some(raw) = written {
            return Self { raw, parsed: OnceLock::new() };
        }
        match serde_json::to_string(object) {
            Ok(text) => Self::from_json_text(text),
            Err(_) => Self::from(Value::Null),
        }
    }

    /// The evidence as JSON text (an object).
    pub fn as_json(&self) -> &str {
        &self.raw
    }

    /// The evidence as a JSON value (parsed on first use, then kept).
    pub fn value(&self) -> &Value {
        self.parsed.get_or_init(|| serde_json::from_str(&self.raw).unwrap_or(Value::Null))
    }

    /// One field, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.value().get(key)
    }

    /// Sets one field (re-writing the text; for the rare fields added after detection).
    pub fn insert(&mut self, key: &str, value: Value) {
        let mut object = match self.value().clone() {
            Value::Object(object) => object,
            _ => serde_json::Map::new(),
        };
        object.insert(key.to_string(), value);
        *self = Self::from(Value::Object(object));
    }

    /// Text a JSON serializer wrote (one valid JSON value).
    fn from_json_text(json: String) -> Self {
        Self { raw: json.into_boxed_str(), parsed: OnceLock::new() }
    }
}

impl Default for Evidence {
    fn default() -> Self {
        Self::empty()
    }
}

impl From<Value> for Evidence {
    fn from(value: Value) -> Self {
        // Serializing a Value cannot fail.
        let text = serde_json::to_string(&value).unwrap_or_else(|_| String::from("null"));
        let evidence = Self::from_json_text(text);
        let _ = evidence.parsed.set(value);
        evidence
    }
}

/// Equal when they say the same: the same text, or the same parsed value (key order and
/// spacing aside, as two stores may render it).
impl PartialEq for Evidence {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw || self.value() == other.value()
    }
}

impl fmt::Debug for Evidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

/// The JSON text; `{:#}` pretty-prints it.
impl fmt::Display for Evidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if f.alternate() { write!(f, "{:#}", self.value()) } else { f.write_str(&self.raw) }
    }
}

impl<'a> std::ops::Index<&'a str> for Evidence {
    type Output = Value;

    fn index(&self, key: &'a str) -> &Value {
        &self.value()[key]
    }
}

/// As serde_json's `RawValue` serializes (a struct of [`RAW_VALUE`]'s name): JSON serializers
/// (serde_json's, [`crate::json`]'s) copy the text as it is.
impl Serialize for Evidence {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut raw = serializer.serialize_struct(RAW_VALUE, 1)?;
        raw.serialize_field(RAW_VALUE, &*self.raw)?;
        raw.end()
    }
}

/// Read through a [`Value`], so any serde format (not only JSON text) can carry evidence.
impl<'de> Deserialize<'de> for Evidence {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Value::deserialize(deserializer).map(Self::from)
    }
}

/// A JSON object's fields as a list built at compile time (`Field(key, &value, rest)` ending
/// in [`End`]), written in one pass by [`Object`]: what the analyzer's `evidence!` macro
/// expands to.
pub trait Fields {
    /// How many fields the list has.
    const LEN: usize;

    fn write<M: SerializeStruct>(&self, object: &mut M) -> Result<(), M::Error>;
}

/// The end of a field list.
pub struct End;

/// One field and the rest of the list.
pub struct Field<'a, T: ?Sized, Rest>(pub &'static str, pub &'a T, pub Rest);

impl Fields for End {
    const LEN: usize = 0;

    fn write<M: SerializeStruct>(&self, _: &mut M) -> Result<(), M::Error> {
        Ok(())
    }
}

impl<T: Serialize + ?Sized, Rest: Fields> Fields for Field<'_, T, Rest> {
    const LEN: usize = 1 + Rest::LEN;

    fn write<M: SerializeStruct>(&self, object: &mut M) -> Result<(), M::Error> {
        object.serialize_field(self.0, self.1)?;
        self.2.write(object)
    }
}

/// A field list serialized as one JSON object, in its order: as a struct (the keys are
/// literals in the source, written without being scanned for escapes; JSON serializers write
/// a struct as they write a map).
pub struct Object<F>(pub F);

impl<F: Fields> Serialize for Object<F> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut object = serializer.serialize_struct("Evidence", F::LEN)?;
        self.0.write(&mut object)?;
        object.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields() -> Evidence {
        let read = Object(Field("rpc_method", "getFileInfo", End));
        Evidence::of(&Object(Field(
            "floor",
            &120,
            Field(
                "served",
                &Some(110_i64),
                Field(
                    "node",
                    &None::<String>,
                    Field("ratio", &f64::NAN, Field("text", "a \"quoted\" <script>", Field("read", &read, End))),
                ),
            ),
        )))
    }

    #[test]
    fn written_fields_read_back_as_the_value_would() {
        let evidence = fields();
        let expected = json!({
            "floor": 120, "served": 110, "node": null, "ratio": null,
            "text": "a \"quoted\" <script>", "read": {"rpc_method": "getFileInfo"},
        });
        assert_eq!(evidence.as_json(), serde_json::to_string(&expected).expect("serializes"));
        assert_eq!(evidence["read"]["rpc_method"], "getFileInfo");
        assert_eq!(evidence, Evidence::from(expected));
    }

    #[test]
    fn round_trips_through_json_and_compares_by_meaning() {
        let evidence = Evidence::of(&Object(Field("b", &1, Field("a", &[1, 2], End))));
        let text = serde_json::to_string(&evidence).expect("serializes");
        assert_eq!(text, r#"{"b":1,"a":[1,2]}"#);
        let back: Evidence = serde_json::from_str(&text).expect("parses");
        assert_eq!(back, evidence);
        let reordered: Evidence = serde_json::from_str(r#"{ "a": [1, 2], "b": 1 }"#).expect("parses");
        assert_eq!(reordered, evidence);
        assert_ne!(Evidence::empty(), evidence);
    }

    #[test]
    fn evidence_in_evidence_is_copied_and_what_the_fast_writer_refuses_serde_json_writes() {
        let inner = Evidence::of(&Object(Field("a", &1, End)));
        let outer = Evidence::of(&Object(Field("inner", &inner, Field("list", &[&inner], End))));
        assert_eq!(outer.as_json(), r#"{"inner":{"a":1},"list":[{"a":1}]}"#);
        // serde_json writes boolean map keys as strings; the fast writer leaves them to it.
        let keyed = std::collections::BTreeMap::from([(true, "yes")]);
        let evidence = Evidence::of(&Object(Field("keyed", &keyed, End)));
        let expected = format!(r#"{{"keyed":{}}}"#, serde_json::to_string(&keyed).expect("serializes"));
        assert_eq!(evidence.as_json(), expected);
        assert_eq!(evidence["keyed"]["true"], "yes");
    }

    #[test]
    fn insert_adds_a_field() {
        let mut evidence = Evidence::of(&Object(Field("a", &1, End)));
        evidence.insert("log_lines", json!({"count": 2}));
        assert_eq!(evidence.as_json(), r#"{"a":1,"log_lines":{"count":2}}"#);
        assert_eq!(evidence["log_lines"]["count"], 2);
    }
}
