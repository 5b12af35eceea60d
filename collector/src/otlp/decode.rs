//! Request bodies to OTLP messages: content type, content encoding, size bounds.

use std::io::Read;

use flate2::read::{GzDecoder, ZlibDecoder};
use prost::Message;
use serde::de::DeserializeOwned;

use crate::error::DecodeError;

/// How an OTLP/HTTP body is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Protobuf,
    Json,
}

impl Encoding {
    /// From a `Content-Type` header; parameters such as `charset` are ignored.
    pub fn from_content_type(content_type: Option<&str>) -> Result<Self, DecodeError> {
        let Some(content_type) = content_type else {
            return Err(DecodeError::UnsupportedContentType("none".to_string()));
        };
        let media_type = content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
        match media_type.as_str() {
            "application/x-protobuf" | "application/protobuf" => Ok(Self::Protobuf),
            "application/json" => Ok(Self::Json),
            _ => Err(DecodeError::UnsupportedContentType(content_type.to_string())),
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Self::Protobuf => "application/x-protobuf",
            Self::Json => "application/json",
        }
    }
}

/// Undoes `Content-Encoding`, never producing more than `limit` bytes (so that a small gzip
/// bomb cannot exhaust memory): gzip (what OTLP/HTTP names), zstd (the Collector's exporters'
/// other choice) and deflate (zlib, as HTTP means it: the Python SDK's other choice).
pub fn decompress(body: &[u8], content_encoding: Option<&str>, limit: usize) -> Result<Vec<u8>, DecodeError> {
    let encoding = content_encoding.unwrap_or("identity").trim().to_ascii_lowercase();
    match encoding.as_str() {
        "" | "identity" => {
            if body.len() > limit {
                return Err(DecodeError::TooLarge { limit });
            }
            Ok(body.to_vec())
        }
        "gzip" | "x-gzip" => gunzip(body, limit),
        "zstd" => unzstd(body, limit),
        "deflate" => inflate(ZlibDecoder::new(body), body.len(), limit, DecodeError::Deflate),
        other => Err(DecodeError::UnsupportedContentEncoding(other.to_string())),
    }
}

/// Gunzips at most `limit` bytes.
pub fn gunzip(body: &[u8], limit: usize) -> Result<Vec<u8>, DecodeError> {
    inflate(GzDecoder::new(body), body.len(), limit, DecodeError::Gzip)
}

/// Inflates a zstd body, at most `limit` bytes.
pub fn unzstd(body: &[u8], limit: usize) -> Result<Vec<u8>, DecodeError> {
    let decoder =
        zstd::stream::read::Decoder::with_buffer(body).map_err(|error| DecodeError::Zstd(error.to_string()))?;
    inflate(decoder, body.len(), limit, DecodeError::Zstd)
}

/// Reads what `decoder` inflates `compressed` bytes to, up to `limit` bytes (more is
/// [`DecodeError::TooLarge`]); a decoding error is `invalid`'s.
fn inflate(
    decoder: impl Read,
    compressed: usize,
    limit: usize,
    invalid: fn(String) -> DecodeError,
) -> Result<Vec<u8>, DecodeError> {
    let mut output = Vec::with_capacity(compressed.saturating_mul(4).min(limit));
    decoder.take(limit as u64 + 1).read_to_end(&mut output).map_err(|error| invalid(error.to_string()))?;
    if output.len() > limit {
        return Err(DecodeError::TooLarge { limit });
    }
    Ok(output)
}

/// Decodes one OTLP message in the given encoding. JSON follows the OTLP/JSON mapping (hex
/// ids, 64-bit integers as strings or numbers, enums as integers).
pub fn decode_message<T>(bytes: &[u8], encoding: Encoding) -> Result<T, DecodeError>
where
    T: Message + Default + DeserializeOwned,
{
    match encoding {
        Encoding::Protobuf => T::decode(bytes).map_err(|error| DecodeError::Protobuf(error.to_string())),
        Encoding::Json => serde_json::from_slice(bytes).map_err(|error| DecodeError::Json(error.to_string())),
    }
}
