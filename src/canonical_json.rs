//! RFC 8785 (JSON Canonicalization Scheme) and SHA-256 fingerprints of JSON texts.
//!
//! The parser works bottom-up with an explicit stack, so neither parsing nor output
//! recurses. Work is linear in the size of the input: every scalar is written to its
//! canonical text once, into one shared buffer; a finished container keeps its elements
//! (moved, never copied) so that an object's members can be sorted by key; and the whole
//! canonical text is written once at the end. No value's text is copied again for each
//! container around it.

use sha2::{Digest, Sha256};
use std::fmt;

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
            CanonError::NumberOutOfRange(text) => write!(f, "number out of range for RFC 8785: {text}"),
            CanonError::TooDeep => write!(f, "json nested deeper than {MAX_DEPTH} levels"),
            CanonError::CorruptJsonb => write!(f, "the jsonb value is corrupt"),
        }
    }
}

impl std::error::Error for CanonError {}

pub const MAX_DEPTH: usize = 1000;

const HEX: &[u8; 16] = b"0123456789abcdef";

/// RFC 8785 (JCS) canonical form of a JSON text. `ignore`: top-level object keys left out
/// (ignored when the top-level value is not an object).
pub fn canonicalize(json: &str, ignore: &[&str]) -> Result<String, CanonError> {
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
                    stack.push(Frame::Object {
                        members: Vec::new(),
                        key,
                    });
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
                return Ok(render(value, &scalars));
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

/// "sha256:" + 64 lower-case hex digits of the bytes.
pub fn sha256_tagged(bytes: &[u8]) -> String {
    tagged(Sha256::digest(bytes).as_slice())
}

fn tagged(digest: &[u8]) -> String {
    let mut out = String::with_capacity(7 + 2 * digest.len());
    out.push_str("sha256:");
    for b in digest {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    out
}

/// sha256_tagged(canonicalize(json, ignore)?.as_bytes()): what idem_fingerprint(jsonb) gives.
pub fn fingerprint_json(json: &str, ignore: &[&str]) -> Result<String, CanonError> {
    Ok(sha256_tagged(canonicalize(json, ignore)?.as_bytes()))
}

/// Canonical JSON written piece by piece by a caller that walks an already parsed value (a
/// jsonb value, in idem_fingerprint) in canonical order, and hashed as it is written: the
/// text is never held whole. Together with `sort_members` it gives what `canonicalize` of the
/// value's text gives.
pub struct Writer {
    out: Vec<u8>,
    /// Where numbers are formatted before they are appended to `out`.
    number: String,
    hasher: Option<Sha256>,
}

/// Bytes of canonical text gathered before they go to the hasher.
const HASH_CHUNK: usize = 16 * 1024;

impl Writer {
    /// A writer that hashes (`fingerprint`), or one that keeps the text (`text`).
    pub fn new(hash: bool) -> Self {
        Writer {
            out: Vec::with_capacity(if hash { HASH_CHUNK + 1024 } else { 256 }),
            number: String::new(),
            hasher: hash.then(Sha256::new),
        }
    }

    /// Punctuation and literals, written as they are: `[`, `,`, `true`, `null` ...
    pub fn raw(&mut self, text: &str) {
        self.out.extend_from_slice(text.as_bytes());
    }

    /// A string given as its UTF-8 bytes (not checked: bytes that are not UTF-8 are
    /// written as they are).
    pub fn string_bytes(&mut self, s: &[u8]) {
        write_string_bytes(s, &mut self.out);
        self.flush_full();
    }

    /// A number given as JSON number text (numeric_out's, or any).
    pub fn number(&mut self, text: &str) -> Result<(), CanonError> {
        let bytes = text.as_bytes();
        let digits = bytes.strip_prefix(b"-").unwrap_or(bytes);
        if !digits.is_empty()
            && digits.len() <= 15
            && digits.iter().all(u8::is_ascii_digit)
            && digits[0] != b'0'
        {
            // An integer below 10^15 without a leading zero is its own canonical form.
            self.out.extend_from_slice(bytes);
            return Ok(());
        }
        self.number.clear();
        if let Some(short) = ShortDecimal::of(text) {
            write_decimal(short.negative, short.digits(), short.n, &mut self.number);
        } else {
            let x: f64 = text.parse().map_err(|_| CanonError::Syntax {
                position: 0,
                what: "invalid number",
            })?;
            if x.is_infinite() {
                return Err(CanonError::NumberOutOfRange(text.to_string()));
            }
            write_number(x, &mut self.number);
        }
        self.out.extend_from_slice(self.number.as_bytes());
        Ok(())
    }

    /// "sha256:" + hex of everything written (a hashing writer).
    pub fn fingerprint(mut self) -> String {
        let mut hasher = self.hasher.take().unwrap_or_default();
        hasher.update(&self.out);
        tagged(hasher.finalize().as_slice())
    }

    /// Everything written (a writer that keeps the text).
    #[cfg(test)]
    pub fn text(self) -> String {
        String::from_utf8(self.out).expect("valid UTF-8 in, valid UTF-8 out")
    }

    fn flush_full(&mut self) {
        if self.out.len() >= HASH_CHUNK {
            if let Some(hasher) = &mut self.hasher {
                hasher.update(&self.out);
                self.out.clear();
            }
        }
    }
}

/// Sorts an object's members into JCS order: by the UTF-16 code units of their keys (UTF-8
/// text). That is the order of the UTF-8 bytes except between characters above U+FFFF (4
/// bytes, lead byte F0-F4) and U+E000-U+FFFF (lead byte EE or EF), which UTF-16 orders the
/// other way round: only objects with keys holding such characters take the slower
/// comparison. Stable: members with equal keys keep their order.
pub fn sort_members<K: AsRef<[u8]>, T>(members: &mut [(K, T)]) {
    if members.iter().any(|(key, _)| key.as_ref().iter().any(|&b| b >= 0xee)) {
        members.sort_by(|(a, _), (b, _)| {
            let (a, b) = (String::from_utf8_lossy(a.as_ref()), String::from_utf8_lossy(b.as_ref()));
            a.encode_utf16().cmp(b.encode_utf16())
        });
    } else {
        members.sort_by(|(a, _), (b, _)| a.as_ref().cmp(b.as_ref()));
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

/// Writes the canonical text of `root`, once, without recursion.
fn render(root: Value, scalars: &str) -> String {
    enum Open {
        Array(std::vec::IntoIter<Value>),
        Object(std::vec::IntoIter<(String, Value)>),
    }
    // The output is the scalars' text plus punctuation and keys: a good first guess.
    let mut out = String::with_capacity(scalars.len() + 2);
    let mut open: Vec<(Open, bool)> = Vec::new(); // (container, no element written yet)
    let mut next = Some(root);
    loop {
        match next.take() {
            Some(Value::Text(start, end)) => out.push_str(&scalars[start..end]),
            Some(Value::Array(items)) => {
                out.push('[');
                open.push((Open::Array(items.into_iter()), true));
            }
            Some(Value::Object(members)) => {
                out.push('{');
                open.push((Open::Object(members.into_iter()), true));
            }
            None => {}
        }
        let Some((container, first)) = open.last_mut() else {
            return out;
        };
        match container {
            Open::Array(items) => match items.next() {
                Some(item) => {
                    if !std::mem::replace(first, false) {
                        out.push(',');
                    }
                    next = Some(item);
                }
                None => {
                    out.push(']');
                    open.pop();
                }
            },
            Open::Object(members) => match members.next() {
                Some((key, item)) => {
                    if !std::mem::replace(first, false) {
                        out.push(',');
                    }
                    write_string(&key, &mut out);
                    out.push(':');
                    next = Some(item);
                }
                None => {
                    out.push('}');
                    open.pop();
                }
            },
        }
    }
}

/// A string as ECMAScript's JSON.stringify writes it.
fn write_string(s: &str, out: &mut String) {
    // SAFETY: write_string_bytes appends runs of `s` cut before and after ASCII bytes, and
    // ASCII escapes, so valid UTF-8 stays valid UTF-8.
    write_string_bytes(s.as_bytes(), unsafe { out.as_mut_vec() });
}

/// write_string of UTF-8 bytes.
fn write_string_bytes(s: &[u8], out: &mut Vec<u8>) {
    out.reserve(s.len() + 2);
    out.push(b'"');
    // Runs of bytes written as they are go in at once.
    let mut run = 0;
    while let Some(i) = next_to_escape(s, run) {
        out.extend_from_slice(&s[run..i]);
        run = i + 1;
        match s[i] {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x08 => out.extend_from_slice(b"\\b"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            0x0c => out.extend_from_slice(b"\\f"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b => out.extend_from_slice(&[b'\\', b'u', b'0', b'0', HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]]),
        }
    }
    out.extend_from_slice(&s[run..]);
    out.push(b'"');
}

/// The position of the first byte at or after `from` that a JSON string must escape: a
/// control character, '"' or '\\'. Eight bytes at a time while there is none (the
/// "has a byte less than n" and "has a zero byte" word tests).
fn next_to_escape(s: &[u8], from: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let mut i = from;
    while let Some(chunk) = s.get(i..i + 8) {
        let w = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        let control = w.wrapping_sub(ONES * 0x20) & !w;
        let quote = (w ^ (ONES * u64::from(b'"'))).wrapping_sub(ONES) & !(w ^ (ONES * u64::from(b'"')));
        let backslash = (w ^ (ONES * u64::from(b'\\'))).wrapping_sub(ONES) & !(w ^ (ONES * u64::from(b'\\')));
        if (control | quote | backslash) & HIGHS != 0 {
            break;
        }
        i += 8;
    }
    s[i..].iter().position(|&b| b < 0x20 || b == b'"' || b == b'\\').map(|p| i + p)
}

/// A finite double as ECMAScript's Number.prototype.toString writes it, appended to `out`.
fn write_number(x: f64, out: &mut String) {
    if x == 0.0 {
        out.push('0'); // also -0
        return;
    }
    // `{:e}` gives the shortest digits that round-trip, as "d.ddde-7" or "de21". When two
    // such digit strings are equally close to x it takes the upper one, but ECMAScript
    // wants the even one (RFC 8785 Appendix B: 1424953923781206.25 gives ...206.2).
    // Formatting to the same number of digits rounds half to even, so use that instead
    // whenever it still round-trips.
    let shortest = format!("{:e}", x.abs());
    let k = split_sci(&shortest).0.len();
    let nearest = format!("{:.*e}", k - 1, x.abs());
    let chosen = if nearest.parse() == Ok(x.abs()) {
        nearest
    } else {
        shortest
    };
    let (digits, exponent) = split_sci(&chosen);
    write_decimal(x < 0.0, &digits, exponent + 1, out);
}

/// A decimal number `digits` × 10^(n − k) (k = digits.len(); digits without leading or
/// trailing zeros, the shortest that round-trip) as ECMAScript's Number.prototype.toString
/// writes it.
fn write_decimal(negative: bool, digits: &str, n: i32, out: &mut String) {
    let k = digits.len() as i32;
    if negative {
        out.push('-');
    }
    if k <= n && n <= 21 {
        out.push_str(digits);
        out.extend(std::iter::repeat_n('0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        let (int, frac) = digits.split_at(n as usize);
        out.push_str(int);
        out.push('.');
        out.push_str(frac);
    } else if -6 < n && n <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-n) as usize));
        out.push_str(digits);
    } else {
        let (first, rest) = digits.split_at(1);
        out.push_str(first);
        if !rest.is_empty() {
            out.push('.');
            out.push_str(rest);
        }
        out.push('e');
        out.push(if n > 0 { '+' } else { '-' });
        out.push_str(&(n - 1).abs().to_string());
    }
}

/// A plain decimal text ("-12.50", "0.0031", "1200"; no exponent, as numeric_out writes)
/// of at most 15 significant digits and a moderate exponent, as write_decimal takes it.
/// Such a number's digits are already the shortest that round-trip: doubles keep 15
/// significant decimal digits (DBL_DIG), so no other decimal of 15 digits or fewer rounds
/// to the same double, and no double formatting is needed.
struct ShortDecimal {
    negative: bool,
    buf: [u8; 15],
    len: usize,
    n: i32,
}

impl ShortDecimal {
    /// None for any other text, and for zero.
    fn of(text: &str) -> Option<ShortDecimal> {
        let (negative, unsigned) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let (int, frac) = unsigned.split_once('.').unwrap_or((unsigned, ""));
        if int.is_empty()
            || !int.bytes().all(|b| b.is_ascii_digit())
            || !frac.bytes().all(|b| b.is_ascii_digit())
        {
            return None;
        }
        let int = int.trim_start_matches('0');
        // n: where the decimal point is, counted from the first significant digit.
        let (int, frac, n) = if int.is_empty() {
            let significant = frac.trim_start_matches('0');
            ("", significant, -((frac.len() - significant.len()) as i32))
        } else {
            (int, frac, int.len() as i32)
        };
        let mut d = ShortDecimal { negative, buf: [0; 15], len: 0, n };
        for b in int.bytes().chain(frac.bytes()) {
            if d.len == d.buf.len() {
                // More than 15 digits, unless the rest are all trailing zeros.
                if b != b'0' {
                    return None;
                }
                continue;
            }
            d.buf[d.len] = b;
            d.len += 1;
        }
        while d.len > 0 && d.buf[d.len - 1] == b'0' {
            d.len -= 1;
        }
        (d.len > 0 && (-290..=290).contains(&d.n)).then_some(d)
    }

    fn digits(&self) -> &str {
        std::str::from_utf8(&self.buf[..self.len]).expect("ASCII digits")
    }
}

/// Splits Rust's `{:e}` output such as "1.25e-7" into digits ("125") and exponent (-7).
fn split_sci(sci: &str) -> (String, i32) {
    let (mantissa, exponent) = sci.split_once('e').expect("`{:e}` output has an exponent");
    let exponent = exponent
        .parse()
        .expect("`{:e}` output has an integer exponent");
    (mantissa.replace('.', ""), exponent)
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
        CanonError::Syntax {
            position: self.pos,
            what,
        }
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
        let x: f64 = text.parse().map_err(|_| CanonError::Syntax {
            position: start,
            what: "invalid number",
        })?;
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
                    return Err(CanonError::Syntax {
                        position: start,
                        what: "unpaired surrogate",
                    });
                }
                let low = self.hex4()?;
                if !(0xdc00..=0xdfff).contains(&low) {
                    return Err(CanonError::Syntax {
                        position: start,
                        what: "unpaired surrogate",
                    });
                }
                0x10000 + ((unit - 0xd800) << 10) + (low - 0xdc00)
            }
            0xdc00..=0xdfff => {
                return Err(CanonError::Syntax {
                    position: start,
                    what: "unpaired surrogate",
                });
            }
            _ => unit,
        };
        char::from_u32(code).ok_or(CanonError::Syntax {
            position: start,
            what: "invalid \\u escape",
        })
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
mod tests {
    use super::*;

    fn canon(json: &str) -> String {
        match canonicalize(json, &[]) {
            Ok(s) => s,
            Err(e) => panic!("canonicalize({json:?}) failed: {e}"),
        }
    }

    fn is_syntax_error(json: &str) -> bool {
        matches!(canonicalize(json, &[]), Err(CanonError::Syntax { .. }))
    }

    #[test]
    fn rfc8785_appendix_b_numbers() {
        // Expected values from RFC 8785 Appendix B, cross-checked with node's String(x).
        let table: &[(u64, &str)] = &[
            (0x0000000000000000, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0xffefffffffffffff, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xc340000000000000, "-9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af5, "9.999999999999997e+22"),
            (0x44b52d02c7e14af6, "1e+23"),
            (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
            (0x444b1ae4d6e2ef4e, "999999999999999700000"),
            (0x444b1ae4d6e2ef4f, "999999999999999900000"),
            (0x444b1ae4d6e2ef50, "1e+21"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x41b3de4355555553, "333333333.3333332"),
            (0x41b3de4355555554, "333333333.33333325"),
            (0x41b3de4355555555, "333333333.3333333"),
            (0x41b3de4355555556, "333333333.3333334"),
            (0x41b3de4355555557, "333333333.33333343"),
            (0xbecbf647612f3696, "-0.0000033333333333333333"),
            (0x43143ff3c1cb0959, "1424953923781206.2"),
        ];
        for &(bits, expected) in table {
            let text = format!("{:e}", f64::from_bits(bits));
            assert_eq!(canon(&text), expected, "bits {bits:#018x}, input {text}");
            // The canonical text is itself JSON and canonicalizes to itself.
            assert_eq!(canon(expected), expected);
        }
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
        assert_eq!(
            canon(r#"{"ab":1,"a":2,"B":3,"":4}"#),
            r#"{"":4,"B":3,"a":2,"ab":1}"#
        );
    }

    #[test]
    fn number_forms() {
        let cases = [
            ("1", "1"),
            ("1.0", "1"),
            ("1e2", "100"),
            ("1E+2", "100"),
            ("2.50", "2.5"),
            ("-0", "0"),
            ("-0.0", "0"),
            ("0e10", "0"),
            ("1e21", "1e+21"),
            ("1e20", "100000000000000000000"),
            ("0.000001", "0.000001"),
            ("1e-7", "1e-7"),
            ("-1.5e-7", "-1.5e-7"),
            // Exact value 123456789012345685803008: ...69e23 is the closest 17-digit form.
            ("123456789012345678901234", "1.2345678901234569e+23"),
            ("5e-324", "5e-324"),
            ("1.7976931348623157e308", "1.7976931348623157e+308"),
            ("9007199254740993", "9007199254740992"),
            ("0.1", "0.1"),
            ("-1e-400", "0"),
            ("1e-99999999999999999999", "0"),
            ("-12.5", "-12.5"),
            // Ties between two shortest forms go to the even digit (checked with node).
            ("1059438285926254.25", "1059438285926254.2"),
            ("26363981746409.3125", "26363981746409.312"),
            // 2^-1017: the even neighbour 7.120236347223044e-307 would not round-trip.
            ("7.120236347223045e-307", "7.120236347223045e-307"),
            ("1000000", "1000000"),
        ];
        for (input, expected) in cases {
            assert_eq!(canon(input), expected, "input {input}");
        }
    }

    fn number_via_writer(text: &str) -> Result<String, CanonError> {
        let mut w = Writer::new(false);
        w.number(text)?;
        Ok(w.text())
    }

    #[test]
    fn writer_numbers_match_canonicalize() {
        for input in [
            "0", "-0", "7", "-12", "999999999999999", "1000000000000000", "9007199254740993",
            "1.0", "2.50", "1e21", "1E+2", "-1.5e-7", "123456789012345678901234", "0.1",
            "0.0031", "12.50", "-100.5", "1234.5678", "0.000001", "0.0000001", "100000000000000000000",
            "1000000000000000000000", "123456789012345", "1234567890.12345", "1234567890.123456",
            "0.00000000000000000000000000000000000000000000000000000000000000000000000000001",
            "12345678901234500000000", "1234567890123450001",
        ] {
            assert_eq!(number_via_writer(input), Ok(canon(input)), "number {input}");
        }
        assert_eq!(number_via_writer("1e400"), Err(CanonError::NumberOutOfRange("1e400".into())));

        // Plain decimals as numeric_out writes them take a shortcut (no double formatting):
        // it must agree with the double path of canonicalize on every length and position.
        let mut rng = crate::test_rng::Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..20_000 {
            let len = 1 + rng.below(18);
            let mut digits: String = (0..len).map(|_| char::from(b'0' + rng.below(10) as u8)).collect();
            if rng.below(4) == 0 {
                digits.push_str(&"0".repeat(rng.below(30))); // trailing zeros
            }
            let text = match rng.below(3) {
                0 => digits.trim_start_matches('0').to_string(),
                1 => format!("0.{}{digits}", "0".repeat(rng.below(20))),
                _ => {
                    let int = digits.trim_start_matches('0');
                    let cut = rng.below(int.len() + 1);
                    format!("{}.{}", if cut == 0 { "0" } else { &int[..cut] }, &int[cut..])
                }
            };
            let text = if text.is_empty() || text.ends_with('.') { "0".to_string() } else { text };
            let text = if rng.below(2) == 0 { format!("-{text}") } else { text };
            assert_eq!(number_via_writer(&text), Ok(canon(&text)), "number {text}");
        }
    }

    #[test]
    fn writer_hashes_what_it_writes() {
        // Long enough to be hashed in several chunks.
        let mut w = Writer::new(true);
        let mut text = Writer::new(false);
        w.raw("[");
        text.raw("[");
        for i in 0..5000 {
            for writer in [&mut w, &mut text] {
                if i > 0 {
                    writer.raw(",");
                }
                writer.string_bytes("caf\u{e9} \"x\"\n".as_bytes());
                writer.raw(",");
                writer.number(&format!("{i}.50")).unwrap();
            }
        }
        w.raw("]");
        text.raw("]");
        let text = text.text();
        assert!(text.len() > 3 * HASH_CHUNK);
        assert!(text.starts_with("[\"caf\u{e9} \\\"x\\\"\\n\",0.5,\"caf"));
        assert_eq!(w.fingerprint(), sha256_tagged(text.as_bytes()));
    }

    #[test]
    fn sort_members_orders_by_utf16() {
        fn sorted(keys: &[&str]) -> Vec<String> {
            let mut members: Vec<(&[u8], usize)> = keys.iter().map(|k| k.as_bytes()).zip(0..).collect();
            sort_members(&mut members);
            members.iter().map(|(k, _)| String::from_utf8(k.to_vec()).unwrap()).collect()
        }
        assert_eq!(
            sorted(&["b", "\u{10000}", "a", "\u{e000}", "", "ab"]),
            ["", "a", "ab", "b", "\u{10000}", "\u{e000}"]
        );
        assert_eq!(sorted(&["ab", "B", "a", ""]), ["", "B", "a", "ab"]);
    }

    #[test]
    fn escapes_are_found_in_every_position() {
        // The word-at-a-time scan: one character to escape at each position of strings of
        // every length around the word size, and none.
        for len in 0..20 {
            for at in 0..=len {
                for special in ['"', '\\', '\u{0}', '\u{1f}', '\n'] {
                    let s: String = (0..len).map(|i| if i == at { special } else { 'x' }).collect();
                    let mut out = String::new();
                    write_string(&s, &mut out);
                    let expected = serde_like_escape(&s);
                    assert_eq!(out, expected, "{s:?}");
                }
            }
        }
        for c in ['\u{7f}', '\u{80}', '\u{e9}', '\u{ffff}', ' ', '!', '#', '[', ']', '~'] {
            let s = c.to_string().repeat(17);
            let mut out = String::new();
            write_string(&s, &mut out);
            assert_eq!(out, format!("\"{s}\""));
        }
    }

    /// The escaping of JSON.stringify, written the slow and obvious way.
    fn serde_like_escape(s: &str) -> String {
        let mut out = String::from("\"");
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push(c),
            }
        }
        out.push('"');
        out
    }

    #[test]
    fn numbers_out_of_range() {
        for input in ["1e400", "-1e400", "1e99999999999999999999", "1.8e308"] {
            assert_eq!(
                canonicalize(input, &[]),
                Err(CanonError::NumberOutOfRange(input.to_string()))
            );
        }
        assert_eq!(
            canonicalize(r#"{"a": [1, 2e400]}"#, &[]),
            Err(CanonError::NumberOutOfRange("2e400".to_string()))
        );
    }

    #[test]
    fn key_order_and_nesting() {
        assert_eq!(
            canon(r#"{"b":1,"a":{"d":[],"c":{}}}"#),
            r#"{"a":{"c":{},"d":[]},"b":1}"#
        );
        assert_eq!(canon(r#"[3,1,2]"#), "[3,1,2]");
        assert_eq!(
            canon(r#"[{"z":[{"y":1,"x":2}],"a":null}]"#),
            r#"[{"a":null,"z":[{"x":2,"y":1}]}]"#
        );
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
        let expected =
            "\"\\u0000\\u0001\\u0007\\b\\t\\n\\u000b\\f\\r\\u000e\\u001f \u{7f}/\\\"\\\\\u{80}\"";
        assert_eq!(canon(input), expected);
        // Raw DEL and '/' in the input are already canonical.
        assert_eq!(canon("\"a/\u{7f}b\""), "\"a/\u{7f}b\"");
        // Escaped keys get the same treatment.
        assert_eq!(canon(r#"{"\n\u0002":1}"#), r#"{"\n\u0002":1}"#);
    }

    #[test]
    fn non_ascii_stays_literal() {
        assert_eq!(canon(r#"["é","日本","😀"]"#), r#"["é","日本","😀"]"#);
        assert_eq!(
            canon(r#"["\u00e9","\u65e5\u672C","\uD83D\uDE00"]"#),
            r#"["é","日本","😀"]"#
        );
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
        assert_eq!(
            canonicalize(r#"{"a":1}"#, &["missing"]),
            Ok(r#"{"a":1}"#.to_string())
        );
        // Keys are compared after unescaping; duplicates all go.
        assert_eq!(
            canonicalize(r#"{"t\u0073":1,"ts":2,"x":3}"#, &["ts"]),
            Ok(r#"{"x":3}"#.to_string())
        );
    }

    #[test]
    fn ignore_on_non_object_is_a_no_op() {
        assert_eq!(
            canonicalize(r#"[{"ts":1}]"#, &["ts"]),
            Ok(r#"[{"ts":1}]"#.to_string())
        );
        assert_eq!(canonicalize(r#""ts""#, &["ts"]), Ok(r#""ts""#.to_string()));
        assert_eq!(canonicalize("1", &["ts"]), Ok("1".to_string()));
    }

    #[test]
    fn sha256_known_vectors() {
        assert_eq!(
            sha256_tagged(b""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            sha256_tagged(b"abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn fingerprint_of_canonical_form() {
        // sha256 of the bytes {"a":2,"b":1}, computed with sha256sum.
        let expected = "sha256:d3626ac30a87e6f7a6428233b3c68299976865fa5508e4267c5415c76af7a772";
        assert_eq!(
            fingerprint_json(r#"{"b": 1, "a": 2}"#, &[]),
            Ok(expected.to_string())
        );
        assert_eq!(
            fingerprint_json(r#"{"a":2.0,"b":1,"ts":"now"}"#, &["ts"]),
            Ok(expected.to_string())
        );
        assert!(matches!(
            fingerprint_json("{", &[]),
            Err(CanonError::Syntax { .. })
        ));
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
            Err(CanonError::Syntax {
                position: 2,
                what: "trailing characters after json value"
            })
        );
        assert_eq!(
            canonicalize("[1,]", &[]),
            Err(CanonError::Syntax {
                position: 3,
                what: "unexpected character"
            })
        );
        assert_eq!(
            canonicalize("", &[]),
            Err(CanonError::Syntax {
                position: 0,
                what: "unexpected end of input"
            })
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
        assert_eq!(
            canonicalize(&"[".repeat(100_000), &[]),
            Err(CanonError::TooDeep)
        );
        assert_eq!(
            canonicalize(&"{\"a\":".repeat(100_000), &[]),
            Err(CanonError::TooDeep)
        );
    }

    #[test]
    fn error_messages() {
        let e = CanonError::Syntax {
            position: 3,
            what: "unexpected character",
        };
        assert_eq!(
            e.to_string(),
            "invalid json at byte 3: unexpected character"
        );
        assert_eq!(
            CanonError::NumberOutOfRange("1e400".into()).to_string(),
            "number out of range for RFC 8785: 1e400"
        );
        assert_eq!(
            CanonError::TooDeep.to_string(),
            "json nested deeper than 1000 levels"
        );
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
            (
                "arrays",
                format!("[{}\"{big}\"{}]", "[".repeat(depth), "]".repeat(depth)),
            ),
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

    /// Property check with a small seeded generator (no extra dev-dependency): random
    /// values written with random whitespace and with every non-ASCII character
    /// escaped canonicalize like the compact writing, and canonicalizing is idempotent.
    mod random {
        use super::super::canonicalize;
        use crate::test_rng::Rng;

        enum Json {
            Null,
            Bool(bool),
            Num(f64),
            Str(String),
            Arr(Vec<Json>),
            Obj(Vec<(String, Json)>),
        }

        // Random values from the tests' generator (test_rng::Rng).
        impl Rng {
            fn number(&mut self) -> f64 {
                if self.below(2) == 0 {
                    return self.below(2001) as f64 - 1000.0;
                }
                loop {
                    let x = f64::from_bits(self.next());
                    if x.is_finite() {
                        return x;
                    }
                }
            }

            fn string(&mut self, palette: &[char], max_len: usize) -> String {
                (0..self.below(max_len + 1))
                    .map(|_| match self.below(palette.len() + 1) {
                        // Now and then any scalar value at all.
                        0 => char::from_u32((self.next() % 0x11_0000) as u32).unwrap_or('?'),
                        i => palette[i - 1],
                    })
                    .collect()
            }

            fn value(&mut self, depth: usize) -> Json {
                const TEXT: &[char] = &[
                    'a',
                    'Z',
                    ' ',
                    '"',
                    '\\',
                    '/',
                    '\0',
                    '\u{1}',
                    '\u{8}',
                    '\t',
                    '\n',
                    '\u{c}',
                    '\r',
                    '\u{1f}',
                    '\u{7f}',
                    'é',
                    '日',
                    '\u{e000}',
                    '\u{ffff}',
                    '😀',
                    '\u{10000}',
                ];
                const KEYS: &[char] = &['a', 'b', 'B', 'é', '\u{e000}', '\u{10000}'];
                let kinds = if depth == 0 { 4 } else { 6 };
                match self.below(kinds) {
                    0 => Json::Null,
                    1 => match self.below(3) {
                        0 => Json::Bool(true),
                        1 => Json::Bool(false),
                        _ => Json::Num(self.number()),
                    },
                    2 => Json::Num(self.number()),
                    3 => Json::Str(self.string(TEXT, 6)),
                    4 => Json::Arr((0..self.below(5)).map(|_| self.value(depth - 1)).collect()),
                    _ => Json::Obj(
                        (0..self.below(5))
                            .map(|_| (self.string(KEYS, 2), self.value(depth - 1)))
                            .collect(),
                    ),
                }
            }

            fn whitespace(&mut self) -> String {
                (0..self.below(4))
                    .map(|_| [' ', '\t', '\n', '\r'][self.below(4)])
                    .collect()
            }
        }

        /// Writes JSON with `ws()` between all tokens; strings escape everything outside
        /// printable ASCII as \uXXXX, so they differ from the canonical form.
        fn render(value: &Json, ws: &mut dyn FnMut() -> String, out: &mut String) {
            out.push_str(&ws());
            match value {
                Json::Null => out.push_str("null"),
                Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
                Json::Num(x) => out.push_str(&format!("{x:e}")),
                Json::Str(s) => render_str(s, out),
                Json::Arr(items) => {
                    out.push('[');
                    for (i, item) in items.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        render(item, ws, out);
                    }
                    out.push_str(&ws());
                    out.push(']');
                }
                Json::Obj(members) => {
                    out.push('{');
                    for (i, (key, item)) in members.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        out.push_str(&ws());
                        render_str(key, out);
                        out.push_str(&ws());
                        out.push(':');
                        render(item, ws, out);
                    }
                    out.push_str(&ws());
                    out.push('}');
                }
            }
            out.push_str(&ws());
        }

        fn render_str(s: &str, out: &mut String) {
            out.push('"');
            for unit in s.encode_utf16() {
                match unit {
                    0x22 => out.push_str("\\\""),
                    0x5c => out.push_str("\\\\"),
                    0x20..=0x7e => out.push(char::from(unit as u8)),
                    _ => out.push_str(&format!("\\u{unit:04X}")),
                }
            }
            out.push('"');
        }

        #[test]
        fn whitespace_and_escapes_do_not_matter_and_idempotent() {
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
            for _ in 0..2000 {
                let value = rng.value(4);
                let mut compact = String::new();
                render(&value, &mut String::new, &mut compact);
                let mut spaced = String::new();
                render(&value, &mut || rng.whitespace(), &mut spaced);

                let canonical = canonicalize(&compact, &[]);
                let Ok(c) = &canonical else {
                    panic!("{canonical:?} for {compact}");
                };
                assert_eq!(canonicalize(&spaced, &[]), canonical, "{spaced:?}");
                assert_eq!(canonicalize(c, &[]), canonical, "{c:?}");
            }
        }
    }
}
