//! Compact JSON text for evidence, byte for byte what `serde_json::to_string` writes, with
//! strings escaped a word at a time.
//!
//! serde_json checks every byte of every string against its escape table and copies each
//! string through two calls. Evidence is mostly strings (trace and span ids, node and service
//! names, summaries), one anomaly per twenty spans: that loop was a sixth of an offline
//! analysis's instructions. Here a string is tested eight bytes at a time for what JSON
//! escapes (`"`, `\` and control characters) and, with none (nearly always), copied whole;
//! otherwise it is written byte by byte. Numbers, nulls and escapes are written by serde_json's
//! own [`CompactFormatter`], so the text is the same.
//!
//! serde_json's raw values (and so [`crate::Evidence`]) are copied as they are, as serde_json
//! copies them. Map keys that are not strings or integers are an error, and
//! [`crate::Evidence::of`] then writes with serde_json instead.

use std::fmt;

use serde::Serialize;
use serde::ser::{self, Impossible};
use serde_json::ser::{CharEscape, CompactFormatter, Formatter};

/// The struct name through which serde_json's raw values (`RawValue`) serialize: a struct of
/// this name with one string field of this name is JSON text to copy as it is. serde_json's
/// own serializer recognises it; so does [`write`], and [`crate::Evidence`] serializes that way.
pub(crate) const RAW_VALUE: &str = "$serde_json::private::RawValue";

/// Appends `value` as compact JSON to `out`. On error `out` holds a partial text.
pub fn write<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) -> Result<(), Error> {
    value.serialize(&mut Writer { out })
}

/// Appends `text` as a JSON string (quoted and escaped as serde_json escapes it).
pub fn write_str(out: &mut Vec<u8>, text: &str) {
    let bytes = text.as_bytes();
    if needs_escaping(bytes) {
        write_escaped(out, bytes);
    } else {
        out.reserve(bytes.len() + 2);
        out.push(b'"');
        out.extend_from_slice(bytes);
        out.push(b'"');
    }
}

/// [`write_str`] into a `String`: text written this way needs no UTF-8 check to become one
/// (JSON pieces written once and copied into several documents, see [`Raw`]).
pub fn push_str(out: &mut String, text: &str) {
    if needs_escaping(text.as_bytes()) {
        let mut escaped = Vec::with_capacity(text.len() + 8);
        write_escaped(&mut escaped, text.as_bytes());
        // Escaping writes ASCII in place of ASCII and copies every other byte as it was.
        out.push_str(&String::from_utf8_lossy(&escaped));
    } else {
        out.reserve(text.len() + 2);
        out.push('"');
        out.push_str(text);
        out.push('"');
    }
}

/// JSON text written by a serializer (or by [`push_str`] and constant punctuation), copied as
/// it is into the document it is serialized into: by [`write`], and by serde_json, which
/// copies raw values the same way.
#[derive(Debug, Clone, Copy)]
pub struct Raw<'a>(pub &'a str);

impl Serialize for Raw<'_> {
    fn serialize<S: ser::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use ser::SerializeStruct as _;
        let mut raw = serializer.serialize_struct(RAW_VALUE, 1)?;
        raw.serialize_field(RAW_VALUE, self.0)?;
        raw.end()
    }
}

/// Whether JSON escapes this byte: a control character (below 0x20), a quote, a backslash.
const fn special(byte: u8) -> bool {
    byte < 0x20 || byte == b'"' || byte == b'\\'
}

/// Whether any byte of `bytes` is [`special`]: eight bytes at a time (the last eight
/// overlapping the word before), one at a time below eight.
#[inline]
fn needs_escaping(bytes: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // A high bit set in each byte below `n` (with false positives only above a true one:
    // zero exactly when no byte is below `n`).
    let below = |word: u64, n: u64| word.wrapping_sub(n * ONES) & !word & HIGHS;
    let word_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default());
    let special_in = |word: u64| {
        below(word, 0x20) | below(word ^ (u64::from(b'"') * ONES), 1) | below(word ^ (u64::from(b'\\') * ONES), 1)
    };
    let length = bytes.len();
    if length < 8 {
        return bytes.iter().any(|byte| special(*byte));
    }
    let mut found = special_in(word_at(length - 8));
    let mut at = 0;
    while at + 8 < length {
        found |= special_in(word_at(at));
        at += 8;
    }
    found != 0
}

/// A string with something to escape, byte by byte.
#[cold]
#[inline(never)]
fn write_escaped(out: &mut Vec<u8>, bytes: &[u8]) {
    out.reserve(bytes.len() + 8);
    out.push(b'"');
    for byte in bytes {
        if special(*byte) {
            escape(out, *byte);
        } else {
            out.push(*byte);
        }
    }
    out.push(b'"');
}

#[cold]
fn escape(out: &mut Vec<u8>, byte: u8) {
    let escape = match byte {
        b'"' => CharEscape::Quote,
        b'\\' => CharEscape::ReverseSolidus,
        0x08 => CharEscape::Backspace,
        0x09 => CharEscape::Tab,
        0x0a => CharEscape::LineFeed,
        0x0c => CharEscape::FormFeed,
        0x0d => CharEscape::CarriageReturn,
        _ => CharEscape::AsciiControl(byte),
    };
    // Writing to a Vec cannot fail.
    let _ = CompactFormatter.write_char_escape(out, escape);
}

/// Why a value was not written.
#[derive(Debug)]
pub struct Error(String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl ser::Error for Error {
    fn custom<T: fmt::Display>(message: T) -> Self {
        Error(message.to_string())
    }
}

/// A serde serializer writing compact JSON to a byte vector.
struct Writer<'o> {
    out: &'o mut Vec<u8>,
}

impl<'o> Writer<'o> {
    /// `{"variant":`, which an enum variant's value follows (and `}` closes).
    fn variant_key(&mut self, variant: &str) {
        self.out.push(b'{');
        write_str(self.out, variant);
        self.out.push(b':');
    }

    /// An array or object opened with `open`, to be closed with `close`.
    fn compound<'w>(&'w mut self, open: u8, close: &'static [u8]) -> Compound<'w, 'o> {
        self.out.push(open);
        Compound { writer: self, first: true, close, raw: false }
    }
}

/// An array or object being written: whether an element was written yet, and what closes it
/// (or a raw value, whose one field is copied as it is).
struct Compound<'w, 'o> {
    writer: &'w mut Writer<'o>,
    first: bool,
    close: &'static [u8],
    raw: bool,
}

impl Compound<'_, '_> {
    fn separate(&mut self) {
        if !std::mem::take(&mut self.first) {
            self.writer.out.push(b',');
        }
    }

    /// A struct field's separator, quoted name and colon, in one go. A field name is program
    /// text (a Rust identifier, or a `rename` in lagscope's source), never telemetry: nothing
    /// in it to escape, so it is not scanned (a debug build checks). Every anomaly writes a
    /// hundred of them or so; scanning each was a tenth of writing the evidence.
    fn field_name(&mut self, key: &'static str) {
        debug_assert!(!needs_escaping(key.as_bytes()), "a field name with something to escape: {key:?}");
        let out = &mut *self.writer.out;
        out.reserve(key.len() + 4);
        if !std::mem::take(&mut self.first) {
            out.push(b',');
        }
        out.push(b'"');
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(b"\":");
    }

    /// A member's value, after its key.
    fn member_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Done {
        self.writer.out.push(b':');
        value.serialize(&mut *self.writer)
    }

    fn finish(self) -> Done {
        self.writer.out.extend_from_slice(self.close);
        Ok(())
    }
}

type Done = Result<(), Error>;

/// Floats, written by serde_json's formatter; NaN and the infinities as `null`, as serde_json
/// writes them.
macro_rules! floats {
    ($($method:ident: $type:ty => $write:ident),*) => {$(
        fn $method(self, value: $type) -> Done {
            // Writing to a Vec cannot fail.
            let _ = if value.is_finite() {
                CompactFormatter.$write(self.out, value)
            } else {
                CompactFormatter.write_null(self.out)
            };
            Ok(())
        }
    )*};
}

/// Calls `$write_methods!` with every integer type's serializer method and the formatter's
/// method that writes it.
macro_rules! every_integer {
    ($write_methods:ident) => {
        $write_methods!(
            serialize_i8: i8 => write_i8,
            serialize_i16: i16 => write_i16,
            serialize_i32: i32 => write_i32,
            serialize_i64: i64 => write_i64,
            serialize_i128: i128 => write_i128,
            serialize_u8: u8 => write_u8,
            serialize_u16: u16 => write_u16,
            serialize_u32: u32 => write_u32,
            serialize_u64: u64 => write_u64,
            serialize_u128: u128 => write_u128
        );
    };
}

/// Integers, written by serde_json's formatter.
macro_rules! numbers {
    ($($method:ident: $type:ty => $write:ident),*) => {$(
        fn $method(self, value: $type) -> Done {
            // Writing to a Vec cannot fail.
            let _ = CompactFormatter.$write(self.out, value);
            Ok(())
        }
    )*};
}

impl<'w, 'o> ser::Serializer for &'w mut Writer<'o> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Compound<'w, 'o>;
    type SerializeTuple = Compound<'w, 'o>;
    type SerializeTupleStruct = Compound<'w, 'o>;
    type SerializeTupleVariant = Compound<'w, 'o>;
    type SerializeMap = Compound<'w, 'o>;
    type SerializeStruct = Compound<'w, 'o>;
    type SerializeStructVariant = Compound<'w, 'o>;

    fn serialize_bool(self, value: bool) -> Done {
        self.out.extend_from_slice(if value { b"true" } else { b"false" });
        Ok(())
    }

    every_integer!(numbers);

    floats!(serialize_f32: f32 => write_f32, serialize_f64: f64 => write_f64);

    fn serialize_char(self, value: char) -> Done {
        write_str(self.out, value.encode_utf8(&mut [0; 4]));
        Ok(())
    }

    fn serialize_str(self, value: &str) -> Done {
        write_str(self.out, value);
        Ok(())
    }

    fn serialize_bytes(self, value: &[u8]) -> Done {
        let _ = CompactFormatter.write_byte_array(self.out, value);
        Ok(())
    }

    fn serialize_none(self) -> Done {
        self.serialize_unit()
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Done {
        value.serialize(self)
    }

    fn serialize_unit(self) -> Done {
        self.out.extend_from_slice(b"null");
        Ok(())
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Done {
        self.serialize_unit()
    }

    fn serialize_unit_variant(self, _name: &'static str, _index: u32, variant: &'static str) -> Done {
        self.serialize_str(variant)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _name: &'static str, value: &T) -> Done {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Done {
        self.variant_key(variant);
        value.serialize(&mut *self)?;
        self.out.push(b'}');
        Ok(())
    }

    fn serialize_seq(self, _len: Option<usize>) -> Result<Compound<'w, 'o>, Error> {
        Ok(self.compound(b'[', b"]"))
    }

    fn serialize_tuple(self, len: usize) -> Result<Compound<'w, 'o>, Error> {
        self.serialize_seq(Some(len))
    }

    fn serialize_tuple_struct(self, _name: &'static str, len: usize) -> Result<Compound<'w, 'o>, Error> {
        self.serialize_seq(Some(len))
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Compound<'w, 'o>, Error> {
        self.variant_key(variant);
        Ok(self.compound(b'[', b"]}"))
    }

    fn serialize_map(self, _len: Option<usize>) -> Result<Compound<'w, 'o>, Error> {
        Ok(self.compound(b'{', b"}"))
    }

    fn serialize_struct(self, name: &'static str, len: usize) -> Result<Compound<'w, 'o>, Error> {
        if name == RAW_VALUE {
            return Ok(Compound { writer: self, first: true, close: b"", raw: true });
        }
        self.serialize_map(Some(len))
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Compound<'w, 'o>, Error> {
        self.variant_key(variant);
        Ok(self.compound(b'{', b"}}"))
    }
}

impl ser::SerializeSeq for Compound<'_, '_> {
    type Ok = ();
    type Error = Error;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Done {
        self.separate();
        value.serialize(&mut *self.writer)
    }

    fn end(self) -> Done {
        self.finish()
    }
}

impl ser::SerializeMap for Compound<'_, '_> {
    type Ok = ();
    type Error = Error;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Done {
        self.separate();
        key.serialize(Key { out: self.writer.out, raw: false })
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Done {
        self.member_value(value)
    }

    fn end(self) -> Done {
        self.finish()
    }
}

impl ser::SerializeStruct for Compound<'_, '_> {
    type Ok = ();
    type Error = Error;

    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Done {
        if self.raw {
            return value.serialize(Key { out: self.writer.out, raw: true });
        }
        self.field_name(key);
        value.serialize(&mut *self.writer)
    }

    fn end(self) -> Done {
        self.finish()
    }
}

/// Tuples of every kind are written as sequences, struct variants' fields as a struct's.
macro_rules! written_as {
    ($($kind:ident::$method:ident($($key:ident: $type:ty)?) => $target:ident::$to:ident),*) => {$(
        impl ser::$kind for Compound<'_, '_> {
            type Ok = ();
            type Error = Error;

            fn $method<T: Serialize + ?Sized>(&mut self, $($key: $type,)? value: &T) -> Done {
                ser::$target::$to(self, $($key,)? value)
            }

            fn end(self) -> Done {
                self.finish()
            }
        }
    )*};
}

written_as!(
    SerializeTuple::serialize_element() => SerializeSeq::serialize_element,
    SerializeTupleStruct::serialize_field() => SerializeSeq::serialize_element,
    SerializeTupleVariant::serialize_field() => SerializeSeq::serialize_element,
    SerializeStructVariant::serialize_field(key: &'static str) => SerializeStruct::serialize_field
);

/// A map key: strings, and integers quoted as serde_json quotes them; anything else is an
/// error (serde_json then decides). With `raw`, a raw value's text, copied as it is.
struct Key<'o> {
    out: &'o mut Vec<u8>,
    raw: bool,
}

impl Key<'_> {
    fn quoted(self, write: impl FnOnce(&mut Vec<u8>) -> std::io::Result<()>) -> Done {
        if self.raw {
            return Err(Error("a raw value's text is not a string".to_string()));
        }
        self.out.push(b'"');
        let _ = write(self.out);
        self.out.push(b'"');
        Ok(())
    }
}

fn unsupported_key() -> Error {
    Error("map key is not a string or an integer".to_string())
}

/// Integer keys, quoted as serde_json quotes them.
macro_rules! quoted_integers {
    ($($method:ident: $type:ty => $write:ident),*) => {$(
        fn $method(self, value: $type) -> Done {
            self.quoted(|out| CompactFormatter.$write(out, value))
        }
    )*};
}

/// Keys serde_json may write differently (booleans, floats) or not at all.
macro_rules! refused_keys {
    ($($method:ident: $type:ty),*) => {$(
        fn $method(self, _: $type) -> Done {
            Err(unsupported_key())
        }
    )*};
}

impl ser::Serializer for Key<'_> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Impossible<(), Error>;
    type SerializeTuple = Impossible<(), Error>;
    type SerializeTupleStruct = Impossible<(), Error>;
    type SerializeTupleVariant = Impossible<(), Error>;
    type SerializeMap = Impossible<(), Error>;
    type SerializeStruct = Impossible<(), Error>;
    type SerializeStructVariant = Impossible<(), Error>;

    fn serialize_str(self, value: &str) -> Done {
        if self.raw {
            self.out.extend_from_slice(value.as_bytes());
        } else {
            write_str(self.out, value);
        }
        Ok(())
    }

    fn serialize_char(self, value: char) -> Done {
        self.serialize_str(value.encode_utf8(&mut [0; 4]))
    }

    fn serialize_unit_variant(self, _name: &'static str, _index: u32, variant: &'static str) -> Done {
        self.serialize_str(variant)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _name: &'static str, value: &T) -> Done {
        value.serialize(self)
    }

    every_integer!(quoted_integers);

    refused_keys!(serialize_bool: bool, serialize_f32: f32, serialize_f64: f64, serialize_bytes: &[u8]);

    fn serialize_none(self) -> Done {
        Err(unsupported_key())
    }

    fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Done {
        Err(unsupported_key())
    }

    fn serialize_unit(self) -> Done {
        Err(unsupported_key())
    }

    fn serialize_unit_struct(self, _: &'static str) -> Done {
        Err(unsupported_key())
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(self, _: &'static str, _: u32, _: &'static str, _: &T) -> Done {
        Err(unsupported_key())
    }

    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, Error> {
        Err(unsupported_key())
    }

    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Error> {
        Err(unsupported_key())
    }

    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeTupleStruct, Error> {
        Err(unsupported_key())
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, Error> {
        Err(unsupported_key())
    }

    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, Error> {
        Err(unsupported_key())
    }

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, Error> {
        Err(unsupported_key())
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, Error> {
        Err(unsupported_key())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;

    fn ours<T: Serialize + ?Sized>(value: &T) -> String {
        let mut out = Vec::new();
        write(&mut out, value).expect("writes");
        String::from_utf8(out).expect("UTF-8")
    }

    #[test]
    fn strings_are_escaped_as_serde_json_escapes_them_wherever_the_byte_falls() {
        let specials = ['"', '\\', '\n', '\r', '\t', '\u{8}', '\u{c}', '\0', '\u{1f}', '\u{7f}', 'é', '€', '😀'];
        // Every special character at every offset of strings of every length up to 40 bytes,
        // so that each falls in the word loop, at each place in a word, and in the tail.
        for length in 0..40 {
            for offset in 0..length.max(1) {
                for special in specials {
                    let mut text: String = (0..length).map(|index| (b'a' + (index % 26) as u8) as char).collect();
                    if length > 0 {
                        text.replace_range(offset..offset + 1, &special.to_string());
                    }
                    assert_eq!(ours(&text), serde_json::to_string(&text).expect("serializes"), "{text:?}");
                }
            }
        }
        // Bytes just either side of what needs escaping, and all of them at once.
        let all: String = (0u8..0x80).map(char::from).collect();
        assert_eq!(ours(&all), serde_json::to_string(&all).expect("serializes"));
        let near = "\u{1f} !#[\\]\"\u{20}\u{21}";
        assert_eq!(ours(near), serde_json::to_string(near).expect("serializes"));
    }

    #[derive(Serialize)]
    enum Shape {
        Unit,
        Newtype(i32),
        Tuple(i32, &'static str),
        Struct { a: Option<u8>, b: Vec<f64> },
    }

    #[derive(Serialize)]
    struct Everything {
        yes: bool,
        small: i8,
        big: u128,
        negative: i128,
        ratio: f64,
        single: f32,
        nan: f64,
        infinite: f32,
        letter: char,
        bytes: serde_bytes_like::Bytes,
        nothing: Option<String>,
        unit: (),
        shapes: Vec<Shape>,
        tuple: (u8, &'static str),
        keyed: BTreeMap<i64, &'static str>,
        named: BTreeMap<&'static str, Vec<u32>>,
        value: serde_json::Value,
    }

    mod serde_bytes_like {
        /// Serialized with `serialize_bytes`.
        pub struct Bytes(pub &'static [u8]);

        impl serde::Serialize for Bytes {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_bytes(self.0)
            }
        }
    }

    #[test]
    fn every_kind_of_value_is_written_as_serde_json_writes_it() {
        let value = Everything {
            yes: true,
            small: -8,
            big: u128::MAX,
            negative: i128::MIN,
            ratio: 0.1 + 0.2,
            single: 1.5e-7,
            nan: f64::NAN,
            infinite: f32::INFINITY,
            letter: '"',
            bytes: serde_bytes_like::Bytes(&[0, 255, 7]),
            nothing: None,
            unit: (),
            shapes: vec![
                Shape::Unit,
                Shape::Newtype(-1),
                Shape::Tuple(2, "t"),
                Shape::Struct { a: Some(3), b: vec![] },
            ],
            tuple: (9, "x\ny"),
            keyed: BTreeMap::from([(-5, "minus"), (7, "seven")]),
            named: BTreeMap::from([("k\"ey", vec![1, 2]), ("empty", vec![])]),
            value: json!({"nested": [1, "two", null, {"three": 3.25}], "ok": false}),
        };
        assert_eq!(ours(&value), serde_json::to_string(&value).expect("serializes"));
    }

    #[test]
    fn raw_values_are_copied_as_serde_json_copies_them() {
        let raw = serde_json::value::RawValue::from_string(r#"{ "a" : [1, "\u0041"] }"#.to_string()).expect("raw");
        let wrapped = json!({"before": 1});
        let value = (wrapped, &raw, vec![&raw]);
        assert_eq!(ours(&value), serde_json::to_string(&value).expect("serializes"));
    }

    #[test]
    fn keys_serde_json_may_take_differently_are_an_error() {
        let bool_keys = BTreeMap::from([(true, 1)]);
        assert!(write(&mut Vec::new(), &bool_keys).is_err());
    }
}
