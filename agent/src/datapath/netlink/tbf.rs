//! TBF (`net/sched/sch_tbf.c`): `TCA_TBF_PARMS` + `TCA_TBF_BURST` (+ `TCA_TBF_RATE64`).
//!
//! The model holds the bucket as the psched ticks `tbf_dump` reports. The encoder sends those ticks in
//! `qopt.buffer` *and* `TCA_TBF_BURST` = [`tbf_burst_for_ticks`]: the largest byte count the kernel turns back
//! into exactly those ticks (`buffer = psched_l2t_ns(rate, burst)`). TBF keeps that byte count as its largest
//! admissible packet (`max_size`), so the bucket is never a few bytes short of what the ticks promise — sending
//! ticks alone would let the kernel derive `max_size` by rounding down, and a bucket of exactly one MTU would then
//! drop full-size packets. Rate specs use the Ethernet link layer, so no `TCA_TBF_RTAB` is needed.
//!
//! Decoding a message that carries `TCA_TBF_BURST` (an iproute2 request) yields the ticks the kernel will dump,
//! computed with the kernel's arithmetic ([`buffer_ticks`]).

use super::attrs::{self, u32_at};
use super::psched::{buffer_ticks, tbf_burst_for_ticks};
use super::{DecodeError, EncodeError, ratespec, ratespec_rate};
use crate::datapath::model::Tbf;

const TCA_TBF_PARMS: u16 = 1;
const TCA_TBF_RATE64: u16 = 4;
const TCA_TBF_BURST: u16 = 6;
const TC_TBF_QOPT_LEN: usize = 36;

pub(super) fn encode(tbf: &Tbf) -> Result<Vec<u8>, EncodeError> {
    const OBJECT: &str = "tbf";
    if tbf.rate_bytes_per_sec == 0 {
        return Err(EncodeError::out_of_range(OBJECT, "rate_bytes_per_sec", 0, "a token bucket needs a rate"));
    }
    let burst = tbf_burst_for_ticks(tbf.rate_bytes_per_sec, tbf.buffer_ticks).ok_or_else(|| {
        EncodeError::out_of_range(
            OBJECT,
            "buffer_ticks",
            tbf.buffer_ticks,
            "no burst between 1 byte and 4 GiB gives these ticks at this rate",
        )
    })?;
    let mut qopt = Vec::with_capacity(TC_TBF_QOPT_LEN);
    qopt.extend_from_slice(&ratespec(tbf.rate_bytes_per_sec));
    qopt.extend_from_slice(&[0; 12]); // no peak rate
    for field in [tbf.limit_bytes, tbf.buffer_ticks, 0 /* mtu: only with a peak rate */] {
        qopt.extend_from_slice(&field.to_ne_bytes());
    }
    // iproute2's order: parameters, burst, 64-bit rate.
    let mut out = Vec::new();
    attrs::push(&mut out, TCA_TBF_PARMS, &qopt);
    attrs::push_u32(&mut out, TCA_TBF_BURST, burst);
    if tbf.rate_bytes_per_sec > u64::from(u32::MAX) {
        attrs::push_u64(&mut out, TCA_TBF_RATE64, tbf.rate_bytes_per_sec);
    }
    Ok(out)
}

pub(super) fn decode(options: &[u8]) -> Result<Tbf, DecodeError> {
    const OBJECT: &str = "tbf";
    let attrs = attrs::parse(OBJECT, options)?;
    let parms =
        attrs::find(&attrs, TCA_TBF_PARMS).ok_or(DecodeError::Missing { object: OBJECT, field: "TCA_TBF_PARMS" })?;
    let qopt = attrs::fixed::<TC_TBF_QOPT_LEN>(OBJECT, "TCA_TBF_PARMS", parms)?;
    let rate64 =
        attrs::find(&attrs, TCA_TBF_RATE64).map(|v| attrs::u64_attr(OBJECT, "TCA_TBF_RATE64", v)).transpose()?;
    let rate = ratespec_rate(&qopt[0..12]).max(rate64.unwrap_or(0));
    let buffer_ticks = match attrs::find(&attrs, TCA_TBF_BURST) {
        Some(burst) => {
            let burst = attrs::u32_attr(OBJECT, "TCA_TBF_BURST", burst)?;
            buffer_ticks(rate, burst).ok_or(DecodeError::Unsupported {
                object: OBJECT,
                field: "TCA_TBF_BURST",
                detail: format!("{burst} bytes at {rate} B/s exceed the kernel's 32-bit tick field"),
            })?
        }
        None => u32_at(&qopt, 28),
    };
    Ok(Tbf { rate_bytes_per_sec: rate, buffer_ticks, limit_bytes: u32_at(&qopt, 24) })
}
