//! The units people write in a NetworkLink, parsed in one place.
//!
//! Every parser here has a twin in the CRD schema: a regular expression (`*_PATTERN`, put into the schema's
//! `pattern`) and, where a range matters, a CEL rule that computes the value the same way. The property tests
//! at the bottom check that the two agree, so that nothing the API server admits fails here (or the reverse).
//!
//! - durations: `0`, `500us`, `120ms`, `1.5s` (units `ns`, `us`, `ms`, `s`); at most one hour;
//! - percentages: `0.1%`, `25%`, `100%` (0 to 100, the `%` is required);
//! - rates in **bits** per second: `64kbit`, `100Mbit`, `1.5Gbit` (SI prefixes, 1 kbit = 1000 bit), 100
//!   bit/s to 1000 Gbit/s. `bps`, `mbps`, `MBps` and friends are refused: tc reads `bps` as *bytes* per second
//!   while most people mean bits, and that confusion has shipped in other tools;
//! - sizes in bytes: `1500B`, `32KiB`, `1MiB`, `1GiB` (binary prefixes).

use std::time::Duration;

use isthmus_agent_api::impairment::MAX_DELAY;

/// The schema pattern of a duration; CEL additionally bounds it by [`MAX_DELAY`].
pub const DURATION_PATTERN: &str = r"^(0|[0-9]{1,13}(\.[0-9]{1,9})?(ns|us|ms|s))$";
/// The schema pattern of a percentage; the pattern alone bounds it to 0..=100.
pub const PERCENT_PATTERN: &str = r"^(100(\.0{1,9})?|[0-9]{1,2}(\.[0-9]{1,9})?)%$";
/// The schema pattern of a rate in bits per second; CEL bounds it to [`MIN_RATE_BPS`]..=[`MAX_RATE_BPS`].
pub const RATE_PATTERN: &str = r"^[0-9]{1,13}(\.[0-9]{1,9})?(bit|kbit|Mbit|Gbit)$";
/// The schema pattern of a size in bytes; CEL bounds it (see [`parse_size`] callers).
pub const SIZE_PATTERN: &str = r"^[0-9]{1,10}(B|KiB|MiB|GiB)$";

/// The slowest rate: the agent's default token bucket (3,200 bytes, `agent::datapath::units`) must refill within
/// the kernel's 274 s ([`isthmus_agent_api::MAX_BUCKET_TIME`]), which it does at 94 bit/s and above.
pub const MIN_RATE_BPS: f64 = 100.0;
pub const MAX_RATE_BPS: f64 = 1e12;

/// CEL for the bits per second of the rate string at `path` (e.g. `self.bandwidth`), a double computed as
/// [`parse_rate`] does.
pub fn cel_rate_bits(path: &str) -> String {
    format!(
        "(double({path}.find('^[0-9.]+')) * ({path}.endsWith('Gbit') ? 1e9 : {path}.endsWith('Mbit') ? 1e6 : \
         {path}.endsWith('kbit') ? 1e3 : 1.0))"
    )
}

/// CEL for the bytes of the size string at `path` (e.g. `self.burst`), a double computed as [`parse_size`] does
/// (a double, so that the largest sizes cannot overflow CEL's integers).
pub fn cel_size_bytes(path: &str) -> String {
    format!(
        "(double({path}.find('^[0-9]+')) * ({path}.endsWith('GiB') ? 1073741824.0 : {path}.endsWith('MiB') ? \
         1048576.0 : {path}.endsWith('KiB') ? 1024.0 : 1.0))"
    )
}

/// Why a unit string was refused. The message is written for the person who typed the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input:?}: {reason}")]
pub struct UnitError {
    pub input: String,
    pub reason: String,
}

fn err(input: &str, reason: impl Into<String>) -> UnitError {
    UnitError { input: input.to_owned(), reason: reason.into() }
}

/// Splits `12.5ms` into (`12`, `5`, `ms`); digits are ASCII only and bounded like the schema patterns.
fn split_number(input: &str, max_int: usize, max_frac: usize) -> Result<(&str, Option<&str>, &str), UnitError> {
    let number_end = input.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(input.len());
    let (number, unit) = input.split_at(number_end);
    let (int, frac) = match number.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (number, None),
    };
    if int.is_empty() {
        return Err(err(input, "must start with a number, e.g. 120ms, 0.1%, 100Mbit, 32KiB"));
    }
    if int.len() > max_int {
        return Err(err(input, format!("at most {max_int} digits before the decimal point")));
    }
    if let Some(f) = frac
        && (f.is_empty() || f.contains('.') || f.len() > max_frac)
    {
        return Err(err(input, format!("a decimal fraction has 1 to {max_frac} digits")));
    }
    Ok((int, frac, unit))
}

/// Parses a duration such as `120ms`, `1.5s`, `500us` or `0`. Fractions below a nanosecond are dropped.
pub fn parse_duration(input: &str) -> Result<Duration, UnitError> {
    if input == "0" {
        return Ok(Duration::ZERO);
    }
    let (int, frac, unit) = split_number(input, 13, 9)?;
    let unit_ns: u128 = match unit {
        "ns" => 1,
        "us" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "" => return Err(err(input, "needs a unit: ns, us, ms or s (e.g. 120ms); only 0 may stand alone")),
        "µs" => return Err(err(input, "write microseconds as us")),
        "m" | "min" | "h" => return Err(err(input, "use s for long durations (e.g. 90s)")),
        other => return Err(err(input, format!("unknown unit {other:?}; use ns, us, ms or s"))),
    };
    // Exact integer arithmetic: 13 digits times 1e9 fits u128 with room to spare.
    let mut nanos = int.parse::<u128>().map_err(|e| err(input, e.to_string()))? * unit_ns;
    if let Some(f) = frac {
        let digits = f.parse::<u128>().map_err(|e| err(input, e.to_string()))?;
        nanos += digits * unit_ns / 10u128.pow(f.len() as u32);
    }
    let max = MAX_DELAY.as_nanos();
    if nanos > max {
        return Err(err(input, format!("longer than the maximum of {}s", MAX_DELAY.as_secs())));
    }
    Ok(Duration::from_nanos(nanos as u64))
}

/// Parses a percentage such as `0.1%` into its number (0.1).
pub fn parse_percent(input: &str) -> Result<f64, UnitError> {
    let Some(number) = input.strip_suffix('%') else {
        return Err(err(input, "a percentage ends in % (e.g. 0.1%)"));
    };
    let (int, frac, rest) = split_number(number, 3, 9)?;
    if !rest.is_empty() {
        return Err(err(input, "a percentage is a number followed by % (e.g. 0.1%)"));
    }
    if int.len() == 3 && (int != "100" || frac.is_some_and(|f| f.bytes().any(|b| b != b'0'))) {
        return Err(err(input, "must be between 0% and 100% (at most two digits before the point)"));
    }
    let value: f64 = number.parse().map_err(|_| err(input, "not a number"))?;
    if !(0.0..=100.0).contains(&value) {
        return Err(err(input, "must be between 0% and 100%"));
    }
    Ok(value)
}

/// Parses a rate in bits per second such as `100Mbit`, `1.5Gbit` or `64kbit`.
///
/// The value is computed as `f64(number) × multiplier`, exactly as the CRD's CEL rule does, so both agree on
/// the bounds even for numbers that do not fit a double exactly; it is then rounded to whole bits.
pub fn parse_rate(input: &str) -> Result<u64, UnitError> {
    let (_, _, unit) = split_number(input, 13, 9)?;
    let multiplier = match unit {
        "bit" => 1.0,
        "kbit" => 1e3,
        "Mbit" => 1e6,
        "Gbit" => 1e9,
        "" => return Err(err(input, "needs a unit: bit, kbit, Mbit or Gbit (bits per second, e.g. 100Mbit)")),
        other => return Err(err(input, ambiguous_rate_hint(other))),
    };
    let number = &input[..input.len() - unit.len()];
    let value = number.parse::<f64>().map_err(|_| err(input, "not a number"))? * multiplier;
    if !(MIN_RATE_BPS..=MAX_RATE_BPS).contains(&value) {
        return Err(err(input, "must be between 100bit and 1000Gbit"));
    }
    Ok(value.round() as u64)
}

fn ambiguous_rate_hint(unit: &str) -> String {
    let prefix = match unit.chars().next() {
        Some('k' | 'K') => "k",
        Some('m' | 'M') => "M",
        Some('g' | 'G') => "G",
        _ => "",
    };
    let lower = unit.to_ascii_lowercase();
    if lower.ends_with("bps") || lower.ends_with("b/s") || lower.ends_with('b') || lower.ends_with("byte") {
        format!(
            "unit {unit:?} is ambiguous (bits or bytes?); rates are bits per second: write {prefix}bit, \
             e.g. 100Mbit (multiply bytes per second by 8)"
        )
    } else {
        format!("unknown unit {unit:?}; rates are bits per second: bit, kbit, Mbit or Gbit (e.g. 100Mbit)")
    }
}

/// Parses a size in bytes such as `1500B`, `32KiB` or `1MiB`.
pub fn parse_size(input: &str) -> Result<u64, UnitError> {
    if input.contains('.') {
        return Err(err(input, "sizes are whole numbers (e.g. 1536B instead of 1.5KiB)"));
    }
    let (int, _, unit) = split_number(input, 10, 0)?;
    let multiplier: u64 = match unit {
        "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "" => return Err(err(input, "needs a unit: B, KiB, MiB or GiB (e.g. 32KiB)")),
        "k" | "K" | "kB" | "KB" | "kb" | "Kb" | "M" | "MB" | "Mb" | "mb" | "G" | "GB" | "Gb" | "gb" => {
            return Err(err(input, format!("unit {unit:?} is ambiguous; use B, KiB, MiB or GiB")));
        }
        other => return Err(err(input, format!("unknown unit {other:?}; use B, KiB, MiB or GiB"))),
    };
    let n: u64 = int.parse().map_err(|_| err(input, "not a number"))?;
    n.checked_mul(multiplier).ok_or_else(|| err(input, "too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("120ms").unwrap(), Duration::from_millis(120));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("500us").unwrap(), Duration::from_micros(500));
        assert_eq!(parse_duration("0.5s").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("7ns").unwrap(), Duration::from_nanos(7));
        assert_eq!(parse_duration("1.0000000009s").unwrap_err().reason, "a decimal fraction has 1 to 9 digits");
        assert_eq!(parse_duration("3600s").unwrap(), Duration::from_secs(3600));
        assert!(parse_duration("3600.000000001s").unwrap_err().reason.contains("maximum"));
        for bad in ["", "ms", "120", "1.s", ".5s", "1..5s", "-1ms", "1 ms", "1m", "2h", "5µs", "1e3ms", "+1s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} must be refused");
        }
        assert!(parse_duration("120").unwrap_err().reason.contains("needs a unit"));
    }

    #[test]
    fn percents() {
        assert_eq!(parse_percent("0.1%").unwrap(), 0.1);
        assert_eq!(parse_percent("100%").unwrap(), 100.0);
        assert_eq!(parse_percent("0%").unwrap(), 0.0);
        for bad in ["0.1", "101%", "100.5%", "-1%", "%", "1e2%", "1 %", "50%%", "1000%"] {
            assert!(parse_percent(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn rates_are_bits_and_ambiguous_units_are_refused() {
        assert_eq!(parse_rate("100Mbit").unwrap(), 100_000_000);
        assert_eq!(parse_rate("1.5Gbit").unwrap(), 1_500_000_000);
        assert_eq!(parse_rate("64kbit").unwrap(), 64_000);
        assert_eq!(parse_rate("100bit").unwrap(), 100);
        assert_eq!(parse_rate("1000Gbit").unwrap(), 1_000_000_000_000);
        assert!(parse_rate("99bit").is_err());
        assert!(parse_rate("8bit").is_err(), "a default bucket would take 3,200 s to refill");
        assert!(parse_rate("1000.1Gbit").is_err());
        for bad in ["100mbps", "100Mbps", "100MBps", "1MB", "100mbit", "100", "1Kbit", "1Tbit"] {
            assert!(parse_rate(bad).is_err(), "{bad:?} must be refused");
        }
        let hint = parse_rate("100mbps").unwrap_err().to_string();
        assert!(hint.contains("ambiguous") && hint.contains("Mbit"), "{hint}");
        assert!(parse_rate("10MBps").unwrap_err().to_string().contains("Mbit"));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1500B").unwrap(), 1500);
        assert_eq!(parse_size("32KiB").unwrap(), 32 * 1024);
        assert_eq!(parse_size("1MiB").unwrap(), 1 << 20);
        assert_eq!(parse_size("9999999999GiB").unwrap(), 9_999_999_999 << 30);
        for bad in ["1500", "32KB", "32kB", "1.5KiB", "1 KiB", "KiB", "-1B"] {
            assert!(parse_size(bad).is_err(), "{bad:?} must be refused");
        }
        assert!(parse_size("32KB").unwrap_err().reason.contains("ambiguous"));
    }
}

/// Property tests: the Rust parsers and the schema patterns (plus the CEL bounds, computed the same way here)
/// accept exactly the same strings, and no input makes a parser panic.
#[cfg(test)]
mod agreement {
    use proptest::prelude::*;
    use regex::Regex;

    use super::*;

    fn matches(pattern: &str, s: &str) -> bool {
        Regex::new(pattern).unwrap().is_match(s)
    }

    /// Strings built from the alphabet the patterns use, so both matching and near-miss inputs are frequent.
    fn unitish() -> impl Strategy<Value = String> {
        prop::string::string_regex(
            r"[0-9]{0,15}(\.[0-9]{0,11})?(ns|us|ms|s|m|%|bit|kbit|Mbit|Gbit|Mbps|B|KiB|MiB|GiB|kB|)?",
        )
        .unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        #[test]
        fn no_parser_panics_on_any_string(s in any::<String>()) {
            let _ = parse_duration(&s);
            let _ = parse_percent(&s);
            let _ = parse_rate(&s);
            let _ = parse_size(&s);
        }

        #[test]
        fn duration_agrees_with_schema(s in unitish()) {
            let admitted = matches(DURATION_PATTERN, &s);
            match parse_duration(&s) {
                Ok(d) => prop_assert!(admitted && d <= MAX_DELAY, "{s:?} parsed but the schema refuses it"),
                // The CEL rule refuses what exceeds MAX_DELAY; everything else the pattern admits must parse.
                Err(e) => prop_assert!(!admitted || e.reason.contains("maximum"), "{s:?}: {e}"),
            }
        }

        #[test]
        fn percent_agrees_with_schema(s in unitish()) {
            prop_assert_eq!(parse_percent(&s).is_ok(), matches(PERCENT_PATTERN, &s), "{:?}", s);
        }

        #[test]
        fn rate_agrees_with_schema(s in unitish()) {
            let admitted = matches(RATE_PATTERN, &s) && cel_rate_in_range(&s);
            prop_assert_eq!(parse_rate(&s).is_ok(), admitted, "{:?}", s);
        }

        #[test]
        fn size_agrees_with_schema(s in unitish()) {
            prop_assert_eq!(parse_size(&s).is_ok(), matches(SIZE_PATTERN, &s), "{:?}", s);
        }
    }

    /// The CRD's CEL range rule for rates, transcribed: `double(find(number)) * multiplier` within bounds.
    fn cel_rate_in_range(s: &str) -> bool {
        let number = Regex::new(r"^[0-9.]+").unwrap().find(s).unwrap().as_str();
        let mult = if s.ends_with("Gbit") {
            1e9
        } else if s.ends_with("Mbit") {
            1e6
        } else if s.ends_with("kbit") {
            1e3
        } else {
            1.0
        };
        let v = number.parse::<f64>().unwrap() * mult;
        (MIN_RATE_BPS..=MAX_RATE_BPS).contains(&v)
    }
}
