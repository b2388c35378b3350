//! Byte sizes written as text: `"256MiB"`, `"4GiB"`, `"512KB"`, `"1000"`, `"1.5GiB"`.
//!
//! Units are case-insensitive: `B`; decimal `K`/`KB`, `M`/`MB`, `G`/`GB`, `T`/`TB`,
//! `P`/`PB` (powers of 1000); binary `KiB`, `MiB`, `GiB`, `TiB`, `PiB` (powers of 1024).
//! A fraction is allowed when the result is a whole number of bytes.
//! [`format_size`] writes a form [`parse_size`] reads back exactly.

use crate::duration::split_decimal;
use crate::error::{CoreError, Result};

const UNITS: &[(&str, u128)] = &[
    ("", 1),
    ("b", 1),
    ("k", 1_000),
    ("kb", 1_000),
    ("m", 1_000_000),
    ("mb", 1_000_000),
    ("g", 1_000_000_000),
    ("gb", 1_000_000_000),
    ("t", 1_000_000_000_000),
    ("tb", 1_000_000_000_000),
    ("p", 1_000_000_000_000_000),
    ("pb", 1_000_000_000_000_000),
    ("ki", 1 << 10),
    ("kib", 1 << 10),
    ("mi", 1 << 20),
    ("mib", 1 << 20),
    ("gi", 1 << 30),
    ("gib", 1 << 30),
    ("ti", 1 << 40),
    ("tib", 1 << 40),
    ("pi", 1 << 50),
    ("pib", 1 << 50),
];

fn invalid(input: &str, reason: impl Into<String>) -> CoreError {
    CoreError::InvalidSize {
        input: input.to_string(),
        reason: reason.into(),
    }
}

/// Parses a byte size such as `"256MiB"` or `"1000"`.
///
/// ```
/// use flotilla_core::size::parse_size;
/// assert_eq!(parse_size("256MiB").unwrap(), 256 << 20);
/// assert_eq!(parse_size("512KB").unwrap(), 512_000);
/// assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
/// assert!(parse_size("lots").is_err());
/// ```
pub fn parse_size(input: &str) -> Result<u64> {
    let text = input.trim();
    if text.is_empty() {
        return Err(invalid(input, "it is empty"));
    }
    let Some((mantissa, frac_digits, rest)) = split_decimal(text) else {
        return Err(invalid(
            input,
            "expected a number, optionally followed by a unit",
        ));
    };
    let unit = rest.trim().to_ascii_lowercase();
    let Some(&(_, per)) = UNITS.iter().find(|(u, _)| *u == unit) else {
        return Err(invalid(
            input,
            format!(
                "unknown unit {:?}: use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB",
                rest.trim()
            ),
        ));
    };
    let scale = 10u128
        .checked_pow(frac_digits)
        .ok_or_else(|| invalid(input, "too many digits"))?;
    let scaled = mantissa
        .checked_mul(per)
        .ok_or_else(|| invalid(input, "too large"))?;
    if scaled % scale != 0 {
        return Err(invalid(input, "not a whole number of bytes"));
    }
    u64::try_from(scaled / scale).map_err(|_| invalid(input, "too large"))
}

/// Writes a size as the largest binary unit that divides it exactly (`"256MiB"`), or as a
/// plain number of bytes (`"1000"`).
pub fn format_size(bytes: u64) -> String {
    for (unit, shift) in WRITTEN_UNITS {
        if bytes != 0 && bytes.is_multiple_of(1u64 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// The binary units sizes are written in, largest first, with their power of two.
const WRITTEN_UNITS: [(&str, u32); 5] = [
    ("PiB", 50),
    ("TiB", 40),
    ("GiB", 30),
    ("MiB", 20),
    ("KiB", 10),
];

/// Writes a size for reading, in the largest binary unit it reaches: exact when that unit
/// divides it (`"256MiB"`), or when it is under 10 of that unit and the next smaller unit
/// divides it (`"1536MiB"`, as [`format_size`]); else with one decimal (`"23.5GiB"`, not
/// `"24683664KiB"`).
pub fn format_size_readable(bytes: u64) -> String {
    for (unit, shift) in WRITTEN_UNITS {
        let one = 1u64 << shift;
        if bytes >= one {
            if bytes.is_multiple_of(one) {
                return format!("{}{unit}", bytes >> shift);
            }
            if bytes.is_multiple_of(one >> 10) && bytes >> shift < 10 {
                // 1536MiB reads better than 1.5GiB only when it is exact: keep it.
                return format_size(bytes);
            }
            return format!("{:.1}{unit}", bytes as f64 / one as f64);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn readable_sizes_round_where_no_unit_divides() {
        assert_eq!(format_size_readable(24_683_664 << 10), "23.5GiB");
        assert_eq!(format_size_readable(256 << 20), "256MiB");
        assert_eq!(format_size_readable(1536 << 20), "1536MiB");
        assert_eq!(format_size_readable(1000), "1000");
        assert_eq!(format_size_readable(1_500_000), "1.4MiB");
        assert_eq!(format_size_readable(0), "0");
    }

    #[test]
    fn parses_the_documented_forms() {
        let cases = [
            ("256MiB", 256u64 << 20),
            ("4GiB", 4 << 30),
            ("512KB", 512_000),
            ("1000", 1000),
            ("1.5GiB", 3 << 29),
            ("2 gb", 2_000_000_000),
            ("0", 0),
            ("10B", 10),
            ("1k", 1000),
        ];
        for (text, want) in cases {
            assert_eq!(parse_size(text).unwrap(), want, "{text}");
        }
    }

    #[test]
    fn rejects_bad_input_with_a_reason() {
        for (text, reason) in [
            ("", "empty"),
            ("MiB", "expected a number"),
            ("12 apples", "unknown unit \"apples\""),
            ("1.5B", "not a whole number of bytes"),
            ("100000PiB", "too large"),
            ("-3", "expected a number"),
            ("16EiB", "unknown unit \"EiB\""),
        ] {
            let err = parse_size(text).unwrap_err().to_string();
            assert!(err.contains(reason), "{text}: {err}");
        }
    }

    #[test]
    fn formats_with_the_largest_exact_binary_unit() {
        assert_eq!(format_size(256 << 20), "256MiB");
        assert_eq!(format_size(1000), "1000");
        assert_eq!(format_size(0), "0");
        assert_eq!(format_size(1536), "1536");
        assert_eq!(format_size(3 << 30), "3GiB");
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 512,
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x512E),
            failure_persistence: None,
            ..ProptestConfig::default()
        })]
        #[test]
        fn format_then_parse_is_identity(bytes in any::<u64>()) {
            prop_assert_eq!(parse_size(&format_size(bytes)).unwrap(), bytes);
        }
    }
}
