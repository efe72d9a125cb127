use std::time::Duration;

use ipnet::IpNet;
use isthmus_agent_api::test_util;
use isthmus_agent_api::{Impairment, ImpairmentFields};
use proptest::prelude::*;

use super::*;
use crate::datapath::handles::ROOT_QDISC;
use crate::datapath::installed::owned;
use crate::datapath::sim_kernel::SimKernel;

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn place() -> Place {
    Place { netns: crate::netns::NetnsId { dev: 0, inode: 1 }, interface: "eth0".into() }
}

/// One reconcile against the simulated kernel, as the I/O shell does it.
fn reconcile(kernel: &mut SimKernel, desired: &DesiredState) -> Result<Vec<Operation>, String> {
    let dump = kernel.dump();
    let ours = owned(&dump);
    let ops = operations(&place(), &ours, desired).map_err(|e| e.to_string())?;
    for op in &ops {
        kernel.apply(op)?;
    }
    Ok(ops)
}

fn assert_installed_exactly(kernel: &SimKernel, desired: &DesiredState) {
    let ours = owned(&kernel.dump());
    let slots = installed_destinations(&ours);
    let want: BTreeSet<IpNet> = desired.destinations().map(|(d, _)| *d).collect();
    assert_eq!(slots.keys().copied().collect::<BTreeSet<_>>(), want);
    let mut got: Vec<TcObject> = ours.iter().map(comparable).collect();
    let mut expected: Vec<TcObject> = tree::build(desired, &slots).iter().map(comparable).collect();
    let sort = |v: &mut Vec<TcObject>| v.sort_by_key(|o| format!("{:?}", key(o)));
    sort(&mut got);
    sort(&mut expected);
    assert_eq!(got, expected);
}

fn rate(mbit: u64) -> Impairment {
    test_util::rate(mbit * 1_000_000)
}

fn with_latency(ms: u64, impairment: Impairment) -> Impairment {
    test_util::impairment(ImpairmentFields { latency: Some(Duration::from_millis(ms)), ..impairment.into() })
}

#[test]
fn same_state_twice_sends_nothing_and_latency_change_is_in_place() {
    let mut k = SimKernel::default();
    let a = DesiredState::new([
        (net("10.0.0.1/32"), with_latency(10, rate(10))),
        (net("10.0.0.2/32"), rate(20)),
        (net("10.9.0.0/16"), rate(5)),
    ])
    .unwrap();
    let first = reconcile(&mut k, &a).unwrap();
    assert!(first.iter().all(|o| matches!(o, Operation::Add(_))));
    assert!(reconcile(&mut k, &a).unwrap().is_empty());

    let b = DesiredState::new([
        (net("10.0.0.1/32"), with_latency(30, rate(10))),
        (net("10.0.0.2/32"), rate(20)),
        (net("10.9.0.0/16"), rate(5)),
    ])
    .unwrap();
    let ops = reconcile(&mut k, &b).unwrap();
    assert!(
        matches!(ops.as_slice(), [Operation::Change(TcObject::Qdisc(Qdisc { kind: QdiscKind::Netem(n), .. }))] if n.latency_ns == 30_000_000),
        "{ops:?}"
    );
    assert_installed_exactly(&k, &b);
}

/// Trees installed before netem got a TBF ahead of it (netem on the class, a rate's TBF without a peak) are
/// rebuilt into today's on the agent's first reconcile after an upgrade.
#[test]
fn a_tree_from_before_the_gso_cut_is_rebuilt() {
    let d = DesiredState::new([
        (net("10.0.0.1/32"), with_latency(10, rate(10))),
        (net("10.0.0.2/32"), with_latency(20, test_util::impairment(ImpairmentFields::default()))),
    ])
    .unwrap();
    let slots = crate::datapath::handles::assign_slots(d.destinations().map(|(n, _)| n), &BTreeMap::new()).unwrap();
    let unrated = slots[&net("10.0.0.2/32")];
    let old: Vec<TcObject> = tree::build(&d, &slots)
        .into_iter()
        .filter(|o| !matches!(o, TcObject::Qdisc(q) if q.handle == unrated.tbf()))
        .map(|o| match o {
            TcObject::Qdisc(Qdisc { handle, parent, kind: QdiscKind::Tbf(t) }) => {
                TcObject::Qdisc(Qdisc { handle, parent, kind: QdiscKind::Tbf(Tbf { peak: None, ..t }) })
            }
            TcObject::Qdisc(q) if q.handle == unrated.netem() => {
                TcObject::Qdisc(Qdisc { parent: unrated.class(), ..q })
            }
            o => o,
        })
        .collect();
    let mut k = SimKernel::default();
    for o in &old {
        k.apply(&Operation::Add(o.clone())).unwrap();
    }
    reconcile(&mut k, &d).unwrap();
    assert_installed_exactly(&k, &d);
    assert!(reconcile(&mut k, &d).unwrap().is_empty());
}

#[test]
fn removing_a_destination_deletes_its_filter_then_its_class_only() {
    let mut k = SimKernel::default();
    let a = DesiredState::new([(net("10.0.0.1/32"), rate(10)), (net("10.0.0.2/32"), rate(20))]).unwrap();
    reconcile(&mut k, &a).unwrap();
    let b = DesiredState::new([(net("10.0.0.1/32"), rate(10))]).unwrap();
    let ops = reconcile(&mut k, &b).unwrap();
    assert!(
        matches!(ops.as_slice(), [Operation::Delete(TcObject::Filter(_)), Operation::Delete(TcObject::Class(_))]),
        "{ops:?}"
    );
    assert_installed_exactly(&k, &b);
    let ops = reconcile(&mut k, &DesiredState::empty()).unwrap();
    assert!(matches!(ops.as_slice(), [Operation::Delete(TcObject::Qdisc(q))] if q.handle == ROOT_QDISC));
    assert!(k.dump().is_empty());
}

fn impairment() -> impl Strategy<Value = Impairment> {
    (prop::option::of(1u64..5000), prop::option::of(0u64..300), prop::option::of(1u32..5000)).prop_map(
        |(mbit, latency_ms, limit)| {
            test_util::impairment(ImpairmentFields {
                rate_bps: mbit.map(|m| m * 1_000_000),
                latency: latency_ms.map(Duration::from_millis),
                queue_limit_packets: limit,
                ..Default::default()
            })
        },
    )
}

fn destination() -> impl Strategy<Value = IpNet> {
    prop_oneof![
        (0u32..40).prop_map(|i| IpNet::from(std::net::IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i * 37)))),
        (0u32..6, 8u8..32).prop_map(|(i, len)| IpNet::new(
            std::net::Ipv4Addr::from(0x0a00_0000 + (i << 20)).into(),
            len
        )
        .unwrap()
        .trunc()),
        (0u128..20).prop_map(|i| IpNet::from(std::net::IpAddr::from(std::net::Ipv6Addr::from(
            0xfd00_0000_0000_0000_0000_0000_0000_0000u128 + i * 255
        )))),
        (0u128..4, 16u8..128).prop_map(|(i, len)| IpNet::new(
            std::net::Ipv6Addr::from(0xfd00u128 << 112 | i << 80).into(),
            len
        )
        .unwrap()
        .trunc()),
    ]
}

fn desired_state() -> impl Strategy<Value = DesiredState> {
    prop::collection::btree_map(destination(), impairment(), 0..24).prop_map(|m| DesiredState::new(m).unwrap())
}

/// The fast path against the simulated kernel, as the I/O shell does it: diff against the record of what
/// was last installed, no dump; returns the operations and the record afterwards.
fn update(
    kernel: &mut SimKernel,
    record: &[TcObject],
    desired: &DesiredState,
) -> Result<(Vec<Operation>, Option<Vec<TcObject>>), String> {
    let ops = operations(&place(), record, desired).map_err(|e| e.to_string())?;
    for op in &ops {
        kernel.apply(op)?;
    }
    let record = after(record.to_vec(), &ops);
    Ok((ops, record))
}

/// Objects as the record must hold them: exact handles (deletions address entries by them), the table
/// attribute aside (a dump and a request state it differently, and nothing is addressed by it).
fn exact(objects: &[TcObject]) -> Vec<TcObject> {
    let mut out: Vec<TcObject> = objects
        .iter()
        .cloned()
        .map(|mut o| {
            if let TcObject::Filter(Filter { kind: FilterKind::U32(u), .. }) = &mut o {
                u.hash_table = None;
            }
            o
        })
        .collect();
    out.sort_by_key(|o| format!("{o:?}"));
    out
}

/// A full reconcile that also yields the record the shell keeps (after the operations, or a fresh dump's
/// owned objects when a kernel-picked handle is unknown, as the shell's next full reconcile establishes).
fn reconcile_recording(kernel: &mut SimKernel, desired: &DesiredState) -> Result<Vec<TcObject>, String> {
    let before = owned(&kernel.dump());
    let ops = reconcile(kernel, desired)?;
    let dumped = owned(&kernel.dump());
    match after(before, &ops) {
        Some(record) => {
            assert_eq!(exact(&record), exact(&dumped), "record after a full reconcile");
            Ok(record)
        }
        None => Ok(dumped),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn update_via_the_record_leaves_the_same_kernel_state_as_a_full_reconcile(
        a in desired_state(), b in desired_state(), c in desired_state()
    ) {
        let (mut fast, mut full) = (SimKernel::default(), SimKernel::default());
        let mut record = reconcile_recording(&mut fast, &a).map_err(TestCaseError::fail)?;
        reconcile(&mut full, &a).map_err(TestCaseError::fail)?;
        for next in [&b, &c, &a] {
            let (_, after_update) = update(&mut fast, &record, next).map_err(TestCaseError::fail)?;
            reconcile(&mut full, next).map_err(TestCaseError::fail)?;
            assert_installed_exactly(&fast, next);
            let (fast_dump, full_dump) = (owned(&fast.dump()), owned(&full.dump()));
            let sorted = |v: &[TcObject]| {
                let mut v: Vec<TcObject> = v.iter().map(comparable).collect();
                v.sort_by_key(|o| format!("{o:?}"));
                v
            };
            prop_assert_eq!(sorted(&fast_dump), sorted(&full_dump), "update and full reconcile disagree");
            record = match after_update {
                Some(r) => {
                    prop_assert_eq!(exact(&r), exact(&fast_dump), "the record after an update is what a dump shows");
                    r
                }
                // The shell drops the record; its next call is a full reconcile, which re-reads it.
                None => fast_dump,
            };
            let (again, _) = update(&mut fast, &record, next).map_err(TestCaseError::fail)?;
            prop_assert!(again.is_empty(), "the same state via the record sent {:?}", again);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn applying_a_then_b_leaves_exactly_b_and_b_again_sends_nothing(a in desired_state(), b in desired_state()) {
        let mut k = SimKernel::default();
        reconcile(&mut k, &a).map_err(TestCaseError::fail)?;
        assert_installed_exactly(&k, &a);
        let slots_a = installed_destinations(&owned(&k.dump()));
        reconcile(&mut k, &b).map_err(TestCaseError::fail)?;
        assert_installed_exactly(&k, &b);
        let slots_b = installed_destinations(&owned(&k.dump()));
        for (dst, slot) in &slots_b {
            if let Some(before) = slots_a.get(dst) {
                prop_assert_eq!(before, slot, "a destination kept across reconciles keeps its slot");
            }
        }
        let again = reconcile(&mut k, &b).map_err(TestCaseError::fail)?;
        prop_assert!(again.is_empty(), "second apply sent {:?}", again);
        reconcile(&mut k, &DesiredState::empty()).map_err(TestCaseError::fail)?;
        prop_assert!(k.dump().is_empty());
    }
}
