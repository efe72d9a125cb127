//! Which of a pod's capture sockets a packet queues on: chosen in the kernel, by its destination address, before
//! it waits for the loop.
//!
//! Pure. With one socket per pod, every packet the pod sends to an impaired destination waits in one kernel
//! queue until the loop reads it. When the loop cannot keep up (a CPU shared with the pods, a guest's vCPU held
//! back by its host), a TCP flow to one destination fills that queue, as loss-based TCP fills any queue in front
//! of its bottleneck, and a packet to another destination waits behind all of it: head-of-line blocking before the
//! per-destination delay lines ever see the packet (the stock-kernel rig's `head_of_line.userspace` read a 1 ms
//! destination's p90 at 25–38 ms beside a loaded 200 ms one, on UML with the host busy). So each pod has
//! [`SHARDS`] sockets on its capture, each with a classic BPF filter that accepts the packets whose destination
//! address falls in its shard; the loop reads a bounded batch from each in turn. Destinations whose addresses
//! differ in their last two bits never share a queue: a pod's neighbours in one subnet, as the rig's are.

use std::net::IpAddr;

/// Capture sockets per pod. A power of two: the shard is the destination's low bits, which a classic BPF
/// program takes with one `and`.
pub const SHARDS: u32 = 4;

/// The shard of a packet to `destination`: the low bits of its address's last 32-bit word.
pub fn shard_of(destination: IpAddr) -> u32 {
    let last = match destination {
        IpAddr::V4(ip) => u32::from(ip),
        IpAddr::V6(ip) => {
            let o = ip.octets();
            u32::from_be_bytes([o[12], o[13], o[14], o[15]])
        }
    };
    last & (SHARDS - 1)
}

/// One classic BPF instruction, as `struct sock_filter` lays it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Instruction {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

// Classic BPF's opcode parts (include/uapi/linux/bpf_common.h).
const BPF_LD: u16 = 0x00;
const BPF_ALU: u16 = 0x04;
const BPF_JMP: u16 = 0x05;
const BPF_RET: u16 = 0x06;
const BPF_W: u16 = 0x00;
const BPF_B: u16 = 0x10;
const BPF_ABS: u16 = 0x20;
const BPF_K: u16 = 0x00;
const BPF_RSH: u16 = 0x70;
const BPF_AND: u16 = 0x50;
const BPF_JA: u16 = 0x00;
const BPF_JEQ: u16 = 0x10;

pub(crate) const LD_B_ABS: u16 = BPF_LD | BPF_B | BPF_ABS;
pub(crate) const LD_W_ABS: u16 = BPF_LD | BPF_W | BPF_ABS;
pub(crate) const ALU_RSH_K: u16 = BPF_ALU | BPF_RSH | BPF_K;
pub(crate) const ALU_AND_K: u16 = BPF_ALU | BPF_AND | BPF_K;
pub(crate) const JMP_JA: u16 = BPF_JMP | BPF_JA;
pub(crate) const JMP_JEQ_K: u16 = BPF_JMP | BPF_JEQ | BPF_K;
pub(crate) const RET_K: u16 = BPF_RET | BPF_K;

const fn op(code: u16, jt: u8, jf: u8, k: u32) -> Instruction {
    Instruction { code, jt, jf, k }
}

/// The filter of shard `shard` on a `SOCK_DGRAM` packet socket, where a received packet starts at its network
/// header: accept (the whole packet) an IPv4 or IPv6 packet whose destination is in the shard, drop anything else.
/// The loop reads only IP packets, so nothing it wants is dropped.
pub fn filter(shard: u32) -> [Instruction; 11] {
    assert!(shard < SHARDS, "shard {shard} of {SHARDS}");
    [
        op(LD_B_ABS, 0, 0, 0),           // 0: A = the version byte
        op(ALU_RSH_K, 0, 0, 4),          // 1: A = the IP version
        op(JMP_JEQ_K, 0, 2, 4),          // 2: IPv4 → 3, else → 5
        op(LD_W_ABS, 0, 0, 16),          // 3: A = the IPv4 destination
        op(JMP_JA, 0, 0, 2),             // 4: → 7
        op(JMP_JEQ_K, 0, 4, 6),          // 5: IPv6 → 6, else → 10
        op(LD_W_ABS, 0, 0, 36),          // 6: A = the IPv6 destination's last word
        op(ALU_AND_K, 0, 0, SHARDS - 1), // 7: A = the shard
        op(JMP_JEQ_K, 0, 1, shard),      // 8: this one → 9, else → 10
        op(RET_K, 0, 0, u32::MAX),       // 9: accept, whole
        op(RET_K, 0, 0, 0),              // 10: drop
    ]
}

#[cfg(test)]
#[path = "shard/tests.rs"]
mod tests;
