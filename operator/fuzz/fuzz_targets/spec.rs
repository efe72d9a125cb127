//! Arbitrary JSON as a NetworkLink spec: deserializing and resolving never panics, and whatever resolves
//! yields impairments the agent API accepts.
#![no_main]

use isthmus_operator::api::NetworkLinkSpec;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(spec) = serde_json::from_slice::<NetworkLinkSpec>(data) else { return };
    if let Ok(resolved) = spec.resolve() {
        resolved.forward.validate().expect("resolved impairments are valid");
        if let Some(r) = &resolved.reverse {
            r.validate().expect("resolved impairments are valid");
        }
        let _ = resolved.summary();
    }
});
