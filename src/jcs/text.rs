//! A parser of JSON text, for the canonical form of a text (`canonicalize`) and its
//! fingerprint (`fingerprint_json`).
//!
//! Not on idem_fingerprint's usual path, which reads jsonb's binary form (`binary`): this is
//! only needed in a database whose encoding is not UTF-8 (jsonb's strings are then not
//! UTF-8, so the value goes through its text form) and as the tests' oracle.
//!
//! The parser works bottom-up with an explicit stack, so it does not recurse. Work is linear
//! in the size of the input: every scalar is written to its canonical text once, into one
//! shared buffer; a finished container keeps its elements (moved, never copied) so that an
//! object's members can be sorted by key; and `write_tree` writes the whole canonical text
//! once at the end. No value's text is copied again for each container around it.

use super::number::write_number;
use super::writer::{sort_members, write_string, write_tree, Tree, Visit, Writer};
use super::{CanonError, MAX_DEPTH};

/// RFC 8785 (JCS) canonical form of a JSON text. `ignore`: top-level object keys left out
/// (ignored when the top-level value is not an object). The tests' oracle.
#[cfg(any(test, feature = "pg_test"))]
pub fn canonicalize(json: &str, ignore: &[&str]) -> Result<String, CanonError> {
    let (root, scalars) = parse(json, ignore)?;
    let mut w = Writer::keeping();
    write_tree(&mut Parsed { scalars: &scalars }, root, &mut w)?;
    Ok(w.text())
}

/// sha256_tagged(canonicalize(json, ignore)?.as_bytes()), without holding the text.
pub fn fingerprint_json(json: &str, ignore: &[&str]) -> Result<String, CanonError> {
    let (root, scalars) = parse(json, ignore)?;
    let mut w = Writer::hashing();
    write_tree(&mut Parsed { scalars: &scalars }, root, &mut w)?;
    Ok(w.fingerprint())
}

/// Reads the whole text: its value in canonical order, and the canonical text of its
/// scalars, one after the other, which the value points into.
fn parse(json: &str, ignore: &[&str]) -> Result<(Value, String), CanonError> {
    let mut p = Parser { text: json, pos: 0 };
    // The canonical text of every scalar read, one after the other; values point into it.
    let mut scalars = String::new();
    let mut stack: Vec<Frame> = Vec::new();
    loop {
        // Read one value. An opened non-empty container becomes a frame and we go
        // round again for its first element.
        p.skip_ws();
        let start = scalars.len();
        let mut value = match p.peek() {
            Some(open @ (b'[' | b'{')) => {
                if stack.len() >= MAX_DEPTH {
                    return Err(CanonError::TooDeep);
                }
                p.pos += 1;
                p.skip_ws();
                if open == b'[' {
                    if p.eat(b']') {
                        Value::Array(Vec::new())
                    } else {
                        stack.push(Frame::Array(Vec::new()));
                        continue;
                    }
                } else if p.eat(b'}') {
                    Value::Object(Vec::new())
                } else {
                    let key = p.member_key()?;
                    stack.push(Frame::Object { members: Vec::new(), key });
                    continue;
                }
            }
            Some(b'"') => {
                let s = p.string()?;
                write_string(&s, &mut scalars);
                Value::Text(start, scalars.len())
            }
            Some(b'-' | b'0'..=b'9') => {
                write_number(p.number()?, &mut scalars);
                Value::Text(start, scalars.len())
            }
            Some(b't') => p.literal("true", &mut scalars)?,
            Some(b'f') => p.literal("false", &mut scalars)?,
            Some(b'n') => p.literal("null", &mut scalars)?,
            Some(_) => return Err(p.error("unexpected character")),
            None => return Err(p.error("unexpected end of input")),
        };

        // Hand the finished value to its container; each container that closes
        // becomes in turn the finished value for the one around it.
        loop {
            let Some(frame) = stack.pop() else {
                p.skip_ws();
                if p.pos < p.text.len() {
                    return Err(p.error("trailing characters after json value"));
                }
                return Ok((value, scalars));
            };
            p.skip_ws();
            match frame {
                Frame::Array(mut items) => {
                    items.push(value);
                    if p.eat(b',') {
                        stack.push(Frame::Array(items));
                        break;
                    } else if p.eat(b']') {
                        value = Value::Array(items);
                    } else {
                        return Err(p.error("expected ',' or ']'"));
                    }
                }
                Frame::Object { mut members, key } => {
                    members.push((key, value));
                    if p.eat(b',') {
                        let key = p.member_key()?;
                        stack.push(Frame::Object { members, key });
                        break;
                    } else if p.eat(b'}') {
                        let dropped = if stack.is_empty() { ignore } else { &[] };
                        value = Value::Object(sorted_members(members, dropped));
                    } else {
                        return Err(p.error("expected ',' or '}'"));
                    }
                }
            }
        }
    }
}

/// A parsed value, for `write_tree`.
struct Parsed<'s> {
    scalars: &'s str,
}

type Elements = std::iter::Map<std::vec::IntoIter<Value>, fn(Value) -> Result<Value, CanonError>>;

impl Tree for Parsed<'_> {
    type Node = Value;
    type Key = String;
    type Elements = Elements;

    fn visit(
        &mut self,
        node: Value,
        _depth: usize,
        w: &mut Writer,
    ) -> Result<Visit<Elements, String, Value>, CanonError> {
        Ok(match node {
            Value::Text(start, end) => {
                w.raw(&self.scalars[start..end]);
                Visit::Written
            }
            Value::Array(items) => Visit::Array(items.into_iter().map(Ok as fn(Value) -> _)),
            Value::Object(members) => Visit::Object(members),
        })
    }
}

/// A value read completely, in canonical order but not yet written out.
enum Value {
    /// A scalar: its canonical text is `scalars[start..end]`.
    Text(usize, usize),
    Array(Vec<Value>),
    /// Members sorted by key, duplicates and ignored keys already dropped; keys decoded.
    Object(Vec<(String, Value)>),
}

/// A container still being read.
enum Frame {
    Array(Vec<Value>),
    /// `key` is the (decoded) key whose value is being read.
    Object {
        members: Vec<(String, Value)>,
        key: String,
    },
}

/// An object's members in canonical order: without the keys in `ignore`, sorted, and of
/// duplicate keys only the last one read.
fn sorted_members(mut members: Vec<(String, Value)>, ignore: &[&str]) -> Vec<(String, Value)> {
    if !ignore.is_empty() {
        members.retain(|(key, _)| !ignore.contains(&key.as_str()));
    }
    // sort_members is stable, so among duplicate keys the last one read comes last, and
    // that is the one kept.
    sort_members(&mut members);
    // `later` is dropped when it repeats the key of `kept`; its value, read later, moves
    // into `kept` first.
    members.dedup_by(|later, kept| {
        let same = later.0 == kept.0;
        if same {
            std::mem::swap(&mut later.1, &mut kept.1);
        }
        same
    });
    members
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn eat(&mut self, b: u8) -> bool {
        let hit = self.peek() == Some(b);
        if hit {
            self.pos += 1;
        }
        hit
    }

    fn error(&self, what: &'static str) -> CanonError {
        CanonError::Syntax { position: self.pos, what }
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    /// Reads `"key" :` (with any whitespace around) and returns the decoded key.
    fn member_key(&mut self) -> Result<String, CanonError> {
        self.skip_ws();
        if self.peek() != Some(b'"') {
            return Err(self.error("expected string key"));
        }
        let key = self.string()?;
        self.skip_ws();
        if !self.eat(b':') {
            return Err(self.error("expected ':'"));
        }
        Ok(key)
    }

    /// Reads `word` (true, false or null), which is its own canonical text.
    fn literal(&mut self, word: &'static str, out: &mut String) -> Result<Value, CanonError> {
        if !self.text[self.pos..].starts_with(word) {
            return Err(self.error("invalid literal"));
        }
        self.pos += word.len();
        let start = out.len();
        out.push_str(word);
        Ok(Value::Text(start, out.len()))
    }

    /// Consumes one or more ASCII digits; false if there was none.
    fn digits(&mut self) -> bool {
        let start = self.pos;
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
        self.pos > start
    }

    fn number(&mut self) -> Result<f64, CanonError> {
        let start = self.pos;
        self.eat(b'-');
        if !self.eat(b'0') && !self.digits() {
            return Err(self.error("expected digit"));
        }
        if self.eat(b'.') && !self.digits() {
            return Err(self.error("expected digit after '.'"));
        }
        if self.eat(b'e') || self.eat(b'E') {
            let _ = self.eat(b'+') || self.eat(b'-');
            if !self.digits() {
                return Err(self.error("expected digit in exponent"));
            }
        }
        let text = &self.text[start..self.pos];
        let x: f64 =
            text.parse().map_err(|_| CanonError::Syntax { position: start, what: "invalid number" })?;
        if x.is_infinite() {
            return Err(CanonError::NumberOutOfRange(text.to_string()));
        }
        Ok(x)
    }

    /// Reads a string literal starting at its opening quote and returns its value.
    fn string(&mut self) -> Result<String, CanonError> {
        self.pos += 1; // opening quote
        let mut out = String::new();
        loop {
            // Copy the run of ordinary characters up to the next quote, backslash or
            // control character; those are all ASCII, so the slice is on char boundaries.
            let start = self.pos;
            while let Some(b) = self.peek() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            out.push_str(&self.text[start..self.pos]);
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.pos += 1;
                    out.push(self.escape()?);
                }
                Some(_) => return Err(self.error("control character in string")),
                None => return Err(self.error("unterminated string")),
            }
        }
    }

    /// Decodes the escape after a backslash.
    fn escape(&mut self) -> Result<char, CanonError> {
        let Some(b) = self.peek() else {
            return Err(self.error("unterminated string"));
        };
        self.pos += 1;
        let c = match b {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => return self.unicode_escape(),
            _ => {
                self.pos -= 1;
                return Err(self.error("invalid escape"));
            }
        };
        Ok(c)
    }

    /// Decodes the XXXX of `\uXXXX`, and the low half if it is a high surrogate.
    fn unicode_escape(&mut self) -> Result<char, CanonError> {
        let start = self.pos - 2;
        let unit = self.hex4()?;
        let code = match unit {
            0xd800..=0xdbff => {
                if !(self.eat(b'\\') && self.eat(b'u')) {
                    return Err(CanonError::Syntax { position: start, what: "unpaired surrogate" });
                }
                let low = self.hex4()?;
                if !(0xdc00..=0xdfff).contains(&low) {
                    return Err(CanonError::Syntax { position: start, what: "unpaired surrogate" });
                }
                0x10000 + ((unit - 0xd800) << 10) + (low - 0xdc00)
            }
            0xdc00..=0xdfff => {
                return Err(CanonError::Syntax { position: start, what: "unpaired surrogate" });
            }
            _ => unit,
        };
        char::from_u32(code).ok_or(CanonError::Syntax { position: start, what: "invalid \\u escape" })
    }

    fn hex4(&mut self) -> Result<u32, CanonError> {
        let mut value = 0;
        for _ in 0..4 {
            let digit = match self.peek() {
                Some(b @ b'0'..=b'9') => b - b'0',
                Some(b @ b'a'..=b'f') => b - b'a' + 10,
                Some(b @ b'A'..=b'F') => b - b'A' + 10,
                _ => return Err(self.error("expected four hex digits after \\u")),
            };
            value = value * 16 + u32::from(digit);
            self.pos += 1;
        }
        Ok(value)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The canonical form of a valid JSON text.
    pub(in crate::jcs) fn canon(json: &str) -> String {
        match canonicalize(json, &[]) {
            Ok(s) => s,
            Err(e) => panic!("canonicalize({json:?}) failed: {e}"),
        }
    }

    fn is_syntax_error(json: &str) -> bool {
        matches!(canonicalize(json, &[]), Err(CanonError::Syntax { .. }))
    }

    #[test]
    fn rfc8785_example_object() {
        let input = r#"{
  "numbers": [333333333.33333329, 1E30, 4.50,
              2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}"#;
        let expected = r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#;
        assert_eq!(canon(input), expected);
    }

    #[test]
    fn rfc8785_sorting_example() {
        let input = r#"{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}"#;
        let expected = concat!(
            "{\"\\r\":\"Carriage Return\",",
            "\"1\":\"One\",",
            "\"\u{80}\":\"Control\",",
            "\"\u{f6}\":\"Latin Small Letter O With Diaeresis\",",
            "\"\u{20ac}\":\"Euro Sign\",",
            "\"\u{1f600}\":\"Emoji: Grinning Face\",",
            "\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}",
        );
        assert_eq!(canon(input), expected);
    }

    #[test]
    fn keys_sort_by_utf16_not_by_char() {
        // U+10000 is D800 DC00 in UTF-16, so it sorts before U+E000 (Rust's str order
        // puts it after).
        assert!("\u{e000}" < "\u{10000}");
        let expected = "{\"\u{10000}\":2,\"\u{e000}\":1}";
        assert_eq!(canon(r#"{"\ue000":1,"\ud800\udc00":2}"#), expected);
        assert_eq!(canon("{\"\u{e000}\":1,\"\u{10000}\":2}"), expected);
        // Shorter prefix first; code unit order otherwise.
        assert_eq!(canon(r#"{"ab":1,"a":2,"B":3,"":4}"#), r#"{"":4,"B":3,"a":2,"ab":1}"#);
    }

    #[test]
    fn key_order_and_nesting() {
        assert_eq!(canon(r#"{"b":1,"a":{"d":[],"c":{}}}"#), r#"{"a":{"c":{},"d":[]},"b":1}"#);
        assert_eq!(canon(r#"[3,1,2]"#), "[3,1,2]");
        assert_eq!(canon(r#"[{"z":[{"y":1,"x":2}],"a":null}]"#), r#"[{"a":null,"z":[{"x":2,"y":1}]}]"#);
    }

    #[test]
    fn literals_and_scalars() {
        assert_eq!(canon("true"), "true");
        assert_eq!(canon("false"), "false");
        assert_eq!(canon(" null "), "null");
        assert_eq!(canon(r#""x""#), r#""x""#);
        assert_eq!(canon("[true,false,null]"), "[true,false,null]");
    }

    #[test]
    fn whitespace_is_dropped() {
        let expected = r#"{"a":[1,2,{"c":"x y"}],"b":true}"#;
        for input in [
            r#"{"b":true,"a":[1,2,{"c":"x y"}]}"#,
            r#"{"b": true, "a": [1, 2, {"c": "x y"}]}"#,
            "\n\t{ \"b\" :\r\n true ,\"a\"\t:[ 1 ,2,\n{ \"c\":\"x y\" } ] }\n ",
        ] {
            assert_eq!(canon(input), expected, "input {input:?}");
        }
        assert_eq!(canon(" [ ] "), "[]");
        assert_eq!(canon("{ \n }"), "{}");
    }

    #[test]
    fn duplicate_keys_keep_the_last() {
        assert_eq!(canon(r#"{"a":1,"b":0,"a":2}"#), r#"{"a":2,"b":0}"#);
        assert_eq!(canon(r#"{"a":1,"\u0061":[3]}"#), r#"{"a":[3]}"#);
    }

    #[test]
    fn string_escaping() {
        // Every class: short escapes, \u00xx (lower-case hex) for the other controls,
        // quote and backslash; '/', DEL and U+0080 are literal.
        let input = r#""\u0000\u0001\u0007\b\t\n\u000B\f\r\u000e\u001F \u007f\/\"\\\u0080""#;
        let expected = "\"\\u0000\\u0001\\u0007\\b\\t\\n\\u000b\\f\\r\\u000e\\u001f \u{7f}/\\\"\\\\\u{80}\"";
        assert_eq!(canon(input), expected);
        // Raw DEL and '/' in the input are already canonical.
        assert_eq!(canon("\"a/\u{7f}b\""), "\"a/\u{7f}b\"");
        // Escaped keys get the same treatment.
        assert_eq!(canon(r#"{"\n\u0002":1}"#), r#"{"\n\u0002":1}"#);
    }

    #[test]
    fn non_ascii_stays_literal() {
        assert_eq!(canon(r#"["é","日本","😀"]"#), r#"["é","日本","😀"]"#);
        assert_eq!(canon(r#"["\u00e9","\u65e5\u672C","\uD83D\uDE00"]"#), r#"["é","日本","😀"]"#);
        assert_eq!(canon(r#"{"日本":"é"}"#), r#"{"日本":"é"}"#);
    }

    #[test]
    fn ignore_drops_top_level_keys_only() {
        let input = r#"{"ts": 1, "a": {"ts": 2, "b": 3}, "list": [{"ts": 4}], "id": 5}"#;
        assert_eq!(
            canonicalize(input, &["ts", "id"]),
            Ok(r#"{"a":{"b":3,"ts":2},"list":[{"ts":4}]}"#.to_string())
        );
        assert_eq!(canonicalize(r#"{"ts":1}"#, &["ts"]), Ok("{}".to_string()));
        assert_eq!(canonicalize(r#"{"a":1}"#, &["missing"]), Ok(r#"{"a":1}"#.to_string()));
        // Keys are compared after unescaping; duplicates all go.
        assert_eq!(canonicalize(r#"{"t\u0073":1,"ts":2,"x":3}"#, &["ts"]), Ok(r#"{"x":3}"#.to_string()));
    }

    #[test]
    fn ignore_on_non_object_is_a_no_op() {
        assert_eq!(canonicalize(r#"[{"ts":1}]"#, &["ts"]), Ok(r#"[{"ts":1}]"#.to_string()));
        assert_eq!(canonicalize(r#""ts""#, &["ts"]), Ok(r#""ts""#.to_string()));
        assert_eq!(canonicalize("1", &["ts"]), Ok("1".to_string()));
    }

    #[test]
    fn fingerprint_of_canonical_form() {
        // sha256 of the bytes {"a":2,"b":1}, computed with sha256sum.
        let expected = "sha256:d3626ac30a87e6f7a6428233b3c68299976865fa5508e4267c5415c76af7a772";
        assert_eq!(fingerprint_json(r#"{"b": 1, "a": 2}"#, &[]), Ok(expected.to_string()));
        assert_eq!(fingerprint_json(r#"{"a":2.0,"b":1,"ts":"now"}"#, &["ts"]), Ok(expected.to_string()));
        assert!(matches!(fingerprint_json("{", &[]), Err(CanonError::Syntax { .. })));
    }

    #[test]
    fn invalid_inputs_are_errors() {
        for input in [
            "",
            "   ",
            "{",
            "[",
            "[1,]",
            "[1 2]",
            "{\"a\":1,}",
            "{\"a\" 1}",
            "{a:1}",
            "{\"a\":}",
            "01",
            "-01",
            "1.",
            ".5",
            "+1",
            "-",
            "1e",
            "1e+",
            "0x10",
            "nul",
            "tru",
            "nulll",
            "True",
            "NaN",
            "Infinity",
            "\"abc",
            "\"\\ud800\"",
            "\"\\udc00\"",
            "\"\\ud800\\u0041\"",
            "\"\\ud800\\n\"",
            "\"\\u12\"",
            "\"\\x41\"",
            "\"\\",
            "\"a\u{1}\"",
            "\"tab\there\"",
            "1 2",
            "{} []",
            "]",
            "\u{feff}1",
            "\u{c}1",
        ] {
            assert!(
                is_syntax_error(input),
                "expected syntax error for {input:?}, got {:?}",
                canonicalize(input, &[])
            );
        }
    }

    #[test]
    fn syntax_error_positions() {
        assert_eq!(
            canonicalize("1 2", &[]),
            Err(CanonError::Syntax { position: 2, what: "trailing characters after json value" })
        );
        assert_eq!(
            canonicalize("[1,]", &[]),
            Err(CanonError::Syntax { position: 3, what: "unexpected character" })
        );
        assert_eq!(
            canonicalize("", &[]),
            Err(CanonError::Syntax { position: 0, what: "unexpected end of input" })
        );
    }

    #[test]
    fn nesting_limit() {
        let ok_arrays = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert_eq!(canon(&ok_arrays), ok_arrays);
        let ok_objects = format!("{}1{}", "{\"a\":".repeat(MAX_DEPTH), "}".repeat(MAX_DEPTH));
        assert_eq!(canon(&ok_objects), ok_objects);

        let deep = MAX_DEPTH + 1;
        let too_deep = format!("{}{}", "[".repeat(deep), "]".repeat(deep));
        assert_eq!(canonicalize(&too_deep, &[]), Err(CanonError::TooDeep));
        assert_eq!(canonicalize(&"[".repeat(100_000), &[]), Err(CanonError::TooDeep));
        assert_eq!(canonicalize(&"{\"a\":".repeat(100_000), &[]), Err(CanonError::TooDeep));
    }

    /// Counts the bytes this thread asks the allocator for (a realloc counts its new size,
    /// as if it copied). Every way of copying a value's text again for each container
    /// around it needs fresh memory for the copy, so this measures the copying work of
    /// canonicalization without timing anything. Only in the unit-test binary.
    mod work {
        use std::alloc::{GlobalAlloc, Layout, System};
        use std::cell::Cell;

        thread_local! {
            static ALLOCATED: Cell<u64> = const { Cell::new(0) };
        }

        fn count(bytes: usize) {
            // try_with: the allocator may run while this thread's locals are torn down.
            let _ = ALLOCATED.try_with(|n| n.set(n.get() + bytes as u64));
        }

        struct Counting;

        // SAFETY: every call is passed on to the system allocator unchanged.
        unsafe impl GlobalAlloc for Counting {
            unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
                count(layout.size());
                System.alloc(layout)
            }
            unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
                count(layout.size());
                System.alloc_zeroed(layout)
            }
            unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
                count(new_size);
                System.realloc(ptr, layout, new_size)
            }
            unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
                System.dealloc(ptr, layout)
            }
        }

        #[global_allocator]
        static COUNTING: Counting = Counting;

        /// Runs `f` and returns its result with the bytes allocated meanwhile on this thread.
        pub fn allocated_by<R>(f: impl FnOnce() -> R) -> (R, u64) {
            let before = ALLOCATED.with(Cell::get);
            let r = f();
            (r, ALLOCATED.with(Cell::get) - before)
        }
    }

    /// The work is linear in the input: a 1 MB string inside MAX_DEPTH levels of arrays,
    /// of objects whose members must be reordered at every level, and of both mixed,
    /// allocates a small multiple of the input (the quadratic version copied the string
    /// once per level: about 2 GB here).
    #[test]
    fn work_is_linear_in_input_size_not_size_times_depth() {
        let big = "x".repeat(1 << 20);
        let depth = MAX_DEPTH - 1; // the innermost container holds the string
        let cases = [
            ("arrays", format!("[{}\"{big}\"{}]", "[".repeat(depth), "]".repeat(depth))),
            (
                "objects needing a sort at every level",
                format!("{}\"{big}\"{}", "{\"b\":".repeat(depth + 1), ",\"a\":1}".repeat(depth + 1)),
            ),
            (
                "mixed, with escapes and a sibling at every level",
                format!(
                    "{}\"{big}\\n\"{}",
                    "[0,{\"z\":".repeat(depth / 2),
                    ",\"y\":[true,\"\\u00e9\"]}]".repeat(depth / 2)
                ),
            ),
        ];
        for (what, input) in cases {
            let (canonical, allocated) = work::allocated_by(|| canonicalize(&input, &[]));
            let canonical = canonical.unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(canonical.len() >= big.len(), "{what}");
            let budget = 16 * input.len() as u64;
            assert!(
                allocated <= budget,
                "{what}: canonicalizing {} bytes allocated {allocated} bytes (budget {budget}): \
                 values are being copied once per level again",
                input.len()
            );
        }
        // The counter does see copying: re-wrapping the string per level as the old code
        // did allocates far past the budget (about 2 GB).
        let (_, allocated) = work::allocated_by(|| {
            let mut v = format!("\"{big}\"");
            for _ in 0..depth {
                v = format!("[{}]", [v].join(","));
            }
            v.len()
        });
        assert!(allocated > 16 * (big.len() as u64 + 2 * depth as u64));
    }

    /// The many-members case: 100k members given in reverse order. Sorting and keeping
    /// them costs a bounded amount per member (a member copied once per other member,
    /// as in an insertion into a sorted string, would cost about 100 GB).
    #[test]
    fn work_is_linear_for_wide_objects() {
        let members: Vec<String> = (0..100_000).rev().map(|i| format!("\"k{i:06}\":\"v{i:07}\"")).collect();
        let input = format!("{{{}}}", members.join(","));
        let (canonical, allocated) = work::allocated_by(|| canonicalize(&input, &[]));
        let canonical = canonical.expect("valid json");
        assert!(canonical.starts_with("{\"k000000\":\"v0000000\",\"k000001\""));
        assert_eq!(canonical.len(), input.len());
        // Per 21-byte member: its decoded key, its slot in the members' Vec (which grows by
        // doubling) and the stable sort's scratch space.
        assert!(allocated <= 40 * input.len() as u64, "{allocated} bytes for {} bytes", input.len());
    }

    /// Random values (test_json) written with random whitespace, member order and escapes
    /// canonicalize like the compact writing, and canonicalizing is idempotent.
    #[test]
    fn whitespace_and_escapes_do_not_matter_and_idempotent() {
        use crate::test_json::{Json, Style};
        let mut rng = crate::test_rng::Rng(0x9e37_79b9_7f4a_7c15);
        for seed in 0..2000 {
            let value = Json::random(&mut rng, 4);
            let compact = Style::compact().write(&value);
            let spaced = Style::random(seed).write(&value);
            let canonical = canonicalize(&compact, &[]);
            let Ok(c) = &canonical else {
                panic!("{canonical:?} for {compact}");
            };
            assert_eq!(canonicalize(&spaced, &[]), canonical, "{spaced:?}");
            assert_eq!(canonicalize(c, &[]), canonical, "{c:?}");
        }
    }
}
