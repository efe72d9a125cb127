//! The [`Reviewer`] that asks a real API server.

use super::{Decision, METRICS_PATH, METRICS_VERB, ReviewError, Reviewer};

/// The [`Reviewer`] that asks the API server: a TokenReview, then a SubjectAccessReview for the user it names.
/// Needs `create` on `tokenreviews` and `subjectaccessreviews` (what `system:auth-delegator` grants).
#[derive(Clone)]
pub struct KubeReviewer {
    client: kube::Client,
}

impl KubeReviewer {
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl Reviewer for KubeReviewer {
    async fn review(&self, token: &str) -> Result<Decision, ReviewError> {
        use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
        use k8s_openapi::api::authorization::v1::{
            NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
        };
        use kube::api::{Api, PostParams};

        let review = TokenReview {
            spec: TokenReviewSpec { token: Some(token.to_owned()), audiences: None },
            ..Default::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(ReviewError::TokenReview)?;
        let status = reviewed.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Ok(Decision::Unauthenticated);
        }
        let user = status.user.ok_or(ReviewError::NoUser)?;
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                uid: user.uid,
                groups: user.groups,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(METRICS_PATH.to_owned()),
                    verb: Some(METRICS_VERB.to_owned()),
                }),
                resource_attributes: None,
            },
            ..Default::default()
        };
        let answered = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &access)
            .await
            .map_err(ReviewError::SubjectAccessReview)?;
        Ok(if answered.status.is_some_and(|s| s.allowed) { Decision::Allowed } else { Decision::Forbidden })
    }
}
