//! An impairment in the words of the NetworkLink API (`delay 40ms ±5ms, loss 0.1%, 10Mbit`), with the
//! operator's own formatters.

use isthmus_agent_api::{Impairment, Loss};
use isthmus_operator::api::display::{format_duration, format_rate};

pub fn describe(imp: &Impairment) -> String {
    let f = imp.fields();
    let mut parts = Vec::new();
    if let Some(latency) = f.latency {
        let mut s = format!("delay {}", format_duration(latency));
        if let Some(j) = f.jitter.filter(|j| !j.is_zero()) {
            s.push_str(&format!(" ±{}", format_duration(j)));
        }
        parts.push(s);
    }
    match f.loss {
        None => {}
        Some(Loss::Random(c)) => parts.push(format!("loss {}%", c.percent.value())),
        Some(Loss::GilbertElliott { p, r, .. }) => {
            parts.push(format!("loss Gilbert-Elliott p {}% r {}%", p.value(), r.value()))
        }
    }
    for (name, c) in [("duplicate", f.duplicate), ("corrupt", f.corrupt)] {
        if let Some(c) = c {
            parts.push(format!("{name} {}%", c.percent.value()));
        }
    }
    if let Some(r) = f.reorder {
        parts.push(format!("reorder {}%", r.percent.value()));
    }
    if let Some(rate) = f.rate_bps {
        parts.push(format_rate(rate));
    }
    if let Some(limit) = f.queue_limit_packets {
        parts.push(format!("queue {limit} packets"));
    }
    if parts.is_empty() { "none (passes traffic unchanged)".into() } else { parts.join(", ") }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use isthmus_agent_api::{Correlated, ImpairmentFields, Percent};

    use super::*;

    #[test]
    fn every_field_set_reads_in_the_api_vocabulary() {
        let imp = Impairment::try_from(ImpairmentFields {
            latency: Some(Duration::from_millis(40)),
            jitter: Some(Duration::from_millis(5)),
            loss: Some(Loss::Random(Correlated { percent: Percent::new("p", 0.1).unwrap(), ..Default::default() })),
            rate_bps: Some(10_000_000),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(describe(&imp), "delay 40ms ±5ms, loss 0.1%, 10Mbit");
        assert_eq!(describe(&Impairment::default()), "none (passes traffic unchanged)");
    }
}
