use thiserror::Error;

/// Why a request body could not be read. Every variant names what was wrong.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum DecodeError {
    #[error("unsupported content type {0:?}: send application/x-protobuf or application/json")]
    UnsupportedContentType(String),
    #[error("unsupported content encoding {0:?}: send gzip, zstd, deflate or identity")]
    UnsupportedContentEncoding(String),
    #[error("body exceeds the limit of {limit} bytes (after decompression)")]
    TooLarge { limit: usize },
    #[error("invalid gzip body: {0}")]
    Gzip(String),
    #[error("invalid zstd body: {0}")]
    Zstd(String),
    #[error("invalid deflate body: {0}")]
    Deflate(String),
    #[error("invalid protobuf body: {0}")]
    Protobuf(String),
    #[error("invalid OTLP JSON body: {0}")]
    Json(String),
}
