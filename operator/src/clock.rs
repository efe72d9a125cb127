//! The time the operator writes into the objects it keeps: conditions' `lastTransitionTime`, shared by the
//! link statuses, the readiness gates and the topologies' statuses.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Now, in whole seconds.
pub fn now_seconds() -> Time {
    // The API server keeps whole seconds; a sub-second time would never compare equal after a round trip.
    let secs = k8s_openapi::jiff::Timestamp::now().as_second();
    Time(k8s_openapi::jiff::Timestamp::from_second(secs).expect("now is a valid timestamp"))
}
