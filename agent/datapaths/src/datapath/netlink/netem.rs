//! netem (`net/sched/sch_netem.c`). TCA_OPTIONS is `struct tc_netem_qopt` (6 × u32) *followed by* attributes,
//! not a nest.
//!
//! Encoding: the qopt, then always `LATENCY64`, `JITTER64`, `CORR`, `REORDER`, `CORRUPT`, and `LOSS` (nest with
//! `NETEM_LOSS_GE`) for the Gilbert-Elliott model. `netem_change` only touches the fields whose attribute is
//! present, so a change must carry every one of them (iproute2 leaves out the zero ones and the 64-bit delays
//! below 2^32 ticks). `qopt.latency`/`jitter` hold the delays in ticks saturated to u32, as `netem_dump` reports
//! them; the kernel takes the 64-bit attributes over them.
//!
//! Decoding reads what `netem_dump` always sends (qopt, LATENCY64, JITTER64, CORR, REORDER, CORRUPT, RATE,
//! PRNG_SEED, and LOSS for a non-random loss model). Without LATENCY64/JITTER64 (pre-4.15 kernels, iproute2
//! requests) the delays are qopt ticks × 64 ns. Settings the model cannot express (a rate, ECN, slots, the
//! 4-state loss model) are a [`DecodeError::Unsupported`] naming the attribute, never silently dropped.
//!
//! Exactness rules the encoder enforces: `latency_ns ≥ 0`; `0 ≤ jitter_ns ≤ i32::MAX` (the kernel stores
//! `min(|jitter|, INT_MAX)`); `NetemLoss::Random` with probability and correlation both 0 is `NetemLoss::None`.

use super::attrs::{self, u32_at};
use super::{DecodeError, EncodeError};
use crate::datapath::model::{Netem, NetemLoss};
use crate::datapath::psched::PSCHED_SHIFT;

const TCA_NETEM_CORR: u16 = 1;
const TCA_NETEM_REORDER: u16 = 3;
const TCA_NETEM_CORRUPT: u16 = 4;
const TCA_NETEM_LOSS: u16 = 5;
const TCA_NETEM_RATE: u16 = 6;
const TCA_NETEM_ECN: u16 = 7;
const TCA_NETEM_RATE64: u16 = 8;
const TCA_NETEM_LATENCY64: u16 = 10;
const TCA_NETEM_JITTER64: u16 = 11;
const TCA_NETEM_SLOT: u16 = 12;
const NETEM_LOSS_GI: u16 = 1;
const NETEM_LOSS_GE: u16 = 2;
const TC_NETEM_QOPT_LEN: usize = 24;
const NLA_F_NESTED: u16 = 0x8000;

fn saturated_ticks(ns: i64) -> u32 {
    // netem_dump: min_t(psched_time_t /* u64 */, PSCHED_NS2TICKS(ns), UINT_MAX).
    u32::try_from((ns as u64) >> PSCHED_SHIFT).unwrap_or(u32::MAX)
}

fn words(values: &[u32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

pub(super) fn encode(netem: &Netem) -> Result<Vec<u8>, EncodeError> {
    const OBJECT: &str = "netem";
    if netem.latency_ns < 0 {
        return Err(EncodeError::out_of_range(OBJECT, "latency_ns", netem.latency_ns, "must not be negative"));
    }
    if !(0..=i64::from(i32::MAX)).contains(&netem.jitter_ns) {
        return Err(EncodeError::out_of_range(
            OBJECT,
            "jitter_ns",
            netem.jitter_ns,
            "the kernel keeps min(|jitter|, 2^31 - 1) ns",
        ));
    }
    let (random_loss, loss_correlation) = match netem.loss {
        NetemLoss::None => (0, 0),
        NetemLoss::Random { probability: 0, correlation: 0 } => {
            return Err(EncodeError::out_of_range(OBJECT, "loss", "Random { 0, 0 }", "that is NetemLoss::None"));
        }
        NetemLoss::Random { probability, correlation } => (probability, correlation),
        NetemLoss::GilbertElliott { .. } => (0, 0),
    };
    let mut out = words(&[
        saturated_ticks(netem.latency_ns),
        netem.limit_packets,
        random_loss,
        netem.gap,
        netem.duplicate,
        saturated_ticks(netem.jitter_ns),
    ]);
    attrs::push(&mut out, TCA_NETEM_LATENCY64, &netem.latency_ns.to_ne_bytes());
    attrs::push(&mut out, TCA_NETEM_JITTER64, &netem.jitter_ns.to_ne_bytes());
    attrs::push(
        &mut out,
        TCA_NETEM_CORR,
        &words(&[netem.delay_correlation, loss_correlation, netem.duplicate_correlation]),
    );
    attrs::push(&mut out, TCA_NETEM_REORDER, &words(&[netem.reorder, netem.reorder_correlation]));
    attrs::push(&mut out, TCA_NETEM_CORRUPT, &words(&[netem.corrupt, netem.corrupt_correlation]));
    if let NetemLoss::GilbertElliott { p, r, h, k1 } = netem.loss {
        let mut nest = Vec::new();
        attrs::push(&mut nest, NETEM_LOSS_GE, &words(&[p, r, h, k1]));
        // Flagged as a nest like iproute2 does; the kernel's netlink parser accepts both.
        attrs::push(&mut out, TCA_NETEM_LOSS | NLA_F_NESTED, &nest);
    }
    Ok(out)
}

pub(super) fn decode(options: &[u8]) -> Result<Netem, DecodeError> {
    const OBJECT: &str = "netem";
    let qopt = attrs::fixed::<TC_NETEM_QOPT_LEN>(OBJECT, "tc_netem_qopt", options)?;
    let attrs = attrs::parse(OBJECT, &options[TC_NETEM_QOPT_LEN..])?;
    let pair = |kind: u16, field: &'static str| -> Result<(u32, u32), DecodeError> {
        attrs::find(&attrs, kind).map_or(Ok((0, 0)), |v| {
            let b = attrs::fixed::<8>(OBJECT, field, v)?;
            Ok((u32_at(&b, 0), u32_at(&b, 4)))
        })
    };
    let unsupported = |field: &'static str, detail: String| DecodeError::Unsupported { object: OBJECT, field, detail };
    let delay64 = |kind: u16, field: &'static str, ticks: u32| -> Result<i64, DecodeError> {
        attrs::find(&attrs, kind).map_or(Ok(i64::from(ticks) << PSCHED_SHIFT), |v| {
            attrs::fixed::<8>(OBJECT, field, v).map(i64::from_ne_bytes)
        })
    };

    let (delay_correlation, loss_correlation, duplicate_correlation) = match attrs::find(&attrs, TCA_NETEM_CORR) {
        Some(v) => {
            let b = attrs::fixed::<12>(OBJECT, "TCA_NETEM_CORR", v)?;
            (u32_at(&b, 0), u32_at(&b, 4), u32_at(&b, 8))
        }
        None => (0, 0, 0),
    };
    let (reorder, reorder_correlation) = pair(TCA_NETEM_REORDER, "TCA_NETEM_REORDER")?;
    let (corrupt, corrupt_correlation) = pair(TCA_NETEM_CORRUPT, "TCA_NETEM_CORRUPT")?;

    let random_loss = u32_at(&qopt, 8);
    let loss = match attrs::find(&attrs, TCA_NETEM_LOSS) {
        Some(nest) => {
            let models = attrs::parse(OBJECT, nest)?;
            if let Some(ge) = attrs::find(&models, NETEM_LOSS_GE) {
                let b = attrs::fixed::<16>(OBJECT, "NETEM_LOSS_GE", ge)?;
                NetemLoss::GilbertElliott { p: u32_at(&b, 0), r: u32_at(&b, 4), h: u32_at(&b, 8), k1: u32_at(&b, 12) }
            } else if attrs::find(&models, NETEM_LOSS_GI).is_some() {
                return Err(unsupported("NETEM_LOSS_GI", "4-state loss model".into()));
            } else {
                return Err(unsupported("TCA_NETEM_LOSS", "no loss model in the nest".into()));
            }
        }
        None if random_loss == 0 && loss_correlation == 0 => NetemLoss::None,
        None => NetemLoss::Random { probability: random_loss, correlation: loss_correlation },
    };

    let is_set = |kind: u16| attrs::find(&attrs, kind).is_some_and(|v| v.iter().any(|b| *b != 0));
    if is_set(TCA_NETEM_RATE) {
        return Err(unsupported("TCA_NETEM_RATE", "netem rate limiting".into()));
    }
    if is_set(TCA_NETEM_RATE64) {
        return Err(unsupported("TCA_NETEM_RATE64", "netem rate limiting".into()));
    }
    if is_set(TCA_NETEM_ECN) {
        return Err(unsupported("TCA_NETEM_ECN", "ECN marking instead of loss".into()));
    }
    if attrs::find(&attrs, TCA_NETEM_SLOT).is_some() {
        return Err(unsupported("TCA_NETEM_SLOT", "slotted delivery".into()));
    }

    Ok(Netem {
        latency_ns: delay64(TCA_NETEM_LATENCY64, "TCA_NETEM_LATENCY64", u32_at(&qopt, 0))?,
        jitter_ns: delay64(TCA_NETEM_JITTER64, "TCA_NETEM_JITTER64", u32_at(&qopt, 20))?,
        limit_packets: u32_at(&qopt, 4),
        gap: u32_at(&qopt, 12),
        duplicate: u32_at(&qopt, 16),
        delay_correlation,
        loss,
        duplicate_correlation,
        reorder,
        reorder_correlation,
        corrupt,
        corrupt_correlation,
    })
}
