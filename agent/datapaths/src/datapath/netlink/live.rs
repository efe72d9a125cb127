//! Against the running kernel (htb, tbf and u32; this host's kernel has no netem): install with [`encode`],
//! dump over netlink, and check that [`decode_qdisc`]/[`decode_class`]/[`decode_filter`] give back exactly the
//! model, that in-place changes and deletes do what the module documentation says, that kernel refusals carry
//! their extack text, and that the kernel's tick arithmetic matches [`psched`]. Each test works in its own
//! throwaway network namespace (`isth-codec-<pid>-<n>`, removed on drop). Needs root; without it the tests
//! report that they did not run and pass.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use netlink_packet_core::{NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::tc::{TcHandle, TcMessage};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

use super::*;
use crate::datapath::model::*;
use crate::datapath::psched;
use crate::netns::socket::enable_extended_ack;

struct Namespace {
    name: String,
}

impl Namespace {
    fn create() -> Namespace {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!("isth-codec-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let namespace = Namespace { name };
        namespace.ip(&["netns", "add", &namespace.name]);
        namespace.ip(&["-n", &namespace.name, "link", "add", "v0", "type", "veth", "peer", "name", "v1"]);
        namespace.ip(&["-n", &namespace.name, "link", "set", "v0", "up"]);
        namespace
    }

    fn ip(&self, args: &[&str]) {
        let status = Command::new("ip").args(args).status().expect("run ip");
        assert!(status.success(), "ip {args:?} failed");
    }

    fn tc(&self, args: &str) {
        let status = Command::new("ip")
            .args(["netns", "exec", &self.name, "tc"])
            .args(args.split_whitespace())
            .status()
            .expect("run tc");
        assert!(status.success(), "tc {args} failed");
    }

    fn ifindex(&self) -> u32 {
        let out = Command::new("ip").args(["-n", &self.name, "-o", "link", "show", "v0"]).output().expect("run ip");
        let text = String::from_utf8_lossy(&out.stdout);
        text.split(':').next().and_then(|n| n.trim().parse().ok()).expect("ifindex of v0")
    }

    /// A route netlink socket inside the namespace, opened from a short-lived thread.
    fn socket(&self) -> Socket {
        let path = format!("/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let netns = std::fs::File::open(&path).expect("open netns");
            nix::sched::setns(netns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            let mut socket = Socket::new(NETLINK_ROUTE).expect("netlink socket");
            socket.bind_auto().expect("bind");
            socket.connect(&SocketAddr::new(0, 0)).expect("connect");
            enable_extended_ack(&socket).expect("extended ack");
            socket
        })
        .join()
        .expect("socket thread")
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// These tests create network namespaces: they are ignored in a plain `cargo test` and run by `make unit`
/// (as root, `--ignored`), where a missing privilege fails them instead of passing them unchecked.
fn assert_root() {
    assert!(nix::unistd::geteuid().is_root(), "needs root to create network namespaces (make unit runs as root)");
}

fn receive(socket: &Socket) -> Vec<NetlinkMessage<RouteNetlinkMessage>> {
    let (bytes, _) = socket.recv_from_full().expect("receive");
    let mut messages = Vec::new();
    let mut rest = &bytes[..];
    while rest.len() >= 16 {
        let len = u32::from_ne_bytes(rest[..4].try_into().unwrap()) as usize;
        messages.push(NetlinkMessage::deserialize(&rest[..len]).expect("kernel message parses"));
        rest = &rest[((len + 3) & !3).min(rest.len())..];
    }
    messages
}

fn send(socket: &Socket, mut message: NetlinkMessage<RouteNetlinkMessage>) {
    message.header.sequence_number = 1;
    message.finalize();
    let mut bytes = vec![0; message.buffer_len()];
    message.serialize(&mut bytes);
    socket.send(&bytes, 0).expect("send");
}

/// Sends one request and returns the kernel's refusal, if any.
fn request(socket: &Socket, operation: &Operation, ifindex: u32) -> Result<(), KernelError> {
    send(socket, encode(operation, ifindex).expect("encodes"));
    for message in receive(socket) {
        if let NetlinkPayload::Error(ref error) = message.payload {
            return match KernelError::from_netlink_message(&message) {
                Some(refusal) => Err(refusal),
                None => {
                    assert!(error.code.is_none());
                    Ok(())
                }
            };
        }
    }
    panic!("no acknowledgement for {operation:?}");
}

fn install(socket: &Socket, operation: Operation, ifindex: u32) {
    if let Err(e) = request(socket, &operation, ifindex) {
        panic!("{operation:?}: {e}");
    }
}

fn dump(socket: &Socket, ifindex: u32, get: fn(TcMessage) -> RouteNetlinkMessage, parent: Handle) -> Vec<TcMessage> {
    let mut tc = TcMessage::with_index(ifindex as i32);
    tc.header.parent = TcHandle::from(parent.0);
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    send(socket, NetlinkMessage::new(header, NetlinkPayload::InnerMessage(get(tc))));
    let mut out = Vec::new();
    loop {
        for message in receive(socket) {
            match message.payload {
                NetlinkPayload::InnerMessage(
                    RouteNetlinkMessage::NewQueueDiscipline(m)
                    | RouteNetlinkMessage::NewTrafficClass(m)
                    | RouteNetlinkMessage::NewTrafficFilter(m),
                ) => {
                    if ifindex_matches(&m, ifindex) {
                        out.push(m);
                    }
                }
                NetlinkPayload::Done(_) => return out,
                NetlinkPayload::Error(e) => panic!("dump failed: {e:?}"),
                other => panic!("unexpected {other:?} (type {})", message.header.message_type),
            }
            if message.header.message_type == NLMSG_DONE {
                return out;
            }
        }
    }
}

fn ifindex_matches(message: &TcMessage, wanted: u32) -> bool {
    ifindex(message) == wanted
}

fn qdiscs(socket: &Socket, ifindex: u32) -> Vec<Qdisc> {
    dump(socket, ifindex, RouteNetlinkMessage::GetQueueDiscipline, Handle::UNSPEC)
        .iter()
        .map(|m| decode_qdisc(m).expect("qdisc decodes").0)
        .collect()
}

fn classes(socket: &Socket, ifindex: u32) -> Vec<Class> {
    dump(socket, ifindex, RouteNetlinkMessage::GetTrafficClass, Handle::UNSPEC)
        .iter()
        .map(|m| decode_class(m).expect("class decodes").0)
        .collect()
}

fn filters(socket: &Socket, ifindex: u32) -> Vec<Filter> {
    dump(socket, ifindex, RouteNetlinkMessage::GetTrafficFilter, Handle::new(1, 0))
        .iter()
        .map(|m| decode_filter(m).expect("filter decodes"))
        .collect()
}

fn root() -> Qdisc {
    Qdisc {
        handle: Handle::new(1, 0),
        parent: Handle::ROOT,
        kind: QdiscKind::Htb(HtbQdisc { default_class: 0xffff, rate2quantum: 10, direct_qlen: 1000 }),
    }
}

fn class(minor: u16, rate: u64, ceil: u64, burst: u32) -> Class {
    Class {
        handle: Handle::new(1, minor),
        // htb_dump_class reports top-level classes with parent TC_H_ROOT, and htb_change_class accepts it.
        parent: Handle::ROOT,
        kind: ClassKind::Htb(HtbClass {
            rate_bytes_per_sec: rate,
            ceil_bytes_per_sec: ceil,
            buffer_ticks: psched::buffer_ticks(rate, burst).unwrap(),
            cbuffer_ticks: psched::buffer_ticks(ceil, burst).unwrap(),
            quantum: 65_536,
            prio: 0,
        }),
    }
}

fn tbf(major: u16, parent: Handle, rate: u64, burst: u32, limit: u32) -> Qdisc {
    Qdisc {
        handle: Handle::new(major, 0),
        parent,
        kind: QdiscKind::Tbf(Tbf {
            rate_bytes_per_sec: rate,
            buffer_ticks: psched::buffer_ticks(rate, burst).unwrap(),
            limit_bytes: limit,
            peak: None,
        }),
    }
}

fn u32_filter(priority: u16, protocol: u16, filter: U32Filter) -> Filter {
    Filter { parent: Handle::new(1, 0), priority, protocol, kind: FilterKind::U32(filter) }
}

fn entry(handle: u32, table: u32, keys: Vec<U32Key>, class: u16) -> U32Filter {
    U32Filter {
        handle,
        divisor: None,
        link: None,
        hash_table: Some(table),
        selector: Some(U32Selector { terminal: true, hash_mask: 0, hash_offset: 0, keys }),
        class_id: Some(Handle::new(1, class)),
    }
}

fn the_tree() -> (Vec<Qdisc>, Vec<Class>, Vec<Filter>) {
    let qdiscs = vec![
        root(),
        tbf(0x10, Handle::new(1, 0x10), 12_500_000, 32_768, 100_000),
        // 40 Gbit/s: RATE64.
        tbf(0x11, Handle::new(1, 0x11), 5_000_000_000, 1 << 20, 1_000_000),
        // A peak of 100 Gbit/s (PRATE64) with a bucket of one frame, as the tree caps TBF's largest packet.
        {
            let mut q = tbf(0x12, Handle::new(1, 0x12), 12_500_000, 32_768, 100_000);
            let QdiscKind::Tbf(t) = &mut q.kind else { unreachable!() };
            t.peak = Some(TbfPeak {
                rate_bytes_per_sec: 12_500_000_000,
                mtu_ticks: psched::buffer_ticks(12_500_000_000, 1514).unwrap(),
            });
            q
        },
    ];
    let classes = vec![
        class(0x10, 125_000_000, 125_000_000, 15_000),
        // 40 and 50 Gbit/s: RATE64 and CEIL64.
        class(0x11, 5_000_000_000, 6_250_000_000, 1 << 20),
        class(0x12, 125_000_000, 125_000_000, 15_000),
        class(0xffff, 12_500_000_000, 12_500_000_000, 1 << 20),
    ];
    let table = U32Filter {
        handle: 0x0020_0000,
        divisor: Some(256),
        link: None,
        hash_table: None,
        selector: None,
        class_id: None,
    };
    // The first priority's generated root table is 800:, the next ones 801:, 802: …
    let link = U32Filter {
        handle: 0x8000_0001,
        divisor: None,
        link: Some(0x0020_0000),
        hash_table: Some(0x8000_0000),
        selector: Some(U32Selector {
            terminal: false,
            hash_mask: 0xff,
            hash_offset: 16,
            keys: vec![U32Key { mask: 0, value: 0, offset: 0 }],
        }),
        class_id: None,
    };
    let filters = vec![
        u32_filter(1, ETH_P_IP, table),
        u32_filter(1, ETH_P_IP, link),
        u32_filter(
            1,
            ETH_P_IP,
            entry(0x0020_1001, 0x0020_1000, vec![U32Key { mask: u32::MAX, value: 0x0a00_0001, offset: 16 }], 0x10),
        ),
        u32_filter(
            1,
            ETH_P_IP,
            entry(0x8000_0002, 0x8000_0000, vec![U32Key { mask: 0xffff_0000, value: 0x0a01_0000, offset: 16 }], 0x11),
        ),
        u32_filter(
            2,
            ETH_P_IPV6,
            entry(
                0x8010_0001,
                0x8010_0000,
                vec![
                    U32Key { mask: u32::MAX, value: 0x2001_0db8, offset: 24 },
                    U32Key { mask: u32::MAX, value: 0, offset: 28 },
                    U32Key { mask: u32::MAX, value: 0, offset: 32 },
                    U32Key { mask: u32::MAX, value: 1, offset: 36 },
                ],
                0x11,
            ),
        ),
        u32_filter(
            3,
            ETH_P_ALL,
            entry(0x8020_0001, 0x8020_0000, vec![U32Key { mask: 0, value: 0, offset: 0 }], 0xffff),
        ),
    ];
    (qdiscs, classes, filters)
}

fn install_tree(socket: &Socket, ifindex: u32) -> (Vec<Qdisc>, Vec<Class>, Vec<Filter>) {
    let (qdiscs, classes, filters) = the_tree();
    install(socket, Operation::Add(TcObject::Qdisc(qdiscs[0].clone())), ifindex);
    for c in &classes {
        install(socket, Operation::Add(TcObject::Class(c.clone())), ifindex);
    }
    for q in &qdiscs[1..] {
        install(socket, Operation::Add(TcObject::Qdisc(q.clone())), ifindex);
    }
    for f in &filters {
        install(socket, Operation::Add(TcObject::Filter(f.clone())), ifindex);
    }
    (qdiscs, classes, filters)
}

fn assert_contains<T: PartialEq + std::fmt::Debug>(dumped: &[T], wanted: &T) {
    assert!(dumped.contains(wanted), "{wanted:?} not in the dump:\n{dumped:#?}");
}

#[test]
#[ignore = "needs root: make unit runs it"]
fn encoded_tree_dumps_back_as_the_model() {
    assert_root();
    let ns = Namespace::create();
    let (socket, ifindex) = (ns.socket(), ns.ifindex());
    let (qdiscs_sent, classes_sent, filters_sent) = install_tree(&socket, ifindex);

    let dumped = qdiscs(&socket, ifindex);
    for q in &qdiscs_sent {
        assert_contains(&dumped, q);
    }
    let dumped = classes(&socket, ifindex);
    // TBF shows its single internal class (10:1, kind "tbf") too.
    let htb_classes = dumped.iter().filter(|c| matches!(c.kind, ClassKind::Htb(_))).count();
    assert_eq!(htb_classes, classes_sent.len(), "{dumped:#?}");
    assert_contains(
        &dumped,
        &Class { handle: Handle::new(0x10, 1), parent: Handle::new(0x10, 0), kind: ClassKind::Foreign("tbf".into()) },
    );
    for c in &classes_sent {
        assert_contains(&dumped, c);
    }
    let dumped = filters(&socket, ifindex);
    for f in &filters_sent {
        assert_contains(&dumped, f);
    }
    // Besides what was sent: one handle-0 entry per priority and the generated root tables (divisor 1).
    for f in dumped.iter().filter(|f| !filters_sent.contains(f)) {
        let FilterKind::U32(u) = &f.kind else { panic!("foreign filter {f:?}") };
        let generated_root = u.divisor == Some(1) && u.handle >> 20 >= 0x800;
        let placeholder = u.handle == 0 && u.selector.is_none() && u.divisor.is_none();
        assert!(generated_root || placeholder, "unexpected dumped filter {f:?}");
    }
}

#[test]
#[ignore = "needs root: make unit runs it"]
fn changes_apply_in_place_and_deletes_remove() {
    assert_root();
    let ns = Namespace::create();
    let (socket, ifindex) = (ns.socket(), ns.ifindex());
    let (qdiscs_sent, classes_sent, filters_sent) = install_tree(&socket, ifindex);

    let faster_tbf = tbf(0x10, Handle::new(1, 0x10), 25_000_000, 65_536, 200_000);
    assert!(changes_in_place(&TcObject::Qdisc(qdiscs_sent[1].clone()), &TcObject::Qdisc(faster_tbf.clone())));
    install(&socket, Operation::Change(TcObject::Qdisc(faster_tbf.clone())), ifindex);
    let slower_class = class(0x10, 12_500_000, 125_000_000, 30_000);
    install(&socket, Operation::Change(TcObject::Class(slower_class.clone())), ifindex);
    let mut retargeted = filters_sent[2].clone();
    let FilterKind::U32(u) = &mut retargeted.kind else { unreachable!() };
    u.class_id = Some(Handle::new(1, 0x11));
    assert!(changes_in_place(&TcObject::Filter(filters_sent[2].clone()), &TcObject::Filter(retargeted.clone())));
    install(&socket, Operation::Change(TcObject::Filter(retargeted.clone())), ifindex);

    let dumped = qdiscs(&socket, ifindex);
    assert_contains(&dumped, &faster_tbf);
    assert!(!dumped.contains(&qdiscs_sent[1]));
    assert_contains(&classes(&socket, ifindex), &slower_class);
    assert_contains(&filters(&socket, ifindex), &retargeted);

    // Deletes, leaves first.
    install(&socket, Operation::Delete(TcObject::Filter(retargeted.clone())), ifindex);
    install(&socket, Operation::Delete(TcObject::Qdisc(faster_tbf.clone())), ifindex);
    assert!(!filters(&socket, ifindex).contains(&retargeted));
    assert!(!qdiscs(&socket, ifindex).iter().any(|q| q.handle == faster_tbf.handle));
    // The class is still the target of filter 800::2 (1:11), not 1:10: 1:10 can go.
    install(&socket, Operation::Delete(TcObject::Class(slower_class.clone())), ifindex);
    assert!(!classes(&socket, ifindex).iter().any(|c| c.handle == slower_class.handle));
    let _ = classes_sent;
}

#[test]
#[ignore = "needs root: make unit runs it"]
fn kernel_refusals_carry_their_extack_text() {
    assert_root();
    let ns = Namespace::create();
    let (socket, ifindex) = (ns.socket(), ns.ifindex());
    install(&socket, Operation::Add(TcObject::Qdisc(root())), ifindex);

    let refusal = request(&socket, &Operation::Change(TcObject::Qdisc(root())), ifindex).unwrap_err();
    assert_eq!(refusal.code, libc::EINVAL);
    assert_eq!(refusal.message.as_deref(), Some("Change operation not supported by specified qdisc"));
    assert!(!changes_in_place(&TcObject::Qdisc(root()), &TcObject::Qdisc(root())));

    let refusal = request(&socket, &Operation::Add(TcObject::Qdisc(root())), ifindex).unwrap_err();
    assert_eq!(refusal.code, libc::EEXIST);
    assert!(refusal.message.as_deref().is_some_and(|m| m.contains("Exclusivity flag on")), "{refusal:?}");
    assert!(refusal.to_string().contains("Exclusivity flag on"), "{refusal}");

    let missing = tbf(0x42, Handle::new(1, 0x42), 12_500_000, 32_768, 1000);
    let refusal = request(&socket, &Operation::Change(TcObject::Qdisc(missing)), ifindex).unwrap_err();
    assert!(refusal.code == libc::ENOENT || refusal.code == libc::EINVAL, "{refusal:?}");
}

#[test]
#[ignore = "needs root: make unit runs it"]
fn kernel_tick_arithmetic_matches_psched() {
    assert_root();
    let ns = Namespace::create();
    let (socket, ifindex) = (ns.socket(), ns.ifindex());
    ns.tc("qdisc add dev v0 root handle 1: htb default 0xffff direct_qlen 1000");
    ns.tc("class add dev v0 parent 1: classid 1:10 htb rate 1gbit quantum 1514");
    let cases: [(&str, u64, u32); 4] = [
        ("100mbit", 12_500_000, 32_768),
        ("1gbit", 125_000_000, 1514),
        ("40gbit", 5_000_000_000, 1 << 20),
        ("7777kbit", 972_125, 10_000),
    ];
    for (rate, bytes_per_sec, burst) in cases {
        ns.tc(&format!("qdisc replace dev v0 parent 1:10 handle 10: tbf rate {rate} burst {burst} limit 10000"));
        let dumped = qdiscs(&socket, ifindex);
        let tbf = dumped.iter().find(|q| q.handle == Handle::new(0x10, 0)).expect("tbf dumped");
        let expected = Tbf {
            rate_bytes_per_sec: bytes_per_sec,
            buffer_ticks: psched::buffer_ticks(bytes_per_sec, burst).unwrap(),
            limit_bytes: 10_000,
            peak: None,
        };
        assert_eq!(tbf.kind, QdiscKind::Tbf(expected), "tbf rate {rate} burst {burst}");
    }
}
