//! TBF (`net/sched/sch_tbf.c`): `TCA_TBF_PARMS` + `TCA_TBF_BURST` (+ `TCA_TBF_RATE64`), and with a peak rate
//! `TCA_TBF_PBURST` (+ `TCA_TBF_PRATE64`).
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
//!
//! The peak bucket works the same way: its ticks in `qopt.mtu` and `TCA_TBF_PBURST` = the largest byte count
//! that gives them at the peak rate, which the kernel keeps as `max_size` when it is below the burst.

use super::attrs::{self, u32_at};
use super::{DecodeError, EncodeError, ratespec, ratespec_rate};
use crate::datapath::model::{Tbf, TbfPeak};
use crate::datapath::psched::{buffer_ticks, tbf_burst_for_ticks};

const TCA_TBF_PARMS: u16 = 1;
const TCA_TBF_RATE64: u16 = 4;
const TCA_TBF_PRATE64: u16 = 5;
const TCA_TBF_BURST: u16 = 6;
const TCA_TBF_PBURST: u16 = 7;
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
    let peak_burst = match tbf.peak {
        None => None,
        Some(peak) if peak.rate_bytes_per_sec <= tbf.rate_bytes_per_sec => {
            return Err(EncodeError::out_of_range(
                OBJECT,
                "peak.rate_bytes_per_sec",
                peak.rate_bytes_per_sec,
                "the kernel refuses a peak rate not above the rate",
            ));
        }
        Some(peak) => Some((
            peak,
            tbf_burst_for_ticks(peak.rate_bytes_per_sec, peak.mtu_ticks).ok_or_else(|| {
                EncodeError::out_of_range(
                    OBJECT,
                    "peak.mtu_ticks",
                    peak.mtu_ticks,
                    "no bucket between 1 byte and 4 GiB gives these ticks at the peak rate",
                )
            })?,
        )),
    };
    let mut qopt = Vec::with_capacity(TC_TBF_QOPT_LEN);
    qopt.extend_from_slice(&ratespec(tbf.rate_bytes_per_sec));
    match tbf.peak {
        Some(peak) => qopt.extend_from_slice(&ratespec(peak.rate_bytes_per_sec)),
        None => qopt.extend_from_slice(&[0; 12]),
    }
    let mtu_ticks = tbf.peak.map_or(0, |p| p.mtu_ticks);
    for field in [tbf.limit_bytes, tbf.buffer_ticks, mtu_ticks] {
        qopt.extend_from_slice(&field.to_ne_bytes());
    }
    // iproute2's order: parameters, burst, 64-bit rate, then the peak's 64-bit rate and burst.
    let mut out = Vec::new();
    attrs::push(&mut out, TCA_TBF_PARMS, &qopt);
    attrs::push_u32(&mut out, TCA_TBF_BURST, burst);
    if tbf.rate_bytes_per_sec > u64::from(u32::MAX) {
        attrs::push_u64(&mut out, TCA_TBF_RATE64, tbf.rate_bytes_per_sec);
    }
    if let Some((peak, peak_burst)) = peak_burst {
        if peak.rate_bytes_per_sec > u64::from(u32::MAX) {
            attrs::push_u64(&mut out, TCA_TBF_PRATE64, peak.rate_bytes_per_sec);
        }
        attrs::push_u32(&mut out, TCA_TBF_PBURST, peak_burst);
    }
    Ok(out)
}

pub(super) fn decode(options: &[u8]) -> Result<Tbf, DecodeError> {
    const OBJECT: &str = "tbf";
    let attrs = attrs::parse(OBJECT, options)?;
    let parms =
        attrs::find(&attrs, TCA_TBF_PARMS).ok_or(DecodeError::Missing { object: OBJECT, field: "TCA_TBF_PARMS" })?;
    let qopt = attrs::fixed::<TC_TBF_QOPT_LEN>(OBJECT, "TCA_TBF_PARMS", parms)?;
    // A bucket and its rate: the 32-bit rate of the ratespec at `spec`, or the 64-bit attribute; the ticks as
    // dumped in `qopt`, or derived from the byte count of a request (an iproute2 message).
    let bucket = |spec: usize, rate64: (u16, &'static str), bytes: (u16, &'static str), ticks_at: usize| {
        let wide = attrs::find(&attrs, rate64.0).map(|v| attrs::u64_attr(OBJECT, rate64.1, v)).transpose()?;
        let rate = ratespec_rate(&qopt[spec..spec + 12]).max(wide.unwrap_or(0));
        let ticks = match attrs::find(&attrs, bytes.0) {
            Some(b) => {
                let b = attrs::u32_attr(OBJECT, bytes.1, b)?;
                buffer_ticks(rate, b).ok_or(DecodeError::Unsupported {
                    object: OBJECT,
                    field: bytes.1,
                    detail: format!("{b} bytes at {rate} B/s exceed the kernel's 32-bit tick field"),
                })?
            }
            None => u32_at(&qopt, ticks_at),
        };
        Ok::<_, DecodeError>((rate, ticks))
    };
    let (rate, bucket_ticks) = bucket(0, (TCA_TBF_RATE64, "TCA_TBF_RATE64"), (TCA_TBF_BURST, "TCA_TBF_BURST"), 28)?;
    let (peak_rate, mtu_ticks) =
        bucket(12, (TCA_TBF_PRATE64, "TCA_TBF_PRATE64"), (TCA_TBF_PBURST, "TCA_TBF_PBURST"), 32)?;
    let peak = (peak_rate != 0).then_some(TbfPeak { rate_bytes_per_sec: peak_rate, mtu_ticks });
    Ok(Tbf { rate_bytes_per_sec: rate, buffer_ticks: bucket_ticks, limit_bytes: u32_at(&qopt, 24), peak })
}
