//! When a provider's machine may run work: availability windows in its local time
//! (`flotilla worker --available "mon-fri 19:00-07:00; sat,sun 00:00-24:00"`).
//!
//! A window is a set of days and a span of the day; a span that ends at or before its start
//! runs past midnight into the next day (`mon-fri 19:00-07:00` is Monday 19:00 to Tuesday
//! 07:00, …, Friday 19:00 to Saturday 07:00). Days: `mon` … `sun`, ranges (`mon-fri`,
//! `fri-mon` wraps), lists (`sat,sun`), `daily` or `*`, `weekdays`, `weekends`.
//! Windows are separated by `;`; `always` is every day, all day. Pure: the caller reads the clock.

use std::fmt;

use crate::error::PoolError;

const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

/// One window: days (bit 0 Monday … bit 6 Sunday) and minutes of the day.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Window {
    days: u8,
    start: u16,
    end: u16,
}

/// A machine's availability windows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Windows {
    windows: Vec<Window>,
    text: String,
}

impl Windows {
    /// Parses `"mon-fri 19:00-07:00; sat,sun 00:00-24:00"`.
    pub fn parse(text: &str) -> Result<Windows, PoolError> {
        let bad = |why: String| PoolError::BadWindow {
            value: text.to_string(),
            why,
        };
        // What `admin provider list` shows for a machine with no windows.
        if text.trim().eq_ignore_ascii_case("always") {
            return Ok(Windows {
                windows: vec![Window {
                    days: 0x7f,
                    start: 0,
                    end: 24 * 60,
                }],
                text: "always".into(),
            });
        }
        let mut windows = Vec::new();
        for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (days, span) = part
                .split_once(char::is_whitespace)
                .ok_or_else(|| bad(format!("{part:?} is not DAYS HH:MM-HH:MM")))?;
            let days = parse_days(days.trim()).map_err(&bad)?;
            let (a, b) = span
                .trim()
                .split_once('-')
                .ok_or_else(|| bad(format!("{span:?} is not HH:MM-HH:MM")))?;
            let start = parse_time(a.trim()).map_err(&bad)?;
            let end = parse_time(b.trim()).map_err(&bad)?;
            if start == 24 * 60 {
                return Err(bad("a window cannot start at 24:00".into()));
            }
            windows.push(Window { days, start, end });
        }
        if windows.is_empty() {
            return Err(bad("no window given".into()));
        }
        Ok(Windows {
            windows,
            text: text.trim().to_string(),
        })
    }

    /// Whether the machine may work at `minute` (0..1440) of `weekday` (0 Monday … 6
    /// Sunday), local time.
    pub fn contains(&self, weekday: u8, minute: u16) -> bool {
        let day = 1u8 << (weekday % 7);
        let yesterday = 1u8 << ((weekday + 6) % 7);
        self.windows.iter().any(|w| {
            if w.start < w.end {
                w.days & day != 0 && (w.start..w.end).contains(&minute)
            } else {
                // Past midnight (a span of a whole day when start == end).
                (w.days & day != 0 && minute >= w.start)
                    || (w.days & yesterday != 0 && minute < w.end)
            }
        })
    }
}

impl fmt::Display for Windows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

fn day(name: &str) -> Result<u8, String> {
    DAYS.iter()
        .position(|d| name.eq_ignore_ascii_case(d))
        .map(|i| i as u8)
        .ok_or_else(|| format!("unknown day {name:?} (mon, tue, wed, thu, fri, sat, sun)"))
}

fn parse_days(s: &str) -> Result<u8, String> {
    match s.to_ascii_lowercase().as_str() {
        "*" | "daily" => return Ok(0x7f),
        "weekdays" => return Ok(0x1f),
        "weekends" => return Ok(0x60),
        _ => {}
    }
    let mut set = 0u8;
    for item in s.split(',').map(str::trim) {
        match item.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (day(a.trim())?, day(b.trim())?);
                let mut d = a;
                loop {
                    set |= 1 << d;
                    if d == b {
                        break;
                    }
                    d = (d + 1) % 7;
                }
            }
            None => set |= 1 << day(item)?,
        }
    }
    Ok(set)
}

fn parse_time(s: &str) -> Result<u16, String> {
    let (h, m) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?} is not HH:MM"))?;
    let h: u16 = h.parse().map_err(|_| format!("{s:?}: bad hour"))?;
    let m: u16 = m.parse().map_err(|_| format!("{s:?}: bad minute"))?;
    if m >= 60 || h > 24 || (h == 24 && m != 0) {
        return Err(format!("{s:?} is not a time of day (00:00 to 24:00)"));
    }
    Ok(h * 60 + m)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MON: u8 = 0;
    const TUE: u8 = 1;
    const FRI: u8 = 4;
    const SAT: u8 = 5;
    const SUN: u8 = 6;

    fn at(h: u16, m: u16) -> u16 {
        h * 60 + m
    }

    #[test]
    fn evening_windows_run_past_midnight_into_the_next_day() {
        let w = Windows::parse("mon-fri 19:00-07:00").unwrap();
        assert!(!w.contains(MON, at(18, 59)));
        assert!(w.contains(MON, at(19, 0)));
        assert!(w.contains(TUE, at(6, 59)), "Monday night, Tuesday morning");
        assert!(!w.contains(TUE, at(7, 0)));
        assert!(!w.contains(MON, at(6, 0)), "Sunday night is not in it");
        assert!(w.contains(SAT, at(6, 0)), "Friday night runs into Saturday");
        assert!(!w.contains(SAT, at(20, 0)));
        assert_eq!(w.to_string(), "mon-fri 19:00-07:00");
    }

    #[test]
    fn lists_wrapping_ranges_and_whole_days() {
        let w = Windows::parse("sat,sun 00:00-24:00; fri-mon 12:00-13:00").unwrap();
        assert!(w.contains(SAT, at(0, 0)) && w.contains(SUN, at(23, 59)));
        assert!(w.contains(MON, at(12, 30)) && w.contains(FRI, at(12, 0)));
        assert!(!w.contains(TUE, at(12, 30)));
        let all = Windows::parse("daily 00:00-00:00").unwrap();
        assert!((0..7).all(|d| all.contains(d, at(0, 0)) && all.contains(d, at(23, 59))));
        let always = Windows::parse(" Always ").unwrap();
        assert!((0..7).all(|d| always.contains(d, at(0, 0)) && always.contains(d, at(23, 59))));
        assert_eq!(always.to_string(), "always");
    }

    #[test]
    fn bad_windows_say_what_is_wrong() {
        for (bad, says) in [
            ("", "no window"),
            ("mon", "DAYS HH:MM-HH:MM"),
            ("funday 10:00-11:00", "unknown day"),
            ("mon 10-11", "HH:MM"),
            ("mon 25:00-26:00", "time of day"),
            ("mon 10:00", "HH:MM-HH:MM"),
            ("mon 24:00-01:00", "24:00"),
        ] {
            let e = Windows::parse(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }
}
