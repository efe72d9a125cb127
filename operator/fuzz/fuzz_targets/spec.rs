//! Arbitrary JSON as a NetworkLink spec: deserializing and resolving never panics, whatever resolves yields
//! impairments the agent API accepts, and a spec written back out reads in as the same spec resolving the
//! same way (so no field the operator reads is lost when it stores or patches the object).
#![no_main]

use isthmus_agent_api::{Impairment, ImpairmentFields};
use isthmus_operator::api::NetworkLinkSpec;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(spec) = serde_json::from_slice::<NetworkLinkSpec>(data) else { return };
    let written = serde_json::to_vec(&spec).expect("a deserialized spec serializes");
    let reread: NetworkLinkSpec = serde_json::from_slice(&written)
        .unwrap_or_else(|e| panic!("{} does not read back: {e}", String::from_utf8_lossy(&written)));
    assert_eq!(reread, spec, "{}", String::from_utf8_lossy(&written));

    let resolved = spec.resolve();
    assert_eq!(reread.resolve(), resolved);
    if let Ok(resolved) = resolved {
        let accepted = |i: &Impairment| Impairment::try_from(ImpairmentFields::from(i.clone())).is_ok();
        assert!(accepted(&resolved.forward), "resolved impairments are valid");
        assert!(resolved.reverse.as_ref().is_none_or(accepted), "resolved impairments are valid");
        assert_eq!(resolved.reverse.is_some(), spec.has_reverse(), "{}", String::from_utf8_lossy(data));
        let _ = resolved.summary();
    }
});
