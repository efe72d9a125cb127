//! HTB (`net/sched/sch_htb.c`): qdisc `TCA_HTB_INIT` + `TCA_HTB_DIRECT_QLEN`, class `TCA_HTB_PARMS` (+ 64-bit
//! rates).
//!
//! - The class rate specs carry `linklayer = TC_LINKLAYER_ETHERNET`, so `htb_change_class` never reads a rate
//!   table: unlike iproute2, no `TCA_HTB_RTAB`/`CTAB` (2 × 1 KiB) is sent.
//! - `htb_dump_class` reports `buffer`/`cbuffer` as `PSCHED_NS2TICKS(PSCHED_TICKS2NS(ticks))`, i.e. the ticks
//!   sent; rates ≥ 2^32 B/s come back in RATE64/CEIL64 with the 32-bit field saturated.
//! - The kernel derives a quantum when it is 0 and clamps prio to 7: the encoder refuses both, so what is
//!   dumped is what was sent.
//! - `htb_dump_class` reports a top-level class with parent `TC_H_ROOT` (not `1:`), and `htb_change_class`
//!   takes `TC_H_ROOT` as "no parent class": model top-level classes with `parent: Handle::ROOT`.
//! - HTB has no `change` operation for the qdisc: [`Operation::Change`](super::super::model::Operation) of an
//!   HTB qdisc is answered EINVAL "Change operation not supported by specified qdisc".

use super::attrs::{self, u32_at};
use super::{DecodeError, EncodeError, ratespec, ratespec_rate};
use crate::datapath::model::{HtbClass, HtbQdisc};

const TCA_HTB_PARMS: u16 = 1;
const TCA_HTB_INIT: u16 = 2;
const TCA_HTB_DIRECT_QLEN: u16 = 5;
const TCA_HTB_RATE64: u16 = 6;
const TCA_HTB_CEIL64: u16 = 7;
/// `HTB_VER` >> 16: the version iproute2 and the kernel agree on.
const TC_HTB_PROTOVER: u32 = 3;
const TC_HTB_NUMPRIO: u32 = 8;
const TC_HTB_GLOB_LEN: usize = 20;
const TC_HTB_OPT_LEN: usize = 44;

pub(super) fn encode_qdisc(htb: &HtbQdisc) -> Result<Vec<u8>, EncodeError> {
    if htb.rate2quantum == 0 {
        return Err(EncodeError::out_of_range("htb qdisc", "rate2quantum", 0, "the kernel turns 0 into 1"));
    }
    let mut glob = Vec::with_capacity(TC_HTB_GLOB_LEN);
    for field in [TC_HTB_PROTOVER, htb.rate2quantum, htb.default_class, 0 /* debug */, 0 /* direct_pkts */] {
        glob.extend_from_slice(&field.to_ne_bytes());
    }
    let mut out = Vec::new();
    attrs::push(&mut out, TCA_HTB_INIT, &glob);
    attrs::push_u32(&mut out, TCA_HTB_DIRECT_QLEN, htb.direct_qlen);
    Ok(out)
}

pub(super) fn decode_qdisc(options: &[u8]) -> Result<HtbQdisc, DecodeError> {
    const OBJECT: &str = "htb qdisc";
    let attrs = attrs::parse(OBJECT, options)?;
    let init =
        attrs::find(&attrs, TCA_HTB_INIT).ok_or(DecodeError::Missing { object: OBJECT, field: "TCA_HTB_INIT" })?;
    let glob = attrs::fixed::<TC_HTB_GLOB_LEN>(OBJECT, "TCA_HTB_INIT", init)?;
    let direct_qlen = attrs::find(&attrs, TCA_HTB_DIRECT_QLEN)
        .ok_or(DecodeError::Missing { object: OBJECT, field: "TCA_HTB_DIRECT_QLEN" })?;
    Ok(HtbQdisc {
        rate2quantum: u32_at(&glob, 4),
        default_class: u32_at(&glob, 8),
        direct_qlen: attrs::u32_attr(OBJECT, "TCA_HTB_DIRECT_QLEN", direct_qlen)?,
    })
}

pub(super) fn encode_class(class: &HtbClass) -> Result<Vec<u8>, EncodeError> {
    const OBJECT: &str = "htb class";
    if class.rate_bytes_per_sec == 0 {
        return Err(EncodeError::out_of_range(OBJECT, "rate_bytes_per_sec", 0, "the kernel refuses a zero rate"));
    }
    if class.ceil_bytes_per_sec == 0 {
        return Err(EncodeError::out_of_range(OBJECT, "ceil_bytes_per_sec", 0, "the kernel refuses a zero ceil"));
    }
    if class.quantum == 0 {
        return Err(EncodeError::out_of_range(OBJECT, "quantum", 0, "the kernel derives its own quantum for 0"));
    }
    if class.prio >= TC_HTB_NUMPRIO {
        return Err(EncodeError::out_of_range(OBJECT, "prio", class.prio, "the kernel clamps prio to 7"));
    }
    let mut opt = Vec::with_capacity(TC_HTB_OPT_LEN);
    opt.extend_from_slice(&ratespec(class.rate_bytes_per_sec));
    opt.extend_from_slice(&ratespec(class.ceil_bytes_per_sec));
    for field in [class.buffer_ticks, class.cbuffer_ticks, class.quantum, 0 /* level */, class.prio] {
        opt.extend_from_slice(&field.to_ne_bytes());
    }
    // iproute2's order: 64-bit rates, then the parameters.
    let mut out = Vec::new();
    if class.rate_bytes_per_sec > u64::from(u32::MAX) {
        attrs::push_u64(&mut out, TCA_HTB_RATE64, class.rate_bytes_per_sec);
    }
    if class.ceil_bytes_per_sec > u64::from(u32::MAX) {
        attrs::push_u64(&mut out, TCA_HTB_CEIL64, class.ceil_bytes_per_sec);
    }
    attrs::push(&mut out, TCA_HTB_PARMS, &opt);
    Ok(out)
}

pub(super) fn decode_class(options: &[u8]) -> Result<HtbClass, DecodeError> {
    const OBJECT: &str = "htb class";
    let attrs = attrs::parse(OBJECT, options)?;
    let parms =
        attrs::find(&attrs, TCA_HTB_PARMS).ok_or(DecodeError::Missing { object: OBJECT, field: "TCA_HTB_PARMS" })?;
    let opt = attrs::fixed::<TC_HTB_OPT_LEN>(OBJECT, "TCA_HTB_PARMS", parms)?;
    let rate64 =
        attrs::find(&attrs, TCA_HTB_RATE64).map(|v| attrs::u64_attr(OBJECT, "TCA_HTB_RATE64", v)).transpose()?;
    let ceil64 =
        attrs::find(&attrs, TCA_HTB_CEIL64).map(|v| attrs::u64_attr(OBJECT, "TCA_HTB_CEIL64", v)).transpose()?;
    Ok(HtbClass {
        // psched_ratecfg_precompute: the larger of the 32-bit field and the 64-bit attribute.
        rate_bytes_per_sec: ratespec_rate(&opt[0..12]).max(rate64.unwrap_or(0)),
        ceil_bytes_per_sec: ratespec_rate(&opt[12..24]).max(ceil64.unwrap_or(0)),
        buffer_ticks: u32_at(&opt, 24),
        cbuffer_ticks: u32_at(&opt, 28),
        quantum: u32_at(&opt, 32),
        prio: u32_at(&opt, 40),
    })
}
