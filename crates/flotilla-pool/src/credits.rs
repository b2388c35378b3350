//! Credits: exact amounts in millionths (micro-credits), so that a ledger's sums never drift
//! (a total that must stay constant forever cannot be kept in floating point).

use std::fmt;
use std::iter::Sum;
use std::ops::{Add, AddAssign, Neg, Sub, SubAssign};

use serde::{Deserialize, Serialize};

use crate::error::PoolError;

/// Micro-credits in one credit.
pub const MICRO: i64 = 1_000_000;

/// An amount of credits, exact to a millionth; may be negative (a debit).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Credits(pub i64);

impl Credits {
    /// Nothing.
    pub const ZERO: Credits = Credits(0);

    /// `n` micro-credits.
    pub const fn micro(n: i64) -> Credits {
        Credits(n)
    }

    /// Whole credits.
    pub const fn whole(n: i64) -> Credits {
        Credits(n * MICRO)
    }

    /// The nearest amount to `x` credits (a job file's number); NaN is zero, and the
    /// infinities saturate.
    pub fn from_f64(x: f64) -> Credits {
        let m = (x * MICRO as f64).round();
        if m.is_nan() {
            Credits::ZERO
        } else {
            // `as` saturates at the bounds.
            Credits(m as i64)
        }
    }

    /// Micro-credits.
    pub fn as_micro(self) -> i64 {
        self.0
    }

    /// As a float, for display and JSON.
    pub fn as_f64(self) -> f64 {
        self.0 as f64 / MICRO as f64
    }

    /// Whether below zero.
    pub fn is_negative(self) -> bool {
        self.0 < 0
    }

    /// `self × ppm / 1,000,000`, rounded half away from zero (fees in parts per million).
    pub fn ppm(self, ppm: u32) -> Credits {
        let p = i128::from(self.0) * i128::from(ppm);
        let half = 500_000i128 * p.signum();
        Credits(((p + half) / 1_000_000) as i64)
    }

    /// Parses a decimal amount such as `100`, `0.02` or `12.5` exactly (at most six
    /// decimals); `what` names the field in the error.
    pub fn parse(s: &str, what: &str) -> Result<Credits, PoolError> {
        let bad = |why: &str| PoolError::BadAmount {
            what: what.to_string(),
            value: s.to_string(),
            why: why.to_string(),
        };
        let t = s.trim();
        let (neg, t) = match t.strip_prefix('-') {
            Some(r) => (true, r),
            None => (false, t),
        };
        let (int, frac) = t.split_once('.').unwrap_or((t, ""));
        if int.is_empty() && frac.is_empty() {
            return Err(bad("not a number"));
        }
        if !int.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad("not a decimal number"));
        }
        if frac.len() > 6 {
            return Err(bad("more than six decimals"));
        }
        let whole: i64 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| bad("too large"))?
        };
        let mut f: i64 = if frac.is_empty() {
            0
        } else {
            frac.parse().map_err(|_| bad("not a decimal number"))?
        };
        for _ in frac.len()..6 {
            f *= 10;
        }
        let v = whole
            .checked_mul(MICRO)
            .and_then(|w| w.checked_add(f))
            .ok_or_else(|| bad("too large"))?;
        Ok(Credits(if neg { -v } else { v }))
    }
}

impl fmt::Display for Credits {
    /// Six decimals with trailing zeros dropped: `12.5`, `0.02`, `100`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.0 < 0 { "-" } else { "" };
        let a = self.0.unsigned_abs();
        let (w, r) = (a / MICRO as u64, a % MICRO as u64);
        if r == 0 {
            write!(f, "{sign}{w}")
        } else {
            let frac = format!("{r:06}");
            write!(f, "{sign}{w}.{}", frac.trim_end_matches('0'))
        }
    }
}

impl Add for Credits {
    type Output = Credits;
    fn add(self, o: Credits) -> Credits {
        Credits(self.0.saturating_add(o.0))
    }
}

impl AddAssign for Credits {
    fn add_assign(&mut self, o: Credits) {
        *self = *self + o;
    }
}

impl Sub for Credits {
    type Output = Credits;
    fn sub(self, o: Credits) -> Credits {
        Credits(self.0.saturating_sub(o.0))
    }
}

impl SubAssign for Credits {
    fn sub_assign(&mut self, o: Credits) {
        *self = *self - o;
    }
}

impl Neg for Credits {
    type Output = Credits;
    fn neg(self) -> Credits {
        Credits(self.0.saturating_neg())
    }
}

impl Sum for Credits {
    fn sum<I: Iterator<Item = Credits>>(iter: I) -> Credits {
        iter.fold(Credits::ZERO, |a, b| a + b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_and_prints_exactly() {
        for (s, micro, back) in [
            ("100", 100_000_000, "100"),
            ("0.02", 20_000, "0.02"),
            ("12.5", 12_500_000, "12.5"),
            ("0.000001", 1, "0.000001"),
            ("-3.25", -3_250_000, "-3.25"),
            (".5", 500_000, "0.5"),
        ] {
            let c = Credits::parse(s, "x").unwrap();
            assert_eq!(c.as_micro(), micro, "{s}");
            assert_eq!(c.to_string(), back);
        }
        for bad in [
            "",
            "abc",
            "1.0000001",
            "1e3",
            "1.2.3",
            "99999999999999999999",
        ] {
            let e = Credits::parse(bad, "--credits").unwrap_err().to_string();
            assert!(e.contains("--credits"), "{e}");
        }
    }

    #[test]
    fn fees_round_half_away_from_zero() {
        assert_eq!(
            Credits::micro(1_000_000).ppm(50_000),
            Credits::micro(50_000)
        );
        assert_eq!(Credits::micro(10).ppm(50_000), Credits::micro(1)); // 0.5 -> 1
        assert_eq!(Credits::micro(9).ppm(50_000), Credits::micro(0)); // 0.45 -> 0
        assert_eq!(Credits::micro(-10).ppm(50_000), Credits::micro(-1));
    }

    proptest! {
        #[test]
        fn display_parses_back(n in -1_000_000_000_000i64..1_000_000_000_000) {
            let c = Credits::micro(n);
            prop_assert_eq!(Credits::parse(&c.to_string(), "x").unwrap(), c);
        }
    }
}
