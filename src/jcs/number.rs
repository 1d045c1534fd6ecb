//! Numbers as ECMAScript's Number.prototype.toString writes them (RFC 8785 section 3.2.2.3).

use super::CanonError;

/// JSON number text (numeric_normalize's, or any) in its canonical form, appended to `out`.
pub fn write_number_text(text: &str, out: &mut String) -> Result<(), CanonError> {
    if let Some(short) = ShortDecimal::of(text) {
        write_decimal(short.negative, short.digits(), short.n, out);
        return Ok(());
    }
    let x: f64 = text.parse().map_err(|_| CanonError::Syntax { position: 0, what: "invalid number" })?;
    if x.is_infinite() {
        return Err(CanonError::NumberOutOfRange(text.to_string()));
    }
    write_number(x, out);
    Ok(())
}

/// A finite double as ECMAScript's Number.prototype.toString writes it, appended to `out`.
pub fn write_number(x: f64, out: &mut String) {
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
    let chosen = if nearest.parse() == Ok(x.abs()) { nearest } else { shortest };
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
    let exponent = exponent.parse().expect("`{:e}` output has an integer exponent");
    (mantissa.replace('.', ""), exponent)
}

#[cfg(test)]
mod tests {
    use super::super::text::tests::canon;
    use super::super::{canonicalize, Writer};
    use super::*;

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
        let mut w = Writer::keeping();
        w.number(text)?;
        Ok(w.text())
    }

    #[test]
    fn writer_numbers_match_canonicalize() {
        for input in [
            "0",
            "-0",
            "7",
            "-12",
            "999999999999999",
            "1000000000000000",
            "9007199254740993",
            "1.0",
            "2.50",
            "1e21",
            "1E+2",
            "-1.5e-7",
            "123456789012345678901234",
            "0.1",
            "0.0031",
            "12.50",
            "-100.5",
            "1234.5678",
            "0.000001",
            "0.0000001",
            "100000000000000000000",
            "1000000000000000000000",
            "123456789012345",
            "1234567890.12345",
            "1234567890.123456",
            "0.00000000000000000000000000000000000000000000000000000000000000000000000000001",
            "12345678901234500000000",
            "1234567890123450001",
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
    fn numbers_out_of_range() {
        for input in ["1e400", "-1e400", "1e99999999999999999999", "1.8e308"] {
            assert_eq!(canonicalize(input, &[]), Err(CanonError::NumberOutOfRange(input.to_string())));
        }
        assert_eq!(
            canonicalize(r#"{"a": [1, 2e400]}"#, &[]),
            Err(CanonError::NumberOutOfRange("2e400".to_string()))
        );
    }
}
