//! The probe frame, identical over UDP (one datagram) and TCP (fixed-size frames on the stream).
//!
//! Layout, big-endian: magic `ISTP` (4) | run id (4) | sequence (8) | send time in ns since the
//! run started (8) | zero padding up to the requested size. The echo server returns it untouched,
//! so the prober needs no state per probe to compute the round trip.

pub const MAGIC: [u8; 4] = *b"ISTP";
pub const HEADER_LEN: usize = 24;
/// Largest UDP payload over IPv4 (65535 - 20 - 8); also the TCP frame bound.
pub const MAX_FRAME_LEN: usize = 65_507;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    pub run_id: u32,
    pub seq: u64,
    pub sent_ns: u64,
}

impl Probe {
    /// Writes the header into `frame`, whose length is the frame size; padding is left as is.
    pub fn encode(&self, frame: &mut [u8]) {
        assert!(frame.len() >= HEADER_LEN, "frame shorter than the probe header");
        frame[0..4].copy_from_slice(&MAGIC);
        frame[4..8].copy_from_slice(&self.run_id.to_be_bytes());
        frame[8..16].copy_from_slice(&self.seq.to_be_bytes());
        frame[16..24].copy_from_slice(&self.sent_ns.to_be_bytes());
    }

    /// None for anything that is not a probe frame of this run.
    pub fn decode(frame: &[u8], run_id: u32) -> Option<Probe> {
        if frame.len() < HEADER_LEN || frame[0..4] != MAGIC {
            return None;
        }
        let probe = Probe {
            run_id: u32::from_be_bytes(frame[4..8].try_into().ok()?),
            seq: u64::from_be_bytes(frame[8..16].try_into().ok()?),
            sent_ns: u64::from_be_bytes(frame[16..24].try_into().ok()?),
        };
        (probe.run_id == run_id).then_some(probe)
    }
}

/// The padding after the header carries a pattern derived from the sequence number, so that a reply whose bytes
/// were changed on the way (a corrupting link, with the UDP checksum off) is recognised.
fn pattern(seq: u64, i: usize) -> u8 {
    (seq.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left((i % 64) as u32) ^ i as u64) as u8
}

pub fn fill_padding(frame: &mut [u8], seq: u64) {
    for (i, b) in frame.iter_mut().enumerate().skip(HEADER_LEN) {
        *b = pattern(seq, i);
    }
}

/// Whether the padding is still what `fill_padding` wrote for `seq`.
pub fn padding_intact(frame: &[u8], seq: u64) -> bool {
    frame.iter().enumerate().skip(HEADER_LEN).all(|(i, b)| *b == pattern(seq, i))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_foreign_frames() {
        let probe = Probe { run_id: 0xdead_beef, seq: 42, sent_ns: 1_234_567_890 };
        let mut frame = vec![0u8; 64];
        probe.encode(&mut frame);
        assert_eq!(Probe::decode(&frame, 0xdead_beef), Some(probe));
        assert_eq!(Probe::decode(&frame, 1), None, "another run's frame");
        assert_eq!(Probe::decode(&frame[..HEADER_LEN - 1], 0xdead_beef), None, "truncated");
        frame[0] = b'X';
        assert_eq!(Probe::decode(&frame, 0xdead_beef), None, "bad magic");
    }

    #[test]
    fn a_flipped_padding_bit_is_noticed() {
        let mut frame = vec![0u8; 1000];
        fill_padding(&mut frame, 7);
        assert!(padding_intact(&frame, 7));
        assert!(!padding_intact(&frame, 8), "another probe's pattern");
        for at in [HEADER_LEN, 500, 999] {
            frame[at] ^= 0x10;
            assert!(!padding_intact(&frame, 7), "flip at {at}");
            frame[at] ^= 0x10;
        }
        frame[3] ^= 1;
        assert!(padding_intact(&frame, 7), "the header is not padding");
    }
}
