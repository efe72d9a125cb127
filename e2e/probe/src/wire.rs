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
}
