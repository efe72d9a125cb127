//! The agent API as the node dispatcher needs it. A trait, so that the controller runs against the real mTLS
//! client in production and against an in-memory agent in scenario tests.

use std::net::SocketAddr;

use futures::future::BoxFuture;
use isthmus_agent_api::client::{AgentClient, ClientError};
use isthmus_agent_api::measure::MeasuredState;
use isthmus_agent_api::{ApplyReply, NodePlan};

use crate::failure::CallErrorKind;

/// One node agent's API, reached at an address.
pub trait AgentApi: Send + Sync {
    /// Replaces the agent's node plan; the reply says, per pod, what the agent made of it.
    fn apply<'a>(&'a self, agent: SocketAddr, plan: &'a NodePlan) -> BoxFuture<'a, Result<ApplyReply, CallError>>;

    /// What the agent serving `node` measured over its last complete probe windows.
    fn measured<'a>(&'a self, agent: SocketAddr, node: &'a str) -> BoxFuture<'a, Result<MeasuredState, CallError>>;
}

/// A call that got no reply to act on. Its text is the one status messages and logs show.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct CallError {
    pub kind: CallErrorKind,
    pub message: String,
}

impl From<ClientError> for CallError {
    fn from(e: ClientError) -> Self {
        let kind = match &e {
            ClientError::ServerName { .. } => CallErrorKind::ServerName,
            ClientError::Connect { .. } => CallErrorKind::Connect,
            ClientError::Timeout { .. } => CallErrorKind::Timeout,
            ClientError::Http { .. } => CallErrorKind::Http,
            ClientError::Status { .. } if e.is_forbidden() => CallErrorKind::Forbidden,
            ClientError::Status { .. } => CallErrorKind::Status,
            ClientError::Decode { .. } | ClientError::TooLarge { .. } => CallErrorKind::Decode,
        };
        CallError { kind, message: e.to_string() }
    }
}

impl AgentApi for AgentClient {
    fn apply<'a>(&'a self, agent: SocketAddr, plan: &'a NodePlan) -> BoxFuture<'a, Result<ApplyReply, CallError>> {
        Box::pin(async move { AgentClient::apply(self, agent, plan).await.map_err(CallError::from) })
    }

    fn measured<'a>(&'a self, agent: SocketAddr, node: &'a str) -> BoxFuture<'a, Result<MeasuredState, CallError>> {
        Box::pin(async move { AgentClient::measured(self, agent, node).await.map_err(CallError::from) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_error_keeps_its_text_and_is_classified() {
        let agent: SocketAddr = "192.0.2.1:9443".parse().unwrap();
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let text = ClientError::Connect { agent, source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused) }
            .to_string();
        let e = CallError::from(ClientError::Connect { agent, source: refused });
        assert_eq!((e.kind, e.to_string()), (CallErrorKind::Connect, text));

        let forbidden = ClientError::Status {
            agent,
            status: http::StatusCode::FORBIDDEN,
            message: "client identity not allowed".into(),
        };
        assert_eq!(CallError::from(forbidden).kind, CallErrorKind::Forbidden);
        let other =
            ClientError::Status { agent, status: http::StatusCode::INTERNAL_SERVER_ERROR, message: "boom".into() };
        assert_eq!(CallError::from(other).kind, CallErrorKind::Status);
    }
}
