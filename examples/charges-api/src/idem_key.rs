//! Parsing the `Idempotency-Key` request header
//! (draft-ietf-httpapi-idempotency-key-header-07, section 2.1).
//!
//! The draft makes the field an RFC 8941 Item whose value is an sf-string:
//! `Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"`. Most clients in the wild send
//! the value bare, so a bare token is accepted as well and means the same key as the quoted
//! string with the same characters. Rules:
//!
//! - exactly one `Idempotency-Key` field line;
//! - quoted: `"` then printable ASCII (0x20-0x7E) with `\"` and `\\` as the only escapes,
//!   then `"` and nothing after it (parameters are not accepted);
//! - bare: one or more token characters (RFC 9110 `tchar`) or `:` `/`. RFC 8941's sf-token
//!   must start with a letter or `*`; a leading digit is accepted here, for bare UUIDs;
//! - the key (after unquoting) is 1 to 255 characters, the extension's own limit.

/// Longest key accepted, in characters (the extension refuses longer keys with 22023).
pub const MAX_KEY_CHARS: usize = 255;

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// `values`: the raw values of every `Idempotency-Key` field line in the request.
/// Returns the key, or the reason it is refused (for the 400 problem's `detail`).
pub fn parse(values: &[&[u8]]) -> Result<String, String> {
    let raw = match values {
        [] => return Err("the request has no Idempotency-Key header".into()),
        [one] => *one,
        _ => return Err("the Idempotency-Key header must appear once".into()),
    };
    let raw = raw.trim_ascii();
    if raw.is_empty() {
        return Err("the Idempotency-Key header is empty".into());
    }
    let key = if raw[0] == b'"' {
        let mut key = Vec::with_capacity(raw.len());
        let mut i = 1;
        loop {
            let Some(&b) = raw.get(i) else {
                return Err("the quoted Idempotency-Key has no closing quote".into());
            };
            match b {
                b'\\' => match raw.get(i + 1) {
                    Some(&e @ (b'"' | b'\\')) => {
                        key.push(e);
                        i += 2;
                    }
                    _ => {
                        return Err(
                            "only \\\" and \\\\ may be escaped in a quoted Idempotency-Key".into(),
                        )
                    }
                },
                b'"' => {
                    if i + 1 != raw.len() {
                        return Err("unexpected characters after the quoted Idempotency-Key (parameters are not accepted)".into());
                    }
                    break;
                }
                0x20..=0x7e => {
                    key.push(b);
                    i += 1;
                }
                _ => {
                    return Err("the Idempotency-Key holds a control or non-ASCII character".into())
                }
            }
        }
        key
    } else {
        if let Some(&b) = raw
            .iter()
            .find(|&&b| !(is_tchar(b) || b == b':' || b == b'/'))
        {
            return Err(if b < 0x20 || b >= 0x7f {
                "the Idempotency-Key holds a control or non-ASCII character".into()
            } else {
                format!(
                    "a bare Idempotency-Key may not hold {:?}; send it as a quoted string",
                    b as char
                )
            });
        }
        raw.to_vec()
    };
    if key.is_empty() {
        return Err("the Idempotency-Key is empty".into());
    }
    if key.len() > MAX_KEY_CHARS {
        return Err(format!(
            "the Idempotency-Key is longer than {MAX_KEY_CHARS} characters"
        ));
    }
    // Only printable ASCII got this far.
    Ok(String::from_utf8(key).expect("ASCII"))
}

#[cfg(test)]
mod tests {
    use super::parse;

    fn one(v: &str) -> Result<String, String> {
        parse(&[v.as_bytes()])
    }

    #[test]
    fn accepts_quoted_and_bare() {
        assert_eq!(one("\"8e03978e-40d5\"").unwrap(), "8e03978e-40d5");
        assert_eq!(one("8e03978e-40d5").unwrap(), "8e03978e-40d5");
        assert_eq!(one("  \"a b\" ").unwrap(), "a b");
        assert_eq!(one(r#""a\"b\\c""#).unwrap(), r#"a"b\c"#);
        assert_eq!(one("acct:42/x").unwrap(), "acct:42/x");
        assert_eq!(one(&"k".repeat(255)).unwrap().len(), 255);
    }

    #[test]
    fn refuses_malformed() {
        assert!(parse(&[]).is_err());
        assert!(parse(&[b"a", b"b"]).is_err());
        for bad in [
            "",
            "  ",
            "\"\"",
            "\"abc",
            "\"a\"b",
            "\"a\";p=1",
            "\"a\\nb\"",
            "a b",
            "a,b",
            "a\tb",
            "\"a\tb\"",
            "\"a\x01b\"",
            "a\x7fb",
            "\"caf\u{e9}\"",
        ] {
            assert!(one(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(one(&"k".repeat(256)).is_err());
        assert!(one(&format!("\"{}\"", "k".repeat(256))).is_err());
    }
}
