use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

use super::*;

/// Runs a classic BPF program over `packet` as the kernel does for the opcodes [`filter`] uses: the accepted
/// length, 0 for a drop; a load past the packet's end drops it (the kernel's rule).
fn run(program: &[Instruction], packet: &[u8]) -> u32 {
    let (mut a, mut pc) = (0u32, 0usize);
    loop {
        let i = program[pc];
        pc += 1;
        match i.code {
            LD_B_ABS => match packet.get(i.k as usize) {
                Some(&b) => a = u32::from(b),
                None => return 0,
            },
            LD_W_ABS => match packet.get(i.k as usize..i.k as usize + 4) {
                Some(w) => a = u32::from_be_bytes(w.try_into().unwrap()),
                None => return 0,
            },
            ALU_RSH_K => a >>= i.k,
            ALU_AND_K => a &= i.k,
            JMP_JA => pc += i.k as usize,
            JMP_JEQ_K => pc += usize::from(if a == i.k { i.jt } else { i.jf }),
            RET_K => return i.k,
            other => panic!("opcode {other:#x} not in the interpreter"),
        }
    }
}

fn ipv4_packet(destination: Ipv4Addr, len: usize) -> Vec<u8> {
    let mut p = vec![0u8; len.max(20)];
    p[0] = 0x45;
    p[12..16].copy_from_slice(&[10, 0, 0, 1]);
    p[16..20].copy_from_slice(&destination.octets());
    p
}

fn ipv6_packet(destination: Ipv6Addr, len: usize) -> Vec<u8> {
    let mut p = vec![0u8; len.max(40)];
    p[0] = 0x60;
    p[8..24].copy_from_slice(&Ipv6Addr::LOCALHOST.octets());
    p[24..40].copy_from_slice(&destination.octets());
    p
}

fn accepting(packet: &[u8]) -> Vec<u32> {
    (0..SHARDS).filter(|&s| run(&filter(s), packet) > 0).collect()
}

#[test]
fn neighbours_in_a_subnet_take_different_shards() {
    let shards: Vec<u32> =
        (2..2 + SHARDS as u8).map(|last| shard_of(IpAddr::V4(Ipv4Addr::new(10, 77, 0, last)))).collect();
    assert_eq!(shards, [2, 3, 0, 1]);
    assert_eq!(shard_of("fd00::7".parse().unwrap()), 3);
}

#[test]
fn what_is_not_an_ip_packet_reaches_no_shard() {
    assert_eq!(accepting(&[]), Vec::<u32>::new());
    assert_eq!(accepting(&[0x45; 19]), Vec::<u32>::new(), "an IPv4 header cut before its destination");
    assert_eq!(accepting(&[0x60; 39]), Vec::<u32>::new(), "an IPv6 header cut before its destination's end");
    let mut arp_like = ipv4_packet(Ipv4Addr::new(10, 0, 0, 2), 28);
    arp_like[0] = 0x00;
    assert_eq!(accepting(&arp_like), Vec::<u32>::new());
}

#[test]
fn an_accepted_packet_is_kept_whole() {
    let packet = ipv4_packet(Ipv4Addr::new(10, 0, 0, 6), 1500);
    assert_eq!(run(&filter(shard_of("10.0.0.6".parse().unwrap())), &packet), u32::MAX);
}

proptest! {
    /// Every IP packet reaches exactly one shard, the one its destination names, whatever its length and options.
    #[test]
    fn every_ip_packet_reaches_exactly_its_shard(octets in any::<[u8; 16]>(), v6 in any::<bool>(), extra in 0usize..1500) {
        let (packet, destination) = if v6 {
            let d = Ipv6Addr::from(octets);
            (ipv6_packet(d, 40 + extra), IpAddr::V6(d))
        } else {
            let d = Ipv4Addr::new(octets[0], octets[1], octets[2], octets[3]);
            (ipv4_packet(d, 20 + extra), IpAddr::V4(d))
        };
        prop_assert_eq!(accepting(&packet), vec![shard_of(destination)]);
    }
}
