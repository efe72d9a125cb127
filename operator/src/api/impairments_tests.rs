use std::time::Duration;

use super::*;

fn spec(yaml: &str) -> NetworkLinkSpec {
    serde_yaml::from_str(yaml).unwrap()
}

#[test]
fn profile_with_overrides_and_reverse() {
    let s = spec(
        "from: {podSelector: {matchLabels: {app: phone}}}\n\
         to: {podSelector: {matchLabels: {app: api}}}\n\
         profile: lte\n\
         impairment: {latency: 80ms, loss: {percent: 1%}}\n\
         reverse: {bandwidth: 20Mbit}\n",
    );
    let r = s.resolve().unwrap();
    assert_eq!(r.forward.fields().latency, Some(Duration::from_millis(80)));
    assert_eq!(r.forward.fields().rate_bps, Some(10_000_000), "uplink bandwidth from the profile");
    let rev = r.reverse.as_ref().unwrap().fields();
    assert_eq!(rev.latency, Some(Duration::from_millis(50)), "downlink latency from the profile");
    assert_eq!(rev.rate_bps, Some(20_000_000), "explicit reverse overrides the downlink");
    let sum = r.summary();
    assert_eq!(sum.latency, "80ms/50ms");
    assert_eq!(sum.bandwidth, "10Mbit/20Mbit");
    assert_eq!(sum.loss, "1%/0%");
    assert_eq!(sum.expected_round_trip, "130ms");
}

#[test]
fn symmetric_copies_and_one_way_drops_the_downlink() {
    let s = spec(
        "from: {podSelector: {}}\nto: {podSelector: {}}\nimpairment: {latency: 10ms, jitter: 2ms}\nsymmetric: true\n",
    );
    let r = s.resolve().unwrap();
    assert_eq!(r.reverse.as_ref(), Some(&r.forward));
    assert_eq!(r.summary().expected_round_trip, "20ms ± 4ms");
    let s = spec("from: {podSelector: {}}\nto: {podSelector: {}, namespaceSelector: {}}\nprofile: dsl\noneWay: true\n");
    let r = s.resolve().unwrap();
    assert!(r.reverse.is_none());
    assert_eq!(r.summary().expected_round_trip, "10ms (return path not impaired)");
}

#[test]
fn errors_name_the_field() {
    let cases = [
        ("from: {podSelector: {}}\nto: {podSelector: {}}\n", "spec.impairment"),
        (
            "from: {podSelector: {}}\nto: {podSelector: {}, namespaceSelector: {}}\nimpairment: {}\nsymmetric: true\n",
            "spec.to.namespaceSelector",
        ),
        (
            "from: {podSelector: {}}\nto: {podSelector: {}, namespaceSelector: {}}\nprofile: lte\n",
            "spec.to.namespaceSelector",
        ),
        (
            "from: {podSelector: {}}\nto: {podSelector: {}}\nimpairment: {}\nreverse: {}\nsymmetric: true\n",
            "spec.symmetric",
        ),
        ("from: {podSelector: {}}\nto: {podSelector: {}}\nprofile: lte\nsymmetric: true\n", "spec.symmetric"),
        (
            "from: {podSelector: {}}\nto: {cidrs: [10.0.0.0/8]}\nimpairment: {}\nsymmetric: true\n",
            "spec.to.podSelector",
        ),
        ("from: {podSelector: {}}\nto: {cidrs: [10.0.0.1/8]}\nimpairment: {}\n", "spec.to.cidrs[0]"),
        ("from: {podSelector: {}}\nto: {podSelector: {}}\nimpairment: {latency: 10mbps}\n", "spec.impairment.latency"),
        (
            "from: {podSelector: {}}\nto: {podSelector: {}}\nimpairment: {bandwidth: 100mbps}\n",
            "spec.impairment.bandwidth",
        ),
        (
            "from: {podSelector: {}}\nto: {podSelector: {}}\nimpairment: {bandwidth: 1bit}\n",
            "spec.impairment.bandwidth",
        ),
        ("from: {podSelector: {}}\nto: {podSelector: {}}\nimpairment: {jitter: 5ms}\n", "spec.impairment.jitter"),
        ("from: {podSelector: {}}\nto: {podSelector: {}}\nimpairment: {burst: 32KiB}\n", "spec.impairment.burst"),
        (
            "from: {podSelector: {}}\nto: {podSelector: {}}\nimpairment: {bandwidth: 1Mbit, burst: 1KiB}\n",
            "spec.impairment.burst",
        ),
        ("from: {podSelector: {}}\nto: {podSelector: {}}\nimpairment: {queueLimit: 0}\n", "spec.impairment.queueLimit"),
        ("from: {podSelector: {}}\nto: {podSelector: {}}\nimpairment: {loss: {}}\n", "spec.impairment.loss"),
        (
            "from: {podSelector: {}}\nto: {podSelector: {}}\nimpairment: {loss: {percent: 101%}}\n",
            "spec.impairment.loss.percent",
        ),
        (
            "from: {podSelector: {}}\nto: {podSelector: {}}\nimpairment: {latency: 1ms, reorder: {percent: 0%, gap: 3}}\n",
            "spec.impairment.reorder.gap",
        ),
        (
            "from: {podSelector: {}}\nto: {podSelector: {}}\nimpairment: {latency: 1ms, reorder: {percent: 5%, gap: 0}}\n",
            "spec.impairment.reorder.gap",
        ),
        (
            "from: {podSelector: {}}\nto: {podSelector: {}}\nimpairment: {}\nreverse: {latency: 2h}\n",
            "spec.reverse.latency",
        ),
    ];
    for (yaml, field) in cases {
        let e = spec(yaml).resolve().unwrap_err();
        assert_eq!(e.field, field, "{yaml}: {e}");
    }
}

#[test]
fn gilbert_elliott_defaults() {
    let s =
        spec("from: {podSelector: {}}\nto: {podSelector: {}}\nimpairment: {loss: {gilbertElliott: {p: 1%, r: 20%}}}\n");
    let r = s.resolve().unwrap();
    assert_eq!(
        r.forward.fields().loss,
        Some(Loss::GilbertElliott {
            p: Percent::new("p", 1.0).unwrap(),
            r: Percent::new("r", 20.0).unwrap(),
            loss_in_bad: Percent::HUNDRED,
            loss_in_good: Percent::ZERO,
        })
    );
}

/// Random specs built from unit-like strings: resolving never panics, and what resolves is valid for the agent.
mod properties {
    use isthmus_agent_api::{Impairment, ImpairmentFields};
    use proptest::prelude::*;

    use crate::api::quantity::PercentValue;
    use crate::api::spec::*;

    fn text() -> impl Strategy<Value = String> {
        prop::string::string_regex(r"(0|[0-9]{1,4}(\.[0-9]{1,3})?)(ns|us|ms|s|%|bit|kbit|Mbit|Gbit|mbps|B|KiB|MiB|)")
            .unwrap()
    }

    fn impairment() -> impl Strategy<Value = ImpairmentSpec> {
        (
            prop::collection::vec(prop::option::of(text()), 10),
            prop::option::of(0..3u32),
            prop::option::of(0..4u32),
            any::<bool>(),
        )
            .prop_map(|(t, queue, gap, ge)| {
                macro_rules! q {
                    ($i:expr) => {
                        t[$i].as_deref().map(Into::into)
                    };
                }
                ImpairmentSpec {
                    latency: q!(0),
                    jitter: q!(1),
                    jitter_correlation: q!(2),
                    loss: q!(3).map(|p: PercentValue| LossSpec {
                        percent: (!ge).then_some(p.clone()),
                        correlation: q!(4),
                        gilbert_elliott: ge.then(|| GilbertElliottSpec {
                            p: p.clone(),
                            r: p,
                            loss_in_bad: q!(5),
                            loss_in_good: None,
                        }),
                    }),
                    duplicate: q!(5).map(|p: PercentValue| CorrelatedSpec { percent: p, correlation: q!(6) }),
                    corrupt: None,
                    reorder: q!(7).map(|p: PercentValue| ReorderSpec { percent: p, correlation: None, gap }),
                    bandwidth: q!(8),
                    burst: q!(9),
                    queue_limit: queue,
                }
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn resolving_never_panics_and_yields_valid_impairments(
            forward in prop::option::of(impairment()),
            reverse in prop::option::of(impairment()),
            profile in prop::option::of(prop::sample::select(crate::api::Profile::ALL.to_vec())),
            symmetric in any::<bool>(),
            one_way in any::<bool>(),
        ) {
            let spec = NetworkLinkSpec {
                from: FromSpec { pod_selector: Default::default() },
                to: ToSpec { pod_selector: Some(Default::default()), namespace_selector: None, cidrs: vec![], services: ServiceInclusion::Matching },
                impairment: forward,
                reverse,
                symmetric,
                one_way,
                profile,
                priority: 0,
                verify: None,
                schedule: None,
            };
            if let Ok(r) = spec.resolve() {
                let valid = |i: &Impairment| Impairment::try_from(ImpairmentFields::from(i.clone())).is_ok();
                prop_assert!(valid(&r.forward));
                prop_assert!(r.reverse.as_ref().is_none_or(valid));
                prop_assert_eq!(r.reverse.is_some(), spec.has_reverse());
                let _ = r.summary();
            }
        }
    }
}
