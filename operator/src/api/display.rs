//! What a resolved link is, in the user's own units: the summaries of `status` and `kubectl get`
//! ([`ResolvedImpairments::summary`]) and the formatters behind them, which print what the unit parsers
//! ([`crate::unit_syntax`]) read back.

use std::time::Duration;

use isthmus_agent_api::{Impairment, Loss};

use super::impairments::ResolvedImpairments;

/// Human summaries of what is in force, for the status and `kubectl get`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Summary {
    pub latency: String,
    pub loss: String,
    pub bandwidth: String,
    pub expected_round_trip: String,
}

impl ResolvedImpairments {
    pub fn summary(&self) -> Summary {
        let both = |f: &dyn Fn(&Impairment) -> String| match &self.reverse {
            Some(r) => format!("{}/{}", f(&self.forward), f(r)),
            None => f(&self.forward),
        };
        let zero = Duration::ZERO;
        let fwd_latency = self.forward.fields().latency.unwrap_or(zero);
        let rev_latency = self.reverse.as_ref().and_then(|r| r.fields().latency).unwrap_or(zero);
        let fwd_jitter = self.forward.fields().jitter.unwrap_or(zero);
        let rev_jitter = self.reverse.as_ref().and_then(|r| r.fields().jitter).unwrap_or(zero);
        let jitter = fwd_jitter + rev_jitter;
        let mut rtt = format_duration(fwd_latency + rev_latency);
        if !jitter.is_zero() {
            rtt = format!("{rtt} ± {}", format_duration(jitter));
        }
        if self.reverse.is_none() {
            rtt.push_str(" (return path not impaired)");
        }
        Summary {
            latency: both(&|i| {
                let base = format_duration(i.fields().latency.unwrap_or(zero));
                match i.fields().jitter {
                    Some(j) if !j.is_zero() => format!("{base}±{}", format_duration(j)),
                    _ => base,
                }
            }),
            loss: both(&|i| match &i.fields().loss {
                None => "0%".into(),
                Some(Loss::Random(c)) => format!("{}%", c.percent.value()),
                Some(Loss::GilbertElliott { .. }) => "GE".into(),
            }),
            bandwidth: both(&|i| i.fields().rate_bps.map_or_else(|| "-".into(), format_rate)),
            expected_round_trip: rtt,
        }
    }
}

/// `120ms`, `1.5s`, `500us`, `0`: the same vocabulary the user writes.
pub fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        return "0".into();
    }
    let (unit, per) = if ns >= 1_000_000_000 {
        ("s", 1e9)
    } else if ns >= 1_000_000 {
        ("ms", 1e6)
    } else if ns >= 1_000 {
        ("us", 1e3)
    } else {
        ("ns", 1.0)
    };
    format!("{}{unit}", trim(ns as f64 / per))
}

pub fn format_rate(bps: u64) -> String {
    let (unit, per) = if bps >= 1_000_000_000 {
        ("Gbit", 1e9)
    } else if bps >= 1_000_000 {
        ("Mbit", 1e6)
    } else if bps >= 1_000 {
        ("kbit", 1e3)
    } else {
        ("bit", 1.0)
    };
    format!("{}{unit}", trim(bps as f64 / per))
}

fn trim(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(format_duration(Duration::from_micros(1500)), "1.5ms");
        assert_eq!(format_duration(Duration::from_secs(2)), "2s");
        assert_eq!(format_rate(1_500_000_000), "1.5Gbit");
        assert_eq!(format_rate(64_000), "64kbit");
    }
}
