//! Every unit parser on arbitrary text: never panics, and agrees with the CRD schema's pattern (what parses
//! matches the pattern; for percentages and sizes the pattern alone decides, so the reverse holds too).
#![no_main]

use std::sync::LazyLock;

use isthmus_operator::units::*;
use libfuzzer_sys::fuzz_target;
use regex::Regex;

static DURATION: LazyLock<Regex> = LazyLock::new(|| Regex::new(DURATION_PATTERN).unwrap());
static PERCENT: LazyLock<Regex> = LazyLock::new(|| Regex::new(PERCENT_PATTERN).unwrap());
static RATE: LazyLock<Regex> = LazyLock::new(|| Regex::new(RATE_PATTERN).unwrap());
static SIZE: LazyLock<Regex> = LazyLock::new(|| Regex::new(SIZE_PATTERN).unwrap());

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if parse_duration(s).is_ok() {
        assert!(DURATION.is_match(s), "{s:?}");
    }
    assert_eq!(parse_percent(s).is_ok(), PERCENT.is_match(s), "{s:?}");
    if parse_rate(s).is_ok() {
        assert!(RATE.is_match(s), "{s:?}");
    }
    assert_eq!(parse_size(s).is_ok(), SIZE.is_match(s), "{s:?}");
});
