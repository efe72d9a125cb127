//! Two legs through a hub as one impairment (pure): latencies and jitters add (the jitters' bounds add), losses
//! compound (a packet survives both legs), the smaller bandwidth wins. Fields whose two-leg behaviour is not one
//! impairment of the same kind (correlations, bursty loss, duplication, corruption, reordering, bucket and
//! queue sizes) are refused by name.

use std::time::Duration;

use crate::api::quantity::{DurationValue, PercentValue, RateValue};
use crate::api::{ImpairmentSpec, LossSpec};

/// `a` then `b`; `Err` names the first field that does not compose.
pub fn compose(a: &ImpairmentSpec, b: &ImpairmentSpec) -> Result<ImpairmentSpec, &'static str> {
    check(a)?;
    check(b)?;
    let dur = |v: &Option<DurationValue>| v.as_ref().and_then(|d| d.parse().ok()).unwrap_or_default();
    let sum = |x: &Option<DurationValue>, y: &Option<DurationValue>| {
        (x.is_some() || y.is_some()).then(|| exact_duration(dur(x) + dur(y)))
    };
    let loss_of = |s: &ImpairmentSpec| {
        s.loss.as_ref().and_then(|l| l.percent.as_ref()).and_then(|p| p.parse().ok()).unwrap_or(0.0) / 100.0
    };
    let loss = (a.loss.is_some() || b.loss.is_some()).then(|| {
        let survive = (1.0 - loss_of(a)) * (1.0 - loss_of(b));
        LossSpec { percent: Some(percent((1.0 - survive) * 100.0)), correlation: None, gilbert_elliott: None }
    });
    let bandwidth = match (&a.bandwidth, &b.bandwidth) {
        (Some(x), Some(y)) => Some(if rate(x) <= rate(y) { x.clone() } else { y.clone() }),
        (x, y) => x.clone().or_else(|| y.clone()),
    };
    Ok(ImpairmentSpec {
        latency: sum(&a.latency, &b.latency),
        jitter: sum(&a.jitter, &b.jitter),
        loss,
        bandwidth,
        ..Default::default()
    })
}

fn check(s: &ImpairmentSpec) -> Result<(), &'static str> {
    let refused = [
        (s.jitter_correlation.is_some(), "jitterCorrelation"),
        (s.loss.as_ref().is_some_and(|l| l.gilbert_elliott.is_some()), "loss.gilbertElliott"),
        (s.loss.as_ref().is_some_and(|l| l.correlation.is_some()), "loss.correlation"),
        (s.duplicate.is_some(), "duplicate"),
        (s.corrupt.is_some(), "corrupt"),
        (s.reorder.is_some(), "reorder"),
        (s.burst.is_some(), "burst"),
        (s.queue_limit.is_some(), "queueLimit"),
    ];
    match refused.into_iter().find(|(set, _)| *set) {
        Some((_, field)) => Err(field),
        None => Ok(()),
    }
}

fn rate(r: &RateValue) -> u64 {
    r.parse().unwrap_or(u64::MAX)
}

/// A duration written exactly (to the nanosecond) in milliseconds, e.g. `76.5ms`, `0.000001ms` for 1 ns.
pub fn exact_duration(d: Duration) -> DurationValue {
    let ns = d.as_nanos();
    if ns == 0 {
        return DurationValue("0".into());
    }
    let (ms, frac) = (ns / 1_000_000, ns % 1_000_000);
    let text = if frac == 0 {
        format!("{ms}ms")
    } else {
        let f = format!("{frac:06}");
        format!("{ms}.{}ms", f.trim_end_matches('0'))
    };
    DurationValue(text)
}

/// A percentage in the API's form, to nine decimals.
pub fn percent(p: f64) -> PercentValue {
    let p = p.clamp(0.0, 100.0);
    let s = format!("{p:.9}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    PercentValue(format!("{s}%"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn leg(latency: &str, jitter: Option<&str>, loss: Option<&str>, bw: Option<&str>) -> ImpairmentSpec {
        ImpairmentSpec {
            latency: Some(latency.into()),
            jitter: jitter.map(Into::into),
            loss: loss.map(|p| LossSpec { percent: Some(p.into()), correlation: None, gilbert_elliott: None }),
            bandwidth: bw.map(Into::into),
            ..Default::default()
        }
    }

    #[test]
    fn legs_add_up() {
        let c = compose(
            &leg("40ms", Some("2ms"), Some("1%"), Some("100Mbit")),
            &leg("35.5ms", None, Some("1%"), Some("1Gbit")),
        )
        .unwrap();
        assert_eq!(c.latency.unwrap().0, "75.5ms");
        assert_eq!(c.jitter.unwrap().0, "2ms");
        assert_eq!(c.loss.unwrap().percent.unwrap().0, "1.99%");
        assert_eq!(c.bandwidth.unwrap().0, "100Mbit");
    }

    #[test]
    fn fields_that_do_not_add_up_are_named() {
        let mut odd = leg("1ms", None, None, None);
        odd.duplicate = Some(crate::api::CorrelatedSpec { percent: "1%".into(), correlation: None });
        assert_eq!(compose(&odd, &leg("1ms", None, None, None)), Err("duplicate"));
        odd.duplicate = None;
        odd.burst = Some("32KiB".into());
        assert_eq!(compose(&leg("1ms", None, None, None), &odd), Err("burst"));
    }

    #[test]
    fn exact_durations_parse_back() {
        for ns in [0u64, 1, 999, 1_000, 76_500_000, 3_600_000_000_000, 123_456_789] {
            let d = Duration::from_nanos(ns);
            assert_eq!(exact_duration(d).parse().unwrap(), d, "{}", exact_duration(d));
        }
    }

    proptest! {
        #[test]
        fn composition_is_the_sum_of_its_legs(a in 0u64..1_800_000_000_000, b in 0u64..1_800_000_000_000,
                                              p in 0.0f64..100.0, q in 0.0f64..100.0) {
            let (da, db) = (Duration::from_nanos(a), Duration::from_nanos(b));
            let x = ImpairmentSpec { latency: Some(exact_duration(da)), loss: Some(LossSpec { percent: Some(percent(p)), correlation: None, gilbert_elliott: None }), ..Default::default() };
            let y = ImpairmentSpec { latency: Some(exact_duration(db)), loss: Some(LossSpec { percent: Some(percent(q)), correlation: None, gilbert_elliott: None }), ..Default::default() };
            let c = compose(&x, &y).unwrap();
            prop_assert_eq!(c.latency.unwrap().parse().unwrap(), da + db);
            let got = c.loss.unwrap().percent.unwrap().parse().unwrap();
            let p = percent(p).parse().unwrap() / 100.0;
            let q = percent(q).parse().unwrap() / 100.0;
            prop_assert!((got / 100.0 - (1.0 - (1.0 - p) * (1.0 - q))).abs() < 1e-8);
            // Composition is symmetric in what it computes.
            prop_assert_eq!(compose(&y, &x).unwrap().latency, compose(&x, &y).unwrap().latency);
        }
    }
}
