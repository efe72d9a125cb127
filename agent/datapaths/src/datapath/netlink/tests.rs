//! decode(parse(emit(encode(x)))) == x for every object kind, by example and by proptest, plus encoder refusals.

use netlink_packet_core::{NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::tc::TcMessage;
use proptest::prelude::*;

use super::*;
use crate::datapath::model::*;
use crate::datapath::psched;

/// Serializes, re-parses with netlink-packet-route and decodes: the same path a dump reply takes.
pub(super) fn wire_round_trip(operation: &Operation) -> (u16, u16, TcObject) {
    let message = encode(operation, 7).expect("encodable");
    let mut bytes = vec![0; message.buffer_len()];
    message.serialize(&mut bytes);
    let parsed = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&bytes).expect("parses");
    let NetlinkPayload::InnerMessage(inner) = parsed.payload else { panic!("not an inner message") };
    let message_type = parsed.header.message_type;
    let object = match inner {
        RouteNetlinkMessage::NewQueueDiscipline(m) | RouteNetlinkMessage::DelQueueDiscipline(m) => {
            assert_eq!(ifindex(&m), 7);
            TcObject::Qdisc(decode_qdisc(&m).expect("decodes").0)
        }
        RouteNetlinkMessage::NewTrafficClass(m) | RouteNetlinkMessage::DelTrafficClass(m) => {
            assert_eq!(ifindex(&m), 7);
            TcObject::Class(decode_class(&m).expect("decodes").0)
        }
        RouteNetlinkMessage::NewTrafficFilter(m) | RouteNetlinkMessage::DelTrafficFilter(m) => {
            assert_eq!(ifindex(&m), 7);
            TcObject::Filter(decode_filter(&m).expect("decodes"))
        }
        other => panic!("unexpected {other:?}"),
    };
    (message_type, parsed.header.flags, object)
}

fn tc_message(operation: &Operation) -> TcMessage {
    match encode(operation, 7).unwrap().payload {
        NetlinkPayload::InnerMessage(
            RouteNetlinkMessage::NewQueueDiscipline(m)
            | RouteNetlinkMessage::DelQueueDiscipline(m)
            | RouteNetlinkMessage::NewTrafficClass(m)
            | RouteNetlinkMessage::DelTrafficClass(m)
            | RouteNetlinkMessage::NewTrafficFilter(m)
            | RouteNetlinkMessage::DelTrafficFilter(m),
        ) => m,
        other => panic!("unexpected {other:?}"),
    }
}

pub(super) fn htb_root() -> Qdisc {
    Qdisc {
        handle: Handle::new(1, 0),
        parent: Handle::ROOT,
        kind: QdiscKind::Htb(HtbQdisc { default_class: 0xffff, rate2quantum: 10, direct_qlen: 1000 }),
    }
}

pub(super) fn htb_class(minor: u16, rate: u64, ceil: u64) -> Class {
    Class {
        handle: Handle::new(1, minor),
        parent: Handle::new(1, 0),
        kind: ClassKind::Htb(HtbClass {
            rate_bytes_per_sec: rate,
            ceil_bytes_per_sec: ceil,
            buffer_ticks: psched::buffer_ticks(rate, 15_360).unwrap(),
            cbuffer_ticks: psched::buffer_ticks(ceil, 15_360).unwrap(),
            quantum: 1514,
            prio: 0,
        }),
    }
}

pub(super) fn tbf(rate: u64, burst: u32, limit: u32) -> Tbf {
    Tbf {
        rate_bytes_per_sec: rate,
        buffer_ticks: psched::buffer_ticks(rate, burst).unwrap(),
        limit_bytes: limit,
        peak: None,
    }
}

fn host_filter(ip: u32, class: u16) -> Filter {
    Filter {
        parent: Handle::new(1, 0),
        priority: 1,
        protocol: ETH_P_IP,
        kind: FilterKind::U32(U32Filter {
            handle: 0x0020_1001,
            divisor: None,
            link: None,
            hash_table: Some(0x0020_1000),
            selector: Some(U32Selector {
                terminal: true,
                hash_mask: 0,
                hash_offset: 0,
                keys: vec![U32Key { mask: u32::MAX, value: ip, offset: 16 }],
            }),
            class_id: Some(Handle::new(1, class)),
        }),
    }
}

#[test]
fn every_object_kind_round_trips_through_the_wire() {
    let objects = vec![
        TcObject::Qdisc(htb_root()),
        TcObject::Class(htb_class(0x10, 125_000_000, 125_000_000)),
        TcObject::Class(htb_class(0x11, 5_000_000_000, 12_500_000_000)),
        TcObject::Qdisc(Qdisc {
            handle: Handle::new(0x10, 0),
            parent: Handle::new(1, 0x10),
            kind: QdiscKind::Tbf(tbf(12_500_000, 32_768, 100_000)),
        }),
        TcObject::Qdisc(Qdisc {
            handle: Handle::new(0x11, 0),
            parent: Handle::new(1, 0x11),
            kind: QdiscKind::Tbf(tbf(5_000_000_000, 1 << 20, 1_000_000)),
        }),
        TcObject::Qdisc(Qdisc {
            handle: Handle::new(0x20, 0),
            parent: Handle::new(0x10, 1),
            kind: QdiscKind::Netem(Netem {
                latency_ns: 50_000_000,
                jitter_ns: 5_000_000,
                limit_packets: 1000,
                delay_correlation: u32::MAX / 4,
                loss: NetemLoss::GilbertElliott { p: 1, r: 2, h: 3, k1: 4 },
                duplicate: 7,
                duplicate_correlation: 8,
                reorder: 9,
                reorder_correlation: 10,
                gap: 5,
                corrupt: 11,
                corrupt_correlation: 12,
            }),
        }),
        TcObject::Filter(host_filter(0x0a00_0001, 0x10)),
        TcObject::Filter(Filter {
            parent: Handle::new(1, 0),
            priority: 1,
            protocol: ETH_P_IP,
            kind: FilterKind::U32(U32Filter {
                handle: 0x0020_0000,
                divisor: Some(256),
                link: None,
                hash_table: None,
                selector: None,
                class_id: None,
            }),
        }),
    ];
    for object in objects {
        for operation in [Operation::Add(object.clone()), Operation::Change(object.clone())] {
            let (_, _, back) = wire_round_trip(&operation);
            assert_eq!(back, object, "{operation:?}");
        }
    }
}

#[test]
fn flags_and_message_types_follow_the_operation() {
    let qdisc = TcObject::Qdisc(htb_root());
    let class = TcObject::Class(htb_class(0x10, 125_000_000, 125_000_000));
    let filter = TcObject::Filter(host_filter(0x0a00_0001, 0x10));
    let create = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
    let plain = NLM_F_REQUEST | NLM_F_ACK;
    for (object, new, del) in [(&qdisc, 36, 37), (&class, 40, 41), (&filter, 44, 45)] {
        let (t, f, _) = wire_round_trip(&Operation::Add(object.clone()));
        assert_eq!((t, f), (new, create), "add {object:?}");
        let (t, f, _) = wire_round_trip(&Operation::Change(object.clone()));
        assert_eq!((t, f), (new, plain), "change {object:?}");
        let delete = encode(&Operation::Delete(object.clone()), 7).unwrap();
        assert_eq!((delete.header.message_type, delete.header.flags), (del, plain), "delete {object:?}");
    }
}

#[test]
fn filter_protocol_is_network_order_in_tcm_info() {
    let mut filter = host_filter(1, 0x10);
    filter.priority = 3;
    filter.protocol = ETH_P_ALL;
    let message = tc_message(&Operation::Add(TcObject::Filter(filter.clone())));
    assert_eq!(message.header.info, 0x0003_0300);
    filter.protocol = ETH_P_IPV6;
    let message = tc_message(&Operation::Add(TcObject::Filter(filter)));
    // In memory (and on the wire) the low 16 bits of tcm_info hold 0x86 0xdd in that order.
    assert_eq!(message.header.info.to_ne_bytes()[..2], [0x86, 0xdd]);
    assert_eq!(decode_filter(&message).unwrap().protocol, ETH_P_IPV6);
}

#[test]
fn large_rates_use_64_bit_attributes_and_saturate_the_32_bit_field() {
    let class = htb_class(0x11, 5_000_000_000, 5_000_000_000);
    let message = tc_message(&Operation::Add(TcObject::Class(class)));
    let options = raw_options_of(&message).unwrap();
    let attrs = attrs::parse("test", &options).unwrap();
    assert_eq!(attrs.iter().map(|a| a.0).collect::<Vec<_>>(), vec![6, 7, 1]);
    assert_eq!(attrs::u32_at(attrs[2].1, 8), u32::MAX);
    assert_eq!(attrs::u32_at(attrs[2].1, 20), u32::MAX);
    // Exactly 2^32 - 1 still fits the 32-bit field: no 64-bit attribute.
    let class = htb_class(0x11, u64::from(u32::MAX), u64::from(u32::MAX));
    let options = raw_options_of(&tc_message(&Operation::Add(TcObject::Class(class)))).unwrap();
    assert_eq!(attrs::parse("test", &options).unwrap().len(), 1);
}

#[test]
fn encoder_refuses_values_the_kernel_would_alter() {
    let netem = |f: fn(&mut Netem)| {
        let mut n = Netem { limit_packets: 1000, ..Netem::default() };
        f(&mut n);
        Operation::Add(TcObject::Qdisc(Qdisc {
            handle: Handle::new(0x20, 0),
            parent: Handle::ROOT,
            kind: QdiscKind::Netem(n),
        }))
    };
    let field_of = |op: &Operation| match encode(op, 1) {
        Err(EncodeError::OutOfRange { field, .. }) => field,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert_eq!(field_of(&netem(|n| n.jitter_ns = i64::from(i32::MAX) + 1)), "jitter_ns");
    assert_eq!(field_of(&netem(|n| n.jitter_ns = -1)), "jitter_ns");
    assert_eq!(field_of(&netem(|n| n.latency_ns = -1)), "latency_ns");
    assert_eq!(field_of(&netem(|n| n.loss = NetemLoss::Random { probability: 0, correlation: 0 })), "loss");
    let mut class = htb_class(0x10, 1_000_000, 1_000_000);
    let ClassKind::Htb(h) = &mut class.kind else { unreachable!() };
    h.quantum = 0;
    assert_eq!(field_of(&Operation::Add(TcObject::Class(class.clone()))), "quantum");
    let ClassKind::Htb(h) = &mut class.kind else { unreachable!() };
    h.quantum = 1;
    h.prio = 8;
    assert_eq!(field_of(&Operation::Change(TcObject::Class(class))), "prio");
    let tiny = Tbf { rate_bytes_per_sec: 1, buffer_ticks: 0, limit_bytes: 1, peak: None };
    let op = Operation::Add(TcObject::Qdisc(Qdisc {
        handle: Handle::new(2, 0),
        parent: Handle::ROOT,
        kind: QdiscKind::Tbf(tiny),
    }));
    assert_eq!(field_of(&op), "buffer_ticks");
    let foreign = Operation::Add(TcObject::Qdisc(Qdisc {
        handle: Handle::new(2, 0),
        parent: Handle::ROOT,
        kind: QdiscKind::Foreign("fq".into()),
    }));
    assert!(matches!(encode(&foreign, 1), Err(EncodeError::Foreign { .. })));
    // Deleting a foreign qdisc is fine.
    let foreign = Operation::Delete(TcObject::Qdisc(Qdisc {
        handle: Handle::new(2, 0),
        parent: Handle::ROOT,
        kind: QdiscKind::Foreign("fq".into()),
    }));
    assert!(encode(&foreign, 1).is_ok());
}

#[test]
fn tbf_sends_the_largest_burst_with_the_models_ticks() {
    let t = tbf(12_500_000, 32_768, 100_000);
    let message = tc_message(&Operation::Add(TcObject::Qdisc(Qdisc {
        handle: Handle::new(0x10, 0),
        parent: Handle::new(1, 0x10),
        kind: QdiscKind::Tbf(t.clone()),
    })));
    let options = raw_options_of(&message).unwrap();
    let attrs = attrs::parse("test", &options).unwrap();
    let burst = attrs::u32_attr("test", "burst", attrs::find(&attrs, 6).unwrap()).unwrap();
    assert!(burst >= 32_768);
    assert_eq!(psched::buffer_ticks(t.rate_bytes_per_sec, burst), Some(t.buffer_ticks));
}

#[test]
fn unknown_kinds_decode_as_foreign() {
    let mut message = TcMessage::with_index(3);
    message.attributes.push(TcAttribute::Kind("fq_codel".into()));
    assert_eq!(decode_qdisc(&message).unwrap().0.kind, QdiscKind::Foreign("fq_codel".into()));
    assert_eq!(decode_class(&message).unwrap().0.kind, ClassKind::Foreign("fq_codel".into()));
    message.attributes[0] = TcAttribute::Kind("flower".into());
    assert_eq!(decode_filter(&message).unwrap().kind, FilterKind::Foreign("flower".into()));
    assert!(matches!(decode_qdisc(&TcMessage::with_index(3)), Err(DecodeError::Missing { field: "TCA_KIND", .. })));
}

#[test]
fn changes_in_place_follows_what_the_kernel_honours() {
    let class = TcObject::Class(htb_class(0x10, 1_000, 1_000));
    let faster = TcObject::Class(htb_class(0x10, 2_000, 2_000));
    assert!(changes_in_place(&class, &faster));
    assert!(!changes_in_place(&TcObject::Qdisc(htb_root()), &TcObject::Qdisc(htb_root())));
    let a = host_filter(1, 0x10);
    let mut retarget = a.clone();
    let FilterKind::U32(u) = &mut retarget.kind else { unreachable!() };
    u.class_id = Some(Handle::new(1, 0x11));
    assert!(changes_in_place(&TcObject::Filter(a.clone()), &TcObject::Filter(retarget)));
    let b = host_filter(2, 0x10);
    assert!(!changes_in_place(&TcObject::Filter(a), &TcObject::Filter(b)));
}

fn arb_rate() -> impl Strategy<Value = u64> {
    prop_oneof![1_000u64..=u64::from(u32::MAX), (u64::from(u32::MAX) + 1)..=25_000_000_000u64]
}

fn arb_netem() -> impl Strategy<Value = Netem> {
    let loss = prop_oneof![
        Just(NetemLoss::None),
        (1u32.., any::<u32>()).prop_map(|(probability, correlation)| NetemLoss::Random { probability, correlation }),
        (0u32.., 1u32.., any::<u32>())
            .prop_map(|(correlation, probability, _)| { NetemLoss::Random { probability, correlation } }),
        any::<[u32; 4]>().prop_map(|[p, r, h, k1]| NetemLoss::GilbertElliott { p, r, h, k1 }),
    ];
    (
        (0i64..=1_000_000_000_000_000, 0i64..=i64::from(i32::MAX), any::<u32>(), any::<u32>(), any::<u32>()),
        (any::<u32>(), loss, any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()),
    )
        .prop_map(
            |(
                (latency_ns, jitter_ns, limit_packets, gap, duplicate),
                (
                    delay_correlation,
                    loss,
                    duplicate_correlation,
                    reorder,
                    reorder_correlation,
                    corrupt,
                    corrupt_correlation,
                ),
            )| Netem {
                latency_ns,
                jitter_ns,
                limit_packets,
                gap,
                duplicate,
                delay_correlation,
                loss,
                duplicate_correlation,
                reorder,
                reorder_correlation,
                corrupt,
                corrupt_correlation,
            },
        )
}

fn arb_handle() -> impl Strategy<Value = Handle> {
    (1u16.., any::<u16>()).prop_map(|(major, minor)| Handle::new(major, minor))
}

fn arb_qdisc() -> impl Strategy<Value = Qdisc> {
    let kind = prop_oneof![
        (any::<u32>(), 1u32.., any::<u32>()).prop_map(|(default_class, rate2quantum, direct_qlen)| QdiscKind::Htb(
            HtbQdisc { default_class, rate2quantum, direct_qlen }
        )),
        (arb_rate(), 1_500u32..=50_000_000, any::<u32>()).prop_filter_map(
            "bucket fits",
            |(rate, burst, limit_bytes)| {
                psched::buffer_ticks(rate, burst).map(|buffer_ticks| {
                    QdiscKind::Tbf(Tbf { rate_bytes_per_sec: rate, buffer_ticks, limit_bytes, peak: None })
                })
            }
        ),
        arb_netem().prop_map(QdiscKind::Netem),
    ];
    (arb_handle(), arb_handle(), kind).prop_map(|(handle, parent, kind)| Qdisc {
        handle: Handle::new(handle.major(), 0),
        parent,
        kind,
    })
}

fn arb_class() -> impl Strategy<Value = Class> {
    (arb_handle(), arb_rate(), arb_rate(), any::<u32>(), any::<u32>(), 1u32.., 0u32..8).prop_map(
        |(handle, rate, ceil, buffer_ticks, cbuffer_ticks, quantum, prio)| Class {
            handle,
            parent: Handle::new(handle.major(), 0),
            kind: ClassKind::Htb(HtbClass {
                rate_bytes_per_sec: rate,
                ceil_bytes_per_sec: ceil,
                buffer_ticks,
                cbuffer_ticks,
                quantum,
                prio,
            }),
        },
    )
}

fn arb_filter() -> impl Strategy<Value = Filter> {
    let key = (any::<u32>(), any::<u32>(), -64i32..64).prop_map(|(mask, value, offset)| U32Key { mask, value, offset });
    let selector = (any::<bool>(), any::<u32>(), any::<i16>(), proptest::collection::vec(key, 0..8))
        .prop_map(|(terminal, hash_mask, hash_offset, keys)| U32Selector { terminal, hash_mask, hash_offset, keys });
    let table = (1u32..0x1000, 0u32..=8).prop_map(|(htid, log)| U32Filter {
        handle: htid << 20,
        divisor: Some(1 << log),
        link: None,
        hash_table: None,
        selector: None,
        class_id: None,
    });
    let node = (
        1u32..0x1000,
        0u32..0x100,
        1u32..0x1000,
        proptest::option::of(1u32..0x1000),
        selector,
        proptest::option::of(arb_handle()),
    )
        .prop_map(|(htid, bucket, node, link, selector, class_id)| {
            let table = (htid << 20) | (bucket << 12);
            U32Filter {
                handle: table | node,
                divisor: None,
                link: link.map(|l| l << 20),
                hash_table: Some(table),
                selector: Some(selector),
                class_id,
            }
        });
    (
        arb_handle(),
        any::<u16>(),
        prop_oneof![Just(ETH_P_IP), Just(ETH_P_IPV6), Just(ETH_P_ALL)],
        prop_oneof![table, node],
    )
        .prop_map(|(parent, priority, protocol, u)| Filter {
            parent,
            priority,
            protocol,
            kind: FilterKind::U32(u),
        })
}

proptest! {
    #[test]
    fn qdiscs_round_trip(qdisc in arb_qdisc()) {
        let object = TcObject::Qdisc(qdisc);
        prop_assert_eq!(wire_round_trip(&Operation::Add(object.clone())).2, object);
    }

    #[test]
    fn classes_round_trip(class in arb_class()) {
        let object = TcObject::Class(class);
        prop_assert_eq!(wire_round_trip(&Operation::Change(object.clone())).2, object);
    }

    #[test]
    fn filters_round_trip(filter in arb_filter()) {
        let object = TcObject::Filter(filter);
        prop_assert_eq!(wire_round_trip(&Operation::Add(object.clone())).2, object);
    }

    #[test]
    fn tbf_burst_maps_back_to_the_ticks(rate in arb_rate(), burst in 1u32..=u32::MAX) {
        if let Some(ticks) = psched::buffer_ticks(rate, burst) {
            let largest = psched::tbf_burst_for_ticks(rate, ticks).expect("a burst maps to these ticks");
            prop_assert!(largest >= burst);
            prop_assert_eq!(psched::buffer_ticks(rate, largest), Some(ticks));
        }
    }
}

#[test]
fn counters_come_from_stats2_with_the_64_bit_packet_count() {
    use netlink_packet_route::tc::{TcStats, TcStats2, TcStatsBasic, TcStatsQueue};
    let mut basic = TcStatsBasic::default();
    basic.bytes = 1 << 40;
    basic.packets = 7;
    let mut queue = TcStatsQueue::default();
    queue.qlen = 3;
    queue.backlog = 4500;
    queue.drops = 11;
    queue.overlimits = 13;
    let pkt64 = netlink_packet_core::DefaultNla::new(8, (5u64 << 32).to_ne_bytes().to_vec());
    let mut message = TcMessage::with_index(1);
    message.attributes.push(TcAttribute::Kind("noqueue".into()));
    message.attributes.push(TcAttribute::Stats2(vec![
        TcStats2::Basic(basic),
        TcStats2::Queue(queue),
        TcStats2::Other(pkt64),
    ]));
    let mut legacy = TcStats::default();
    legacy.packets = 1;
    message.attributes.push(TcAttribute::Stats(legacy));
    let (_, counters) = decode_qdisc(&message).unwrap();
    assert_eq!(
        counters,
        isthmus_agent_api::Counters {
            packets: 5 << 32,
            bytes: 1 << 40,
            drops: 11,
            overlimits: 13,
            backlog_packets: 3,
            backlog_bytes: 4500
        }
    );
    // Without TCA_STATS2 the legacy block counts.
    message.attributes.retain(|a| !matches!(a, TcAttribute::Stats2(_)));
    assert_eq!(decode_qdisc(&message).unwrap().1.packets, 1);
}

#[test]
fn kernel_errors_carry_the_extack_message() {
    use netlink_packet_core::ErrorMessage;
    // nlmsgerr: error -22, the echoed request header (16 bytes, capped), then NLMSGERR_ATTR_MSG and _OFFS.
    let mut raw = Vec::new();
    let text = b"netem: cannot mix duplicating netems with other netems in tree\0";
    let mut tlvs = Vec::new();
    attrs::push(&mut tlvs, 1, text);
    attrs::push_u32(&mut tlvs, 2, 36);
    let payload_len = 4 + 16 + tlvs.len();
    raw.extend_from_slice(&((16 + payload_len) as u32).to_ne_bytes());
    raw.extend_from_slice(&2u16.to_ne_bytes()); // NLMSG_ERROR
    raw.extend_from_slice(&(0x100u16 | 0x200).to_ne_bytes()); // NLM_F_CAPPED | NLM_F_ACK_TLVS
    raw.extend_from_slice(&[0; 8]);
    raw.extend_from_slice(&(-22i32).to_ne_bytes());
    raw.extend_from_slice(&[0x50, 0, 0, 0, 36, 0, 5, 6, 0, 0, 0, 0, 0, 0, 0, 0]);
    raw.extend_from_slice(&tlvs);
    let error = KernelError::parse(&raw).unwrap().expect("an error, not an ack");
    assert_eq!(error.code, libc::EINVAL);
    assert_eq!(error.message.as_deref(), Some("netem: cannot mix duplicating netems with other netems in tree"));
    assert_eq!(error.offset, Some(36));
    assert!(error.to_string().starts_with("netem: cannot mix duplicating netems"), "{error}");

    // The same through netlink-packet-core's parsed message.
    let message = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&raw).unwrap();
    assert_eq!(KernelError::from_netlink_message(&message), Some(error.clone()));
    let NetlinkPayload::Error(ref parsed) = message.payload else { panic!("not an error") };
    assert_eq!(KernelError::from_error_message(parsed, true), Some(error));

    // Uncapped: the whole request is echoed before the TLVs.
    let mut uncapped = ErrorMessage::default();
    uncapped.code = std::num::NonZeroI32::new(-17);
    let mut echoed = vec![0u8; 0x24];
    echoed[0] = 0x22; // nlmsg_len 34: TLVs start at the next 4-byte boundary, 36
    echoed.extend_from_slice(&tlvs);
    uncapped.header = echoed;
    let error = KernelError::from_error_message(&uncapped, false).unwrap();
    assert_eq!((error.code, error.offset), (libc::EEXIST, Some(36)));
    assert!(error.message.is_some());

    // An ACK is not an error; an error without TLVs keeps its errno.
    let mut ack = ErrorMessage::default();
    ack.header = vec![0; 16];
    assert_eq!(KernelError::from_error_message(&ack, true), None);
    let mut bare = ErrorMessage::default();
    bare.code = std::num::NonZeroI32::new(-2);
    bare.header = vec![0; 16];
    assert_eq!(
        KernelError::from_error_message(&bare, true),
        Some(KernelError { code: libc::ENOENT, message: None, offset: None })
    );
}

proptest! {
    /// Whatever a kernel (or a corrupted buffer) hands over, decoding returns an error instead of panicking.
    #[test]
    fn decoding_arbitrary_options_never_panics(kind in prop_oneof![Just("htb"), Just("tbf"), Just("netem")], options in proptest::collection::vec(any::<u8>(), 0..160)) {
        let mut message = TcMessage::with_index(1);
        message.attributes.push(TcAttribute::Kind(kind.to_string()));
        message.attributes.push(TcAttribute::Other(netlink_packet_core::DefaultNla::new(TCA_OPTIONS, options)));
        let _ = decode_qdisc(&message);
        let _ = decode_class(&message);
    }

    /// A dump reply as the kernel (or a corrupted buffer) could hand it over: a valid message of every object kind
    /// with bytes overwritten or cut short, through the whole read path (netlink-packet-route's parser, then
    /// ours). Parsing and decoding return errors; nothing panics.
    #[test]
    fn damaged_messages_never_panic(
        object in prop_oneof![
            arb_qdisc().prop_map(|q| Operation::Add(TcObject::Qdisc(q))),
            arb_class().prop_map(|c| Operation::Add(TcObject::Class(c))),
            arb_filter().prop_map(|f| Operation::Add(TcObject::Filter(f))),
        ],
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let Ok(message) = encode(&object, 7) else { return Ok(()) };
        let mut bytes = vec![0; message.buffer_len()];
        message.serialize(&mut bytes);
        for (at, byte) in edits {
            let i = at.index(bytes.len());
            bytes[i] = byte;
        }
        if let Some(cut) = cut {
            bytes.truncate(cut.index(bytes.len()));
        }
        let Ok(parsed) = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&bytes) else { return Ok(()) };
        if let NetlinkPayload::InnerMessage(
            RouteNetlinkMessage::NewQueueDiscipline(m)
            | RouteNetlinkMessage::NewTrafficClass(m)
            | RouteNetlinkMessage::NewTrafficFilter(m),
        ) = parsed.payload
        {
            let _ = decode_qdisc(&m);
            let _ = decode_class(&m);
            let _ = decode_filter(&m);
        }
    }

    #[test]
    fn parsing_arbitrary_errors_never_panics(mut raw in proptest::collection::vec(any::<u8>(), 0..120), capped in any::<bool>()) {
        if raw.len() >= 6 {
            raw[4..6].copy_from_slice(&2u16.to_ne_bytes());
            // Mostly short declared lengths: the header's own 16 bytes and the error code are the edge.
            let declared = u32::from(raw[0] % 32);
            raw[0..4].copy_from_slice(&declared.to_ne_bytes());
        }
        let _ = KernelError::parse(&raw);
        let mut error = netlink_packet_core::ErrorMessage::default();
        error.code = std::num::NonZeroI32::new(-1);
        error.header = raw;
        let _ = KernelError::from_error_message(&error, capped);
    }
}
