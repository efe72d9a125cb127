//! The kernel's packet-scheduler time arithmetic, replicated bit for bit so that the tick values isthmus
//! computes are the ones the kernel dumps back.
//!
//! - A psched tick is 64 ns (`PSCHED_SHIFT = 6`; `/proc/net/psched` reads `000003e8 00000040 …`).
//! - `psched_ratecfg_precompute__` turns a rate into `mult`/`shift` with `ns(len) = (len * mult) >> shift`
//!   (`psched_l2t_ns`), for isthmus's rate specs (Ethernet link layer, no overhead, no mpu).

/// log2 of the nanoseconds in one psched tick.
pub const PSCHED_SHIFT: u32 = 6;
pub const NSEC_PER_TICK: u64 = 1 << PSCHED_SHIFT;
const NSEC_PER_SEC: u64 = 1_000_000_000;

/// `psched_ratecfg_precompute__()` (net/sched/sch_generic.c): the reciprocal of the rate as `mult >> shift`.
pub fn rate_mult_shift(rate_bytes_per_sec: u64) -> (u32, u32) {
    let mut factor = NSEC_PER_SEC;
    let mut mult: u32 = 1;
    let mut shift = 0;
    if rate_bytes_per_sec == 0 {
        return (mult, shift);
    }
    loop {
        // The kernel stores the 64-bit quotient into a u32: keep the truncation.
        mult = (factor / rate_bytes_per_sec) as u32;
        if mult & (1 << 31) != 0 || factor & (1 << 63) != 0 {
            break;
        }
        factor <<= 1;
        shift += 1;
    }
    (mult, shift)
}

/// `psched_l2t_ns()`: nanoseconds to send `bytes` at the rate.
pub fn transmit_ns(rate_bytes_per_sec: u64, bytes: u32) -> u64 {
    let (mult, shift) = rate_mult_shift(rate_bytes_per_sec);
    (u64::from(bytes) * u64::from(mult)) >> shift
}

/// The psched ticks the kernel dumps for a bucket of `bytes` at the rate: what TBF reports after
/// `TCA_TBF_BURST = bytes`, and the HTB `buffer`/`cbuffer` that holds `bytes`. `None` when the bucket is too
/// long for the kernel's 32-bit tick field (about 275 s).
pub fn buffer_ticks(rate_bytes_per_sec: u64, bytes: u32) -> Option<u32> {
    u32::try_from(transmit_ns(rate_bytes_per_sec, bytes) >> PSCHED_SHIFT).ok()
}

/// The largest TBF burst (bytes) whose bucket the kernel reports as exactly `ticks` at the rate, i.e. the
/// `TCA_TBF_BURST` the codec sends for a [`super::super::model::Tbf`]. The kernel keeps this value as the
/// largest packet TBF lets through (`max_size`), so rounding up to the end of the tick never shrinks the
/// bucket below what the tree builder asked for. `None` when no burst maps to `ticks` (bucket shorter than one
/// byte at this rate, or longer than 4 GiB).
pub fn tbf_burst_for_ticks(rate_bytes_per_sec: u64, ticks: u32) -> Option<u32> {
    let (mult, shift) = rate_mult_shift(rate_bytes_per_sec);
    if mult == 0 {
        return None;
    }
    // Largest b with ((b * mult) >> shift) >> 6 <= ticks  ⇔  b * mult < (ticks + 1) << (6 + shift).
    let limit = (u128::from(ticks) + 1) << (PSCHED_SHIFT + shift);
    let largest = (limit - 1) / u128::from(mult);
    let burst = u32::try_from(largest).unwrap_or(u32::MAX);
    (burst > 0 && buffer_ticks(rate_bytes_per_sec, burst) == Some(ticks)).then_some(burst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mult_shift_matches_kernel_for_known_rates() {
        // 1 Gbit/s = 125e6 B/s: 8 ns per byte; the kernel picks the largest shift keeping mult below 2^32.
        let (mult, shift) = rate_mult_shift(125_000_000);
        assert_eq!((mult as u64) >> shift, 8);
        assert!(mult & (1 << 31) != 0);
        assert_eq!(transmit_ns(125_000_000, 1500), 12_000);
        assert_eq!(rate_mult_shift(0), (1, 0));
    }

    #[test]
    fn burst_for_ticks_is_the_largest_burst_reporting_those_ticks() {
        for rate in [1_250_000u64, 12_500_000, 125_000_000, 5_000_000_000, 12_500_000_000] {
            for burst in [1514u32, 32_768, 1_000_000] {
                let ticks = buffer_ticks(rate, burst).unwrap();
                let largest = tbf_burst_for_ticks(rate, ticks).unwrap();
                assert!(largest >= burst, "rate {rate} burst {burst}: {largest}");
                assert_eq!(buffer_ticks(rate, largest), Some(ticks));
                assert_ne!(buffer_ticks(rate, largest + 1), Some(ticks), "rate {rate} burst {burst}");
            }
        }
    }

    #[test]
    fn burst_for_ticks_refuses_unreachable_buckets() {
        // At 100 Gbit/s one tick (64 ns) holds 800 bytes; zero ticks still holds 799 bytes, which is fine,
        // but at a rate of 1 B/s a single tick holds less than a byte.
        assert_eq!(tbf_burst_for_ticks(1, 0), None);
        assert_eq!(tbf_burst_for_ticks(12_500_000_000, u32::MAX), None);
    }
}
