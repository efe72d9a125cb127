//! What the webhook answers: a NetworkTopology is admitted when it expands, refused naming the field and the
//! reason when it does not. Pure.

use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};

use crate::topology::{NetworkTopology, expand};

/// How a review ended (the label of `isthmus_operator_admission_reviews`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AdmissionOutcome {
    Admitted,
    Refused,
    /// The body was no AdmissionReview with a request.
    Unreadable,
}

impl AdmissionOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            AdmissionOutcome::Admitted => "admitted",
            AdmissionOutcome::Refused => "refused",
            AdmissionOutcome::Unreadable => "unreadable",
        }
    }
}

/// The answer to an AdmissionReview body: always a review (an unreadable one is answered as invalid, which
/// the API server reports as a refusal).
pub fn answer(body: &[u8]) -> (AdmissionReview<DynamicObject>, AdmissionOutcome) {
    let request = match request_of(body) {
        Ok(request) => request,
        Err(reason) => return (AdmissionResponse::invalid(reason).into_review(), AdmissionOutcome::Unreadable),
    };
    let response = decide(&request);
    let verdict = if response.allowed { AdmissionOutcome::Admitted } else { AdmissionOutcome::Refused };
    (response.into_review(), verdict)
}

/// The request of an AdmissionReview body, or why there is none (answered with [`AdmissionResponse::invalid`],
/// which the API server reports as a refusal).
pub fn request_of(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, String> {
    match serde_json::from_slice::<AdmissionReview<DynamicObject>>(body).map(TryInto::try_into) {
        Ok(Ok(request)) => Ok(request),
        Ok(Err(e)) => Err(e.to_string()),
        Err(e) => Err(format!("not an AdmissionReview: {e}")),
    }
}

/// Admits `request` when its object, a NetworkTopology, expands; anything but a create or an update passes.
pub fn decide(request: &AdmissionRequest<DynamicObject>) -> AdmissionResponse {
    let response = AdmissionResponse::from(request);
    if !matches!(request.operation, Operation::Create | Operation::Update) {
        return response;
    }
    let Some(object) = &request.object else {
        return response.deny("the request holds no object");
    };
    // The API server sends what it would store: a value its schema admits but the operator's types cannot
    // read is refused here rather than stored unrealisable.
    let topology = match serde_json::to_value(object).and_then(serde_json::from_value::<NetworkTopology>) {
        Ok(t) => t,
        Err(e) => return response.deny(format!("the operator cannot read this NetworkTopology: {e}")),
    };
    // Validation runs after the API server has generated a name for a create with generateName, so the object's
    // name is the one stored; the request's is empty then.
    let name = topology.metadata.name.as_deref().unwrap_or(&request.name);
    match expand(name, &topology.spec) {
        Ok(_) => response,
        Err(e) => response.deny(e),
    }
}

#[cfg(test)]
#[path = "review_tests.rs"]
mod tests;
