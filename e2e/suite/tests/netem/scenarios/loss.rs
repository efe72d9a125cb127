//! Loss: random, and Gilbert–Elliott bursts. Only the forward direction is impaired, so a probe is lost exactly
//! when its request is.

use isthmus_e2e::verdict::within;
use isthmus_e2e::*;

use crate::bands::{Baseline, SIGMAS, proportion_band};
use crate::fixture::Fixture;

/// Probes per loss measurement, 5 ms apart (faster sends overrun an emulated node's CPU, which then drops
/// datagrams of its own): at 5 % the binomial standard deviation is 0.49 %, so the band is ±2.2 %.
const PROBES: u32 = 2000;

/// 5 % random loss, measured over 2,000 probes.
pub fn random_loss(f: &Fixture) {
    let base = Baseline::measure(&f.ns, &f.client.name, &f.server.ip);
    let link = f.one_way("loss", "client", "server", "{loss: {percent: 5%}}");
    let r = f.clean_run("5% loss", RttRun::new(PROBES).interval_ms(5));
    within(
        "loss ratio",
        r.loss_ratio(),
        proportion_band(0.05 + base.loss, f64::from(PROBES), 1.0),
        "5 % plus the baseline's, ±4.5 σ binomial, in a run no full receive buffer dropped from",
    );
    drop(link);
}

/// Gilbert–Elliott, p = 5 % (good → bad), r = 40 % (bad → good), every packet lost in the bad state and none in the
/// good one: mean loss p / (p + r) = 11.1 %, losses in bursts of mean length 1 / r = 2.5.
pub fn gilbert_elliott_loss(f: &Fixture) {
    let base = Baseline::measure(&f.ns, &f.client.name, &f.server.ip);
    let link = f.one_way(
        "gilbert",
        "client",
        "server",
        "{loss: {gilbertElliott: {p: 5%, r: 40%, lossInBad: 100%, lossInGood: 0%}}}",
    );
    // A full receive buffer also drops a burst of its own, which no counter tells apart from the link's.
    let r = f.clean_run("Gilbert-Elliott", RttRun::new(PROBES).interval_ms(5));
    let (p, q) = (0.05f64, 0.40f64);
    let mean_loss = p / (p + q) + base.loss;
    // Consecutive states are correlated (λ = 1 − p − r): the variance of the mean grows by (1 + λ) / (1 − λ).
    let lambda = 1.0 - p - q;
    within(
        "loss ratio",
        r.loss_ratio(),
        proportion_band(mean_loss, f64::from(PROBES), (1.0 + lambda) / (1.0 - lambda)),
        "p/(p+r) = 11.1 %, ±4.5 σ of a two-state Markov chain",
    );
    let (bursts, mean_burst) = r.loss_bursts();
    // Burst lengths are geometric with mean 1/r and standard deviation √(1−r)/r.
    let se = (1.0 - q).sqrt() / q / (bursts.max(1) as f64).sqrt();
    within(
        "mean loss burst length",
        mean_burst,
        (1.0 / q - SIGMAS * se, 1.0 / q + SIGMAS * se),
        &format!("1/r = 2.5 over {bursts} bursts, ±4.5 standard errors"),
    );
    drop(link);
}
