//! Durations written as text: `"250ms"`, `"30s"`, `"5m"`, `"1h30m"`, `"2h"`, `"1d"`.
//!
//! A duration is one or more `<number><unit>` parts, added up; spaces between parts are
//! allowed. Units: `d`, `h`, `m`, `s`, `ms`, `us` (or `µs`), `ns`. A number may have a
//! fraction (`"1.5h"`) as long as the result is a whole number of nanoseconds.
//! [`format_duration`] writes the canonical form, which [`parse_duration`] reads back exactly.

use std::time::Duration;

use crate::error::{CoreError, Result};

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// The units, longest name first so that `ms` is not read as `m` then `s`.
const UNITS: &[(&str, u128)] = &[
    ("ms", 1_000_000),
    ("us", 1_000),
    ("µs", 1_000),
    ("ns", 1),
    ("d", 86_400 * NANOS_PER_SEC),
    ("h", 3_600 * NANOS_PER_SEC),
    ("m", 60 * NANOS_PER_SEC),
    ("s", NANOS_PER_SEC),
];

fn invalid(input: &str, reason: impl Into<String>) -> CoreError {
    CoreError::InvalidDuration {
        input: input.to_string(),
        reason: reason.into(),
    }
}

/// Parses a decimal number `digits[.digits]` at the start of `s`: returns
/// (mantissa, number of fraction digits, rest).
pub(crate) fn split_decimal(s: &str) -> Option<(u128, u32, &str)> {
    let int_len = s.bytes().take_while(u8::is_ascii_digit).count();
    let (int_part, rest) = s.split_at(int_len);
    let (frac_part, rest) = match rest.strip_prefix('.') {
        Some(r) => {
            let n = r.bytes().take_while(u8::is_ascii_digit).count();
            r.split_at(n)
        }
        None => ("", rest),
    };
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    let mut mantissa: u128 = 0;
    for b in int_part.bytes().chain(frac_part.bytes()) {
        mantissa = mantissa
            .checked_mul(10)?
            .checked_add(u128::from(b - b'0'))?;
    }
    let frac_digits = u32::try_from(frac_part.len()).ok()?;
    Some((mantissa, frac_digits, rest))
}

/// Parses a duration such as `"1h30m"`.
///
/// ```
/// use std::time::Duration;
/// use flotilla_core::duration::parse_duration;
/// assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
/// assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
/// assert!(parse_duration("30").is_err());
/// ```
pub fn parse_duration(input: &str) -> Result<Duration> {
    let all = input.trim();
    let mut rest = all;
    if rest.is_empty() {
        return Err(invalid(input, "it is empty"));
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let Some((mantissa, frac_digits, after)) = split_decimal(rest) else {
            let read = all[..all.len() - rest.len()].trim_end();
            let reason = if read.is_empty() {
                "expected a number followed by a unit, as in \"30s\" (units: d, h, m, s, ms, \
                 us, ns)"
                    .to_string()
            } else {
                format!(
                    "{rest:?} after {read:?} is not a number with a unit: write it as in \
                     \"1h30m\" (units: d, h, m, s, ms, us, ns)"
                )
            };
            return Err(invalid(input, reason));
        };
        // `2 m` as `2m`.
        let after = after.trim_start();
        // A unit is a whole word: `min` is not `m` then `in`.
        let Some(&(unit, nanos)) = UNITS.iter().find(|(u, _)| {
            after.starts_with(u) && !after[u.len()..].starts_with(char::is_alphabetic)
        }) else {
            let got: String = after.chars().take_while(|c| c.is_alphabetic()).collect();
            let got = if got.is_empty() {
                after.chars().take_while(|c| !c.is_whitespace()).collect()
            } else {
                got
            };
            let reason = if got.is_empty() {
                "a number needs a unit: d, h, m, s, ms, us or ns".to_string()
            } else {
                format!("unknown unit {got:?}: use d, h, m, s, ms, us or ns (as in \"2m\")")
            };
            return Err(invalid(input, reason));
        };
        let scale = 10u128
            .checked_pow(frac_digits)
            .ok_or_else(|| invalid(input, "too many digits"))?;
        let scaled = mantissa
            .checked_mul(nanos)
            .ok_or_else(|| invalid(input, "too long"))?;
        if scaled % scale != 0 {
            return Err(invalid(input, "finer than a nanosecond"));
        }
        total = total
            .checked_add(scaled / scale)
            .ok_or_else(|| invalid(input, "too long"))?;
        rest = after[unit.len()..].trim_start();
    }
    let secs = u64::try_from(total / NANOS_PER_SEC).map_err(|_| invalid(input, "too long"))?;
    let nanos = u32::try_from(total % NANOS_PER_SEC).expect("a remainder of 1e9 fits in u32");
    Ok(Duration::new(secs, nanos))
}

/// Writes a duration in the canonical form [`parse_duration`] reads back exactly:
/// `"1h30m"`, `"250ms"`, `"1d2h3m4s5ms6us7ns"`, and `"0s"` for zero.
pub fn format_duration(d: Duration) -> String {
    if d.is_zero() {
        return "0s".to_string();
    }
    let mut secs = d.as_secs();
    let mut nanos = d.subsec_nanos();
    let mut out = String::new();
    for (unit, per) in [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)] {
        if secs >= per {
            out.push_str(&format!("{}{unit}", secs / per));
            secs %= per;
        }
    }
    for (unit, per) in [("ms", 1_000_000), ("us", 1_000), ("ns", 1)] {
        if nanos >= per {
            out.push_str(&format!("{}{unit}", nanos / per));
            nanos %= per;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_the_documented_forms() {
        let cases = [
            ("250ms", Duration::from_millis(250)),
            ("30s", Duration::from_secs(30)),
            ("5m", Duration::from_secs(300)),
            ("1h30m", Duration::from_secs(5400)),
            ("2h", Duration::from_secs(7200)),
            ("1d", Duration::from_secs(86_400)),
            ("1.5h", Duration::from_secs(5400)),
            ("1m 30s", Duration::from_secs(90)),
            ("2 m", Duration::from_secs(120)),
            ("10us", Duration::from_micros(10)),
            ("7ns", Duration::from_nanos(7)),
            ("0s", Duration::ZERO),
            (".5s", Duration::from_millis(500)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text).unwrap(), want, "{text}");
        }
    }

    #[test]
    fn rejects_bad_input_with_a_reason() {
        for (text, reason) in [
            ("", "empty"),
            ("30", "needs a unit"),
            ("5x", "unknown unit \"x\""),
            ("m", "expected a number"),
            ("1.5ns", "finer than a nanosecond"),
            ("99999999999999999999999d", "too long"),
            ("-5s", "expected a number"),
            ("2 minutes", "unknown unit \"minutes\""),
            ("2min", "unknown unit \"min\""),
            ("1h30", "needs a unit"),
            ("1h x", "\"x\" after \"1h\" is not a number with a unit"),
        ] {
            let err = parse_duration(text).unwrap_err().to_string();
            assert!(err.contains(reason), "{text}: {err}");
            assert!(err.starts_with("invalid duration"), "{err}");
        }
    }

    #[test]
    fn formats_canonically() {
        assert_eq!(format_duration(Duration::from_secs(5400)), "1h30m");
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(format_duration(Duration::ZERO), "0s");
        assert_eq!(
            format_duration(Duration::new(90_061, 5_006_007)),
            "1d1h1m1s5ms6us7ns"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 512,
            rng_seed: proptest::test_runner::RngSeed::Fixed(0xD0_2A),
            failure_persistence: None,
            ..ProptestConfig::default()
        })]
        #[test]
        fn format_then_parse_is_identity(secs in any::<u64>(), nanos in 0u32..1_000_000_000) {
            let d = Duration::new(secs, nanos);
            prop_assert_eq!(parse_duration(&format_duration(d)).unwrap(), d);
        }
    }
}
