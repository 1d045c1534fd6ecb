//! The tests' one generator of random JSON (unit, property and in-process tests alike): a
//! value (`Json`) drawn from the seeded `Rng`, written out compactly or as some client might
//! (`Style`: any whitespace, member order, escapes and number spellings), and its canonical
//! form written independently of the code under test (`expected`).
// The in-process tests (built without cfg(test)) use only part of it.
#![cfg_attr(not(test), allow(dead_code))]

use crate::jcs::canonicalize;
use crate::test_rng::Rng;

#[derive(Clone, Debug)]
pub enum Json {
    Null,
    Bool(bool),
    /// An integer that a double holds exactly (|i| <= 2^53): ECMAScript prints its digits.
    Int(i64),
    /// Any finite double.
    Float(f64),
    /// A number whose spelling is the point: beyond a double's precision or range, ties,
    /// the edges of ECMAScript's plain and exponent notations.
    Spelled(&'static str),
    Str(String),
    Arr(Vec<Json>),
    /// Distinct keys, in the order they are written.
    Obj(Vec<(String, Json)>),
}

/// Characters that exercise every rule: escapes, controls, DEL, non-ASCII, the BMP above the
/// surrogates (which sorts after astral characters in UTF-16), astral characters.
pub const PALETTE: &[char] = &[
    'a',
    'b',
    'B',
    'z',
    'Z',
    '0',
    ' ',
    '"',
    '\\',
    '/',
    '\0',
    '\u{1}',
    '\u{8}',
    '\t',
    '\n',
    '\u{b}',
    '\u{c}',
    '\r',
    '\u{1f}',
    '\u{7f}',
    '\u{80}',
    '\u{85}',
    'é',
    'ö',
    '€',
    '日',
    '\u{e000}',
    '\u{fb33}',
    '\u{ffff}',
    '😀',
    '\u{10000}',
    '\u{10ffff}',
];

/// Keys are short and drawn from few characters, so that sorting has ties to break.
const KEY_PALETTE: &[char] = &['a', 'b', 'B', 'é', '\u{e000}', '\u{10000}'];

const SPELLED: &[&str] = &[
    "0",
    "-0",
    "1.0",
    "2.50",
    "1e21",
    "1e20",
    "1E+2",
    "1e-7",
    "-1.5e-7",
    "0.1",
    "-12.5",
    "123456789012345678901234",
    "9007199254740993",
    "999999999999999",
    "1000000000000000",
    "-999999999999999",
    "5e-324",
    "1.7976931348623157e308",
    "1e-400",
    "333333333.33333329",
    "1424953923781206.25",
    "0.000001",
    "100",
];

impl Json {
    /// A random value nested at most `depth` levels deep.
    pub fn random(rng: &mut Rng, depth: usize) -> Json {
        match rng.below(if depth == 0 { 6 } else { 8 }) {
            0 => Json::Null,
            1 => Json::Bool(rng.below(2) == 0),
            2 => Json::Int(random_int(rng)),
            3 => Json::Float(random_double(rng)),
            4 => Json::Spelled(SPELLED[rng.below(SPELLED.len())]),
            5 => Json::Str(random_text(rng, PALETTE, 6)),
            6 => Json::Arr((0..rng.below(6)).map(|_| Json::random(rng, depth - 1)).collect()),
            _ => Json::Obj(random_members(rng, depth - 1)),
        }
    }
}

/// Up to five members with distinct keys, values nested at most `depth` levels deep.
pub fn random_members(rng: &mut Rng, depth: usize) -> Vec<(String, Json)> {
    let mut members: Vec<(String, Json)> = Vec::new();
    for _ in 0..rng.below(6) {
        let key = random_text(rng, KEY_PALETTE, 3);
        let value = Json::random(rng, depth);
        if !members.iter().any(|(k, _)| *k == key) {
            members.push((key, value));
        }
    }
    members
}

fn random_int(rng: &mut Rng) -> i64 {
    if rng.below(2) == 0 {
        return rng.below(2001) as i64 - 1000;
    }
    let limit = 1u64 << 53;
    let magnitude = (rng.next() % (limit + 1)) as i64;
    if rng.below(2) == 0 {
        -magnitude
    } else {
        magnitude
    }
}

fn random_double(rng: &mut Rng) -> f64 {
    if rng.below(4) == 0 {
        return (rng.below(2_000_001) as f64 - 1_000_000.0) / 1000.0;
    }
    loop {
        let x = f64::from_bits(rng.next());
        if x.is_finite() {
            return x;
        }
    }
}

/// Up to `max_len` characters from `palette`, now and then any scalar value at all.
pub fn random_text(rng: &mut Rng, palette: &[char], max_len: usize) -> String {
    (0..rng.below(max_len + 1))
        .map(|_| match rng.below(palette.len() + 1) {
            0 => char::from_u32((rng.next() % 0x11_0000) as u32).unwrap_or('?'),
            i => palette[i - 1],
        })
        .collect()
}

/// A string as ECMAScript's JSON.stringify writes it (RFC 8785 section 3.2.2.2).
pub fn expected_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The canonical form, written independently of the code under test, except for doubles
/// and spelled numbers: their text is the one `canonicalize` gives for the number alone
/// (numbers are checked on their own against RFC 8785's tables and by property tests).
pub fn expected(value: &Json) -> String {
    let mut out = String::new();
    write_expected(value, &mut out);
    out
}

fn write_expected(value: &Json, out: &mut String) {
    match value {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Int(i) => out.push_str(&i.to_string()),
        Json::Float(x) => out.push_str(&canonicalize(&format!("{x:e}"), &[]).expect("a finite double")),
        Json::Spelled(text) => out.push_str(&canonicalize(text, &[]).expect("a JSON number")),
        Json::Str(s) => expected_string(s, out),
        Json::Arr(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_expected(item, out);
            }
            out.push(']');
        }
        Json::Obj(members) => {
            let mut sorted: Vec<&(String, Json)> = members.iter().collect();
            sorted.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push('{');
            for (i, (key, item)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                expected_string(key, out);
                out.push(':');
                write_expected(item, out);
            }
            out.push('}');
        }
    }
}

/// How a value is written: compactly, or as some client might.
pub struct Style {
    rng: Rng,
    whitespace: bool,
    shuffle: bool,
    escapes: bool,
}

impl Style {
    /// No whitespace, members in order, only the escapes JSON requires, plain numbers.
    pub fn compact() -> Self {
        Style { rng: Rng(1), whitespace: false, shuffle: false, escapes: false }
    }

    /// Random whitespace, member order, escapes (any character as \uXXXX in either case,
    /// '/' as \/) and number spellings, from `seed`.
    pub fn random(seed: u64) -> Self {
        Style { rng: Rng(seed | 1), whitespace: true, shuffle: true, escapes: true }
    }

    /// The value as text.
    pub fn write(&mut self, value: &Json) -> String {
        let mut out = String::new();
        self.value(value, &mut out);
        out
    }

    fn ws(&mut self, out: &mut String) {
        if self.whitespace {
            for _ in 0..self.rng.below(3) {
                out.push([' ', '\t', '\n', '\r'][self.rng.below(4)]);
            }
        }
    }

    pub fn string(&mut self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            let must = c == '"' || c == '\\' || (c as u32) < 0x20;
            if must || (self.escapes && self.rng.below(3) == 0) {
                if !must && c == '/' && self.rng.below(2) == 0 {
                    out.push_str("\\/");
                    continue;
                }
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    if self.rng.below(2) == 0 {
                        out.push_str(&format!("\\u{unit:04x}"));
                    } else {
                        out.push_str(&format!("\\u{unit:04X}"));
                    }
                }
            } else {
                out.push(c);
            }
        }
        out.push('"');
    }

    fn double(&mut self, x: f64, out: &mut String) {
        if !self.escapes {
            out.push_str(&format!("{x:e}"));
            return;
        }
        // Spellings of the same double: exponent forms, plain decimals, trailing zeros.
        match self.rng.below(4) {
            0 => out.push_str(&format!("{x:e}")),
            1 => out.push_str(&format!("{x:E}").replace('E', "E+").replace("E+-", "E-")),
            2 if x.abs() < 1e15 && x.abs() > 1e-5 => out.push_str(&format!("{x}")),
            _ => out.push_str(&format!("{x:.17e}")),
        }
    }

    pub fn value(&mut self, value: &Json, out: &mut String) {
        self.ws(out);
        match value {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Int(i) => {
                if self.escapes && self.rng.below(4) == 0 {
                    out.push_str(&format!("{i}.000e0"));
                } else {
                    out.push_str(&i.to_string());
                }
            }
            Json::Float(x) => self.double(*x, out),
            Json::Spelled(text) => out.push_str(text),
            Json::Str(s) => self.string(s, out),
            Json::Arr(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    self.value(item, out);
                }
                self.ws(out);
                out.push(']');
            }
            Json::Obj(members) => {
                let mut order: Vec<usize> = (0..members.len()).collect();
                if self.shuffle {
                    for i in (1..order.len()).rev() {
                        order.swap(i, self.rng.below(i + 1));
                    }
                }
                out.push('{');
                for (n, &i) in order.iter().enumerate() {
                    if n > 0 {
                        out.push(',');
                    }
                    self.ws(out);
                    self.string(&members[i].0, out);
                    self.ws(out);
                    out.push(':');
                    self.value(&members[i].1, out);
                }
                self.ws(out);
                out.push('}');
            }
        }
        self.ws(out);
    }
}
