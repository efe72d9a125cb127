//! Every unit parser on arbitrary text: never panics, agrees with the CRD schema's pattern (what parses
//! matches the pattern; for percentages and sizes the pattern alone decides, so the reverse holds too), keeps
//! its values in range, and what the status formatters print for a parsed value parses back to that value
//! (to the formatter's three decimals).
#![no_main]

use std::sync::LazyLock;
use std::time::Duration;

use isthmus_agent_api::impairment::MAX_DELAY;
use isthmus_operator::api::display::{format_duration, format_rate};
use isthmus_operator::unit_syntax::*;
use libfuzzer_sys::fuzz_target;
use regex::Regex;

static DURATION: LazyLock<Regex> = LazyLock::new(|| Regex::new(DURATION_PATTERN).unwrap());
static PERCENT: LazyLock<Regex> = LazyLock::new(|| Regex::new(PERCENT_PATTERN).unwrap());
static RATE: LazyLock<Regex> = LazyLock::new(|| Regex::new(RATE_PATTERN).unwrap());
static SIZE: LazyLock<Regex> = LazyLock::new(|| Regex::new(SIZE_PATTERN).unwrap());

/// The formatters print three decimals of the chosen unit, so half a thousandth of it is the most they lose.
fn formatting_tolerance(value: f64) -> f64 {
    let unit = [1e9, 1e6, 1e3, 1.0].into_iter().find(|u| value >= *u).unwrap_or(1.0);
    unit / 2000.0 + 1.0
}

fn check_duration(s: &str) {
    let Ok(d) = parse_duration(s) else { return };
    assert!(DURATION.is_match(s), "{s:?}");
    assert!(d <= MAX_DELAY, "{s:?} parsed to {d:?}, above the maximum");
    let printed = format_duration(d);
    let back = parse_duration(&printed).unwrap_or_else(|e| panic!("{s:?} → {d:?} printed as {printed:?}: {e}"));
    let (a, b) = (d.as_nanos() as f64, back.as_nanos() as f64);
    assert!((a - b).abs() <= formatting_tolerance(a), "{s:?} → {d:?} → {printed:?} → {back:?}");
    if d == Duration::ZERO {
        assert_eq!(printed, "0");
    }
}

fn check_percent(s: &str) {
    let parsed = parse_percent(s);
    assert_eq!(parsed.is_ok(), PERCENT.is_match(s), "{s:?}");
    if let Ok(p) = parsed {
        assert!((0.0..=100.0).contains(&p), "{s:?} parsed to {p}");
    }
}

fn check_rate(s: &str) {
    let Ok(bps) = parse_rate(s) else { return };
    assert!(RATE.is_match(s), "{s:?}");
    assert!((MIN_RATE_BPS..=MAX_RATE_BPS).contains(&(bps as f64)), "{s:?} parsed to {bps}");
    let printed = format_rate(bps);
    let back = parse_rate(&printed).unwrap_or_else(|e| panic!("{s:?} → {bps} printed as {printed:?}: {e}"));
    let (a, b) = (bps as f64, back as f64);
    assert!((a - b).abs() <= formatting_tolerance(a), "{s:?} → {bps} → {printed:?} → {back}");
}

fn check_size(s: &str) {
    let parsed = parse_size(s);
    assert_eq!(parsed.is_ok(), SIZE.is_match(s), "{s:?}");
    if let Ok(bytes) = parsed {
        // The unit is the tail after the digits; the value is exactly digits × unit.
        let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap();
        let (digits, unit) = s.split_at(digits_end);
        let multiplier = match unit {
            "B" => 1u64,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            other => panic!("{s:?} parsed with unit {other:?}"),
        };
        assert_eq!(bytes, digits.parse::<u64>().unwrap() * multiplier, "{s:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    check_duration(s);
    check_percent(s);
    check_rate(s);
    check_size(s);
});
