//! RFC 8785 (JSON Canonicalization Scheme): canonical JSON and its SHA-256 fingerprint.
//! Pure Rust: nothing here calls into the server.
//!
//! - `writer`: the one output path. `Writer` takes canonical pieces (punctuation, strings,
//!   numbers) and hashes them as they come; `write_tree` walks any value in canonical order,
//!   without recursion, and writes it.
//! - `number`: numbers as ECMAScript's Number.prototype.toString writes them.
//! - `binary`: a jsonb value read from its binary form. This is idem_fingerprint's path.
//! - `text`: a parser of JSON text. Only needed in a database whose encoding is not UTF-8
//!   (see `crate::jsonb::Jsonb::fingerprint`) and as the tests' oracle.

mod binary;
mod number;
mod text;
mod writer;

use std::fmt;

pub use binary::write_jsonb;
#[cfg(any(test, feature = "pg_test"))]
pub use text::canonicalize;
pub use text::fingerprint_json;
pub use writer::{sha256_tagged, Writer};

/// Deepest nesting of arrays and objects accepted.
pub const MAX_DEPTH: usize = 1000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CanonError {
    /// The text is not valid JSON (position is a byte offset), e.g. trailing garbage.
    Syntax { position: usize, what: &'static str },
    /// A number outside the IEEE 754 double range (e.g. 1e400): RFC 8785 cannot represent it.
    NumberOutOfRange(String),
    /// Nesting deeper than MAX_DEPTH.
    TooDeep,
    /// A jsonb value whose binary form does not hold together (never from PostgreSQL).
    CorruptJsonb,
}

impl fmt::Display for CanonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CanonError::Syntax { position, what } => {
                write!(f, "invalid json at byte {position}: {what}")
            }
            CanonError::NumberOutOfRange(text) if text.len() > 40 => {
                write!(f, "number out of range for RFC 8785: {}...", &text[..40])
            }
            CanonError::NumberOutOfRange(text) => {
                write!(f, "number out of range for RFC 8785: {text}")
            }
            CanonError::TooDeep => write!(f, "json nested deeper than {MAX_DEPTH} levels"),
            CanonError::CorruptJsonb => write!(f, "the jsonb value is corrupt"),
        }
    }
}

impl std::error::Error for CanonError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_messages() {
        let e = CanonError::Syntax { position: 3, what: "unexpected character" };
        assert_eq!(e.to_string(), "invalid json at byte 3: unexpected character");
        assert_eq!(
            CanonError::NumberOutOfRange("1e400".into()).to_string(),
            "number out of range for RFC 8785: 1e400"
        );
        assert_eq!(CanonError::TooDeep.to_string(), "json nested deeper than 1000 levels");
    }
}
