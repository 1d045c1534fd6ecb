//! The `Idempotency-Key` request header (contract/contract.json's `key_header`): exactly one
//! field line holding an RFC 8941 sf-string (`"..."`, the form of
//! draft-ietf-httpapi-idempotency-key-header, parsed with the `sfv` crate in strict RFC 8941
//! mode) or, as Stripe-style clients send it, a bare value of RFC 9110 token characters (plus
//! `:` and `/`, an sf-token's, as the Go and Java packages take them): a bare UUID or `k-1001`.
//! A bare value names the same key as the quoted string with the same characters. A bare value
//! with a space, comma, quote or semicolon, parameters, and other item types are refused. The
//! key is 1 to 255 characters, the extension's own limit.

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
    let trimmed = raw.trim_ascii();
    let key = if trimmed.starts_with(b"\"") {
        let item: Item = Parser::new(trimmed)
            .with_version(Version::Rfc8941)
            .parse()
            .map_err(|e| KeyError::Malformed(format!("not an RFC 8941 sf-string ({e})")))?;
        if !item.params.is_empty() {
            return Err(malformed("parameters are not accepted"));
        }
        match &item.bare_item {
            BareItem::String(s) => s.as_str().to_owned(),
            _ => return Err(malformed("it must be one quoted string")),
        }
    } else if trimmed.iter().all(|&b| is_bare_char(b)) {
        String::from_utf8(trimmed.to_vec()).expect("ASCII")
    } else {
        return Err(malformed("a bare value may hold token characters only; quote it: \"...\""));
    };
    if key.is_empty() {
        return Err(malformed("it is empty"));
    }
    if key.len() > MAX_KEY_CHARS {
        return Err(KeyError::Malformed(format!("it is longer than {MAX_KEY_CHARS} characters")));
    }
    Ok(key)
}

/// RFC 9110 `tchar`, plus `:` and `/` (an RFC 8941 sf-token's extra characters).
fn is_bare_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::{parse, KeyError};

    fn one(v: &str) -> Result<String, KeyError> {
        parse(&[v.as_bytes()])
    }

    #[test]
    fn accepts_quoted_strings_and_bare_tokens() {
        assert_eq!(one("\"8e03978e-40d5\"").unwrap(), "8e03978e-40d5");
        assert_eq!(one("  \"a b\" ").unwrap(), "a b");
        assert_eq!(one(r#""a\"b\\c""#).unwrap(), r#"a"b\c"#);
        assert_eq!(one("tok-1:a/b").unwrap(), "tok-1:a/b");
        assert_eq!(
            one("8e03978e-40d5-4b0f-b269-aae953a2b418").unwrap(),
            "8e03978e-40d5-4b0f-b269-aae953a2b418"
        );
        assert_eq!(one(" k-1001\t").unwrap(), "k-1001");
        assert_eq!(one("42").unwrap(), "42");
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
            "a;b",
            "a\"b",
            "(a)",
            "\"a\tb\"",
            "\"a\x01b\"",
            "a\x7fb",
            "\"caf\u{e9}\"",
            "?1",
            "@1",
            "\"a\", \"b\"",
        ] {
            assert!(matches!(one(bad), Err(KeyError::Malformed(_))), "{bad:?} was accepted: {:?}", one(bad));
        }
        assert!(one(&"k".repeat(256)).is_err());
        assert!(one(&format!("\"{}\"", "k".repeat(256))).is_err());
    }
}
