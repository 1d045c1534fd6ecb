//! Property tests (proptest) of the pure modules: RFC 8785 canonicalization and argument
//! validation. They run with a plain `cargo test --lib`, no server needed.
//!
//! - Anything at all (arbitrary bytes, arbitrary Unicode, JSON-looking noise, mutated JSON,
//!   deep nesting, number-looking text) goes through `canonicalize` and `fingerprint_json`
//!   without a panic, and an error carries a position inside the input.
//! - Random JSON values (test_json, from a seed that proptest draws, so a failure names
//!   its seed) written out with random whitespace, member order and `\u` escapes
//!   canonicalize to what an independent writer of the canonical form produces, and
//!   canonicalizing is idempotent.
//! - `validate::key_text` accepts exactly the strings of 1 to 255 characters without a
//!   control character (Unicode Cc), and never panics.

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::Config;

use crate::jcs::{canonicalize, fingerprint_json, sha256_tagged, CanonError, MAX_DEPTH};
use crate::test_json::{expected, random_members, Json, Style, PALETTE};
use crate::test_rng::Rng;
use crate::validate::{key_text, MAX_KEY_CHARS};

/// How deep the random values nest.
const DEPTH: usize = 5;

fn text(max: usize) -> impl Strategy<Value = String> {
    vec(prop_oneof![4 => proptest::sample::select(PALETTE), 1 => any::<char>()], 0..=max)
        .prop_map(String::from_iter)
}

fn random_value(seed: u64) -> Json {
    Json::random(&mut Rng(seed | 1), DEPTH)
}

/// Members with distinct keys, at least `min` of them.
fn random_object(seed: u64, min: usize) -> Vec<(String, Json)> {
    let mut rng = Rng(seed | 1);
    loop {
        let members = random_members(&mut rng, DEPTH - 1);
        if members.len() >= min {
            return members;
        }
    }
}

/// Whatever canonicalize answers must be sound: an Ok is itself canonical (idempotent) and
/// fingerprints as its bytes; an error names a position inside the input and displays.
fn check_sound(input: &str) -> Result<(), TestCaseError> {
    match canonicalize(input, &[]) {
        Ok(canonical) => {
            prop_assert_eq!(canonicalize(&canonical, &[]), Ok(canonical.clone()));
            prop_assert_eq!(fingerprint_json(input, &[]), Ok(sha256_tagged(canonical.as_bytes())));
        }
        Err(e) => {
            if let CanonError::Syntax { position, .. } = e {
                prop_assert!(position <= input.len(), "position {} past {}", position, input.len());
            }
            prop_assert!(!e.to_string().is_empty());
            prop_assert_eq!(fingerprint_json(input, &[]), Err(e));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Never a panic, whatever the input.

/// JSON's own alphabet, so that random text gets deep into the parser.
fn json_noise() -> impl Strategy<Value = String> {
    vec(
        proptest::sample::select(
            &[
                "{", "}", "[", "]", ",", ":", "\"", "\\", "\\u", "\\ud83d", "\\ude00", "\\n", "0", "1", "9",
                "-", "+", ".", "e", "E", "true", "false", "null", "tru", "nul", " ", "\n", "\t", "a", "é",
                "😀", "\u{0}", "\u{1f}", "1e400", "-0", "1e-400", "\"k\":",
            ][..],
        ),
        0..48,
    )
    .prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(Config { cases: 512, ..Config::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in vec(any::<u8>(), 0..256)) {
        let lossy = String::from_utf8_lossy(&bytes);
        check_sound(&lossy)?;
        if let Ok(exact) = std::str::from_utf8(&bytes) {
            check_sound(exact)?;
        }
        let tagged = sha256_tagged(&bytes);
        prop_assert!(tagged.starts_with("sha256:") && tagged.len() == 71);
        prop_assert!(tagged[7..].bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    }

    #[test]
    fn arbitrary_unicode_never_panics(s in any::<String>(), ignore in vec(text(3), 0..3)) {
        check_sound(&s)?;
        let ignore: Vec<&str> = ignore.iter().map(String::as_str).collect();
        let _ = canonicalize(&s, &ignore);
        let _ = fingerprint_json(&s, &ignore);
    }

    #[test]
    fn json_looking_noise_never_panics(s in json_noise()) {
        check_sound(&s)?;
        let quoted = format!("[{s}]");
        check_sound(&quoted)?;
        let keyed = format!("{{\"k\":{s}}}");
        check_sound(&keyed)?;
    }

    #[test]
    fn mutated_json_never_panics(value_seed in any::<u64>(), seed in any::<u64>(), edits in vec((any::<prop::sample::Index>(), 0u8..4, any::<char>()), 1..4)) {
        let mut s = Style::random(seed).write(&random_value(value_seed));
        for (at, op, c) in edits {
            let boundaries: Vec<usize> = s.char_indices().map(|(i, _)| i).chain([s.len()]).collect();
            let i = boundaries[at.index(boundaries.len())];
            match op {
                0 => s.insert(i, c),
                1 if i < s.len() => { s.remove(i); }
                2 if i < s.len() => { s.remove(i); s.insert(i, c); }
                _ => s.truncate(i),
            }
        }
        check_sound(&s)?;
    }

    #[test]
    fn nesting_is_refused_past_the_limit_without_panic(depth in 1usize..(MAX_DEPTH + 50), objects in any::<bool>(), tail in "[\\]}\\[{, 0-9\"]{0,3}") {
        let (open, close) = if objects { ("{\"k\":", "}") } else { ("[", "]") };
        let body = if objects { "0" } else { "" };
        let whole = format!("{}{body}{}", open.repeat(depth), close.repeat(depth));
        let r = canonicalize(&whole, &[]);
        if depth <= MAX_DEPTH {
            prop_assert!(r.is_ok(), "depth {}: {:?}", depth, r);
        } else {
            prop_assert_eq!(r, Err(CanonError::TooDeep));
        }
        // Unbalanced and cut-off nests are errors, never panics.
        check_sound(&format!("{}{tail}", open.repeat(depth)))?;
        check_sound(&format!("{}{tail}{}", open.repeat(depth), close.repeat(depth / 2)))?;
    }

    #[test]
    fn number_text_canonicalizes_to_the_same_double(
        s in "-?(0|[1-9][0-9]{0,40})(\\.[0-9]{1,40})?([eE][+-]?[0-9]{1,4})?"
    ) {
        let x: f64 = s.parse().expect("the regex is JSON's number grammar");
        match canonicalize(&s, &[]) {
            Ok(canonical) => {
                prop_assert!(x.is_finite());
                let back: f64 = canonical.parse().expect("canonical text is a number");
                prop_assert_eq!(back, if x == 0.0 { 0.0 } else { x }, "{} -> {}", s, canonical);
                prop_assert!(!canonical.starts_with("-0") || canonical.starts_with("-0."), "{}", canonical);
            }
            Err(CanonError::NumberOutOfRange(text)) => {
                prop_assert!(x.is_infinite());
                prop_assert_eq!(text, s);
            }
            Err(e) => prop_assert!(false, "{} gave {:?}", s, e),
        }
    }

    #[test]
    fn doubles_round_trip_in_shortest_form(bits in any::<u64>()) {
        let x = f64::from_bits(bits);
        prop_assume!(x.is_finite());
        let canonical = canonicalize(&format!("{x:e}"), &[]).expect("finite");
        let back: f64 = canonical.parse().expect("a number");
        prop_assert_eq!(back, if x == 0.0 { 0.0 } else { x });
        // As many significant digits as the shortest round-trip form, no more.
        let shortest = format!("{:e}", x.abs());
        let digits = |t: &str| -> usize {
            let mantissa = t.split(['e', 'E']).next().unwrap_or("");
            mantissa.chars().filter(char::is_ascii_digit).collect::<String>()
                .trim_start_matches('0').trim_end_matches('0').len()
        };
        if x != 0.0 {
            let mantissa = canonical.trim_start_matches('-');
            let mantissa = mantissa.split('e').next().unwrap_or("");
            let significant = mantissa.replace('.', "");
            let significant = significant.trim_start_matches('0').trim_end_matches('0');
            prop_assert_eq!(significant.len(), digits(&shortest), "{} -> {}", x, canonical);
        }
        // ECMAScript's choice of notation: plain digits from 1e-6 up to 1e21, else exponent.
        let plain = x == 0.0 || (x.abs() >= 1e-6 && x.abs() < 1e21);
        prop_assert_eq!(!canonical.contains('e'), plain, "{} -> {}", x, canonical);
    }
}

// ---------------------------------------------------------------------------------------
// Canonical form of arbitrary values.

proptest! {
    #![proptest_config(Config { cases: 512, ..Config::default() })]

    #[test]
    fn canonical_form_is_the_independent_writers(value_seed in any::<u64>(), seed in any::<u64>()) {
        let value = random_value(value_seed);
        let expect = expected(&value);
        let compact = Style::compact().write(&value);
        prop_assert_eq!(canonicalize(&compact, &[]), Ok(expect.clone()), "compact {:?}", compact);
        // Whitespace, member order and escapes do not matter.
        let messy = Style::random(seed).write(&value);
        prop_assert_eq!(canonicalize(&messy, &[]), Ok(expect.clone()), "messy {:?}", messy);
        prop_assert_eq!(fingerprint_json(&messy, &[]), Ok(sha256_tagged(expect.as_bytes())));
    }

    #[test]
    fn canonicalization_is_idempotent(value_seed in any::<u64>(), seed in any::<u64>()) {
        let messy = Style::random(seed).write(&random_value(value_seed));
        let once = canonicalize(&messy, &[]).expect("valid json");
        prop_assert_eq!(canonicalize(&once, &[]), Ok(once.clone()));
        // The canonical text has no insignificant white space: every white space character
        // left is inside a string.
        let mut in_string = false;
        let mut escaped = false;
        for c in once.chars() {
            if in_string {
                if escaped { escaped = false } else if c == '\\' { escaped = true } else if c == '"' { in_string = false }
            } else if c == '"' {
                in_string = true;
            } else {
                prop_assert!(!c.is_whitespace(), "white space outside strings in {:?}", once);
            }
        }
    }

    #[test]
    fn two_writings_agree(value_seed in any::<u64>(), seed_a in any::<u64>(), seed_b in any::<u64>()) {
        let value = random_value(value_seed);
        let a = Style::random(seed_a).write(&value);
        let b = Style::random(seed_b).write(&value);
        prop_assert_eq!(canonicalize(&a, &[]), canonicalize(&b, &[]));
        prop_assert_eq!(fingerprint_json(&a, &[]), fingerprint_json(&b, &[]));
    }

    #[test]
    fn duplicate_keys_keep_the_last(
        members_seed in any::<u64>(),
        earlier_seed in any::<u64>(),
        pick in any::<prop::sample::Index>(),
    ) {
        let members = random_object(members_seed, 1);
        let earlier = random_value(earlier_seed);
        let key = members[pick.index(members.len())].0.clone();
        // The same key written first with another value, then the real members.
        let mut doubled = String::from("{");
        let mut style = Style::compact();
        style.string(&key, &mut doubled);
        doubled.push(':');
        style.value(&earlier, &mut doubled);
        for (k, v) in &members {
            doubled.push(',');
            style.string(k, &mut doubled);
            doubled.push(':');
            style.value(v, &mut doubled);
        }
        doubled.push('}');
        prop_assert_eq!(canonicalize(&doubled, &[]), Ok(expected(&Json::Obj(members))));
    }

    #[test]
    fn ignore_drops_exactly_the_named_top_level_keys(
        members_seed in any::<u64>(),
        mask in any::<u8>(),
        seed in any::<u64>(),
    ) {
        let members = random_object(members_seed, 0);
        let ignored: Vec<&str> = members.iter().enumerate()
            .filter(|(i, _)| mask & (1 << (i % 8)) != 0)
            .map(|(_, (k, _))| k.as_str())
            .collect();
        let kept: Vec<(String, Json)> = members.iter()
            .filter(|(k, _)| !ignored.contains(&k.as_str()))
            .cloned()
            .collect();
        let value = Json::Obj(members.clone());
        let messy = Style::random(seed).write(&value);
        prop_assert_eq!(canonicalize(&messy, &ignored), Ok(expected(&Json::Obj(kept))));
        // Nested the same object is left whole.
        let nested = Json::Arr(vec![value]);
        prop_assert_eq!(canonicalize(&Style::random(seed).write(&nested), &ignored), Ok(expected(&nested)));
    }
}

// ---------------------------------------------------------------------------------------
// validate::key_text

/// The rule, written independently: 1 to 255 characters (not bytes), none of them Cc.
fn acceptable_key(s: &str) -> bool {
    let n = s.chars().count();
    (1..=MAX_KEY_CHARS).contains(&n) && !s.chars().any(|c| matches!(c as u32, 0..=0x1f | 0x7f..=0x9f))
}

/// Strings around the length limit, of one- to four-byte characters, sometimes with a
/// control character somewhere.
fn key_candidates() -> impl Strategy<Value = String> {
    let ch = prop_oneof![
        6 => proptest::sample::select(&['k', 'é', '€', '😀', ' ', '\'', '"', '\\', '%', '\u{ad}', '\u{200b}', '\u{feff}'][..]),
        1 => proptest::sample::select(&['\0', '\u{1}', '\t', '\n', '\r', '\u{1b}', '\u{1f}', '\u{7f}', '\u{80}', '\u{85}', '\u{9f}'][..]),
        2 => any::<char>(),
    ];
    prop_oneof![
        vec(ch.clone(), 0..8).prop_map(String::from_iter),
        vec(ch.clone(), 250..262).prop_map(String::from_iter),
        // Exactly at and around the limit, with at most one control character.
        (
            proptest::sample::select(&['k', 'é', '€', '😀'][..]),
            253usize..258,
            any::<prop::sample::Index>(),
            prop::option::of(proptest::sample::select(&['\0', '\n', '\u{7f}', '\u{85}'][..]))
        )
            .prop_map(|(c, n, at, bad)| {
                let mut chars = vec![c; n];
                if let Some(bad) = bad {
                    let i = at.index(n);
                    chars[i] = bad;
                }
                String::from_iter(chars)
            }),
    ]
}

proptest! {
    #![proptest_config(Config { cases: 1024, ..Config::default() })]

    #[test]
    fn key_text_accepts_exactly_short_control_free_strings(s in key_candidates()) {
        let r = key_text("key", Some(&s));
        if acceptable_key(&s) {
            prop_assert_eq!(r, Ok(s.as_str()));
        } else {
            let e = r.expect_err("must be refused");
            prop_assert_eq!(e.sqlstate(), "22023");
            prop_assert!(e.message().contains("\"key\""), "{}", e.message());
        }
    }

    #[test]
    fn key_text_never_panics_on_any_string(s in any::<String>()) {
        let r = key_text("scope", Some(&s));
        prop_assert_eq!(r.is_ok(), acceptable_key(&s));
        if let Err(e) = r {
            prop_assert_eq!(e.sqlstate(), "22023");
        }
    }

    #[test]
    fn key_text_on_arbitrary_bytes(bytes in vec(any::<u8>(), 0..600)) {
        let s = String::from_utf8_lossy(&bytes);
        prop_assert_eq!(key_text("message_id", Some(&s)).is_ok(), acceptable_key(&s));
    }
}

#[test]
fn key_text_null_is_22004() {
    assert_eq!(key_text("key", None).unwrap_err().sqlstate(), "22004");
}
