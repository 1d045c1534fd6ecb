//! The `Idempotency-Key` request header (draft-ietf-httpapi-idempotency-key-header): an RFC 8941
//! Item whose value is an sf-string, parsed with the `sfv` crate (strict RFC 8941 mode).
//!
//! A bare sf-token (`Idempotency-Key: tok-1:a/b`) is accepted as well and names the same key as
//! the quoted string with the same characters: many clients send the value unquoted. A bare
//! value that is not an sf-token (for example a UUID starting with a digit, which RFC 8941 reads
//! as a number) is refused: send it quoted. Parameters are refused. The key is 1 to 255
//! characters, the extension's own limit.

use sfv::{BareItem, Item, Parser, Version};

/// Longest key accepted, in characters (the extension refuses longer keys with 22023).
pub const MAX_KEY_CHARS: usize = 255;

/// Why a request's `Idempotency-Key` was refused (the 400 problem's detail).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    Missing,
    Repeated,
    Malformed(String),
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyError::Missing => write!(f, "the request has no Idempotency-Key header"),
            KeyError::Repeated => write!(f, "the Idempotency-Key header must appear once"),
            KeyError::Malformed(why) => write!(f, "the Idempotency-Key is malformed: {why}"),
        }
    }
}

/// `values`: the raw values of every `Idempotency-Key` field line of the request.
pub fn parse(values: &[&[u8]]) -> Result<String, KeyError> {
    let raw = match values {
        [] => return Err(KeyError::Missing),
        [one] => *one,
        _ => return Err(KeyError::Repeated),
    };
    let malformed = |why: &str| KeyError::Malformed(why.to_owned());
    if raw.iter().any(|&b| !(0x20..0x7f).contains(&b) && b != b'\t') {
        return Err(malformed("it holds a control or non-ASCII character"));
    }
    let item: Item = Parser::new(raw)
        .with_version(Version::Rfc8941)
        .parse()
        .map_err(|e| KeyError::Malformed(format!("not an RFC 8941 sf-string ({e})")))?;
    if !item.params.is_empty() {
        return Err(malformed("parameters are not accepted"));
    }
    let key = match &item.bare_item {
        BareItem::String(s) => s.as_str().to_owned(),
        BareItem::Token(t) => t.as_str().to_owned(),
        _ => return Err(malformed("it must be a quoted string")),
    };
    if key.is_empty() {
        return Err(malformed("it is empty"));
    }
    if key.len() > MAX_KEY_CHARS {
        return Err(KeyError::Malformed(format!("it is longer than {MAX_KEY_CHARS} characters")));
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::{parse, KeyError};

    fn one(v: &str) -> Result<String, KeyError> {
        parse(&[v.as_bytes()])
    }

    #[test]
    fn accepts_quoted_strings_and_tokens() {
        assert_eq!(one("\"8e03978e-40d5\"").unwrap(), "8e03978e-40d5");
        assert_eq!(one("  \"a b\" ").unwrap(), "a b");
        assert_eq!(one(r#""a\"b\\c""#).unwrap(), r#"a"b\c"#);
        assert_eq!(one("tok-1:a/b").unwrap(), "tok-1:a/b");
        assert_eq!(one(&"k".repeat(255)).unwrap().len(), 255);
        assert_eq!(one(&format!("\"{}\"", "k".repeat(255))).unwrap().len(), 255);
    }

    #[test]
    fn refuses_missing_repeated_and_malformed() {
        assert_eq!(parse(&[]), Err(KeyError::Missing));
        assert_eq!(parse(&[b"\"a\"", b"\"b\""]), Err(KeyError::Repeated));
        for bad in [
            "",
            "  ",
            "\"\"",
            "\"abc",
            "\"a\"b",
            "\"a\";p=1",
            "tok;p=1",
            "\"a\\nb\"",
            "a b",
            "a,b",
            "\"a\tb\"",
            "\"a\x01b\"",
            "a\x7fb",
            "\"caf\u{e9}\"",
            "42",
            "1.5",
            "?1",
            ":YWJj:",
            "8e03978e-40d5",
        ] {
            assert!(matches!(one(bad), Err(KeyError::Malformed(_))), "{bad:?} was accepted: {:?}", one(bad));
        }
        assert!(one(&"k".repeat(256)).is_err());
        assert!(one(&format!("\"{}\"", "k".repeat(256))).is_err());
    }
}
