//! `isthmus-operator wait-for-links`: the first init container of a held pod ([`crate::admission::hold`]). It
//! asks the operator's webhook listener every 250 ms whether the pod's `isthmus.dev/links-applied` condition is
//! True, says each new answer once, and exits 0 when it is; at the timeout it exits non-zero naming the timeout
//! and the last answer, so that the pod fails loudly rather than running unimpaired. Configured by the
//! environment the webhook gives the container ([`crate::admission::hold::env`]).
//!
//! The condition is read through the operator, not the API server, so that the pod needs no ServiceAccount token
//! and no RBAC: the listener answers only for a pod named with its UID, which only the pod itself knows.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

use crate::admission::hold::env;
use crate::admission::links_applied::LinksApplied;

/// How often the condition is asked for: a held pod starts within this of its links being applied.
pub const POLL: Duration = Duration::from_millis(250);
/// One exchange's limit: a slow answer is one more try, not a stuck container.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(5);
/// An answer is a condition's status, reason and message.
const MAX_ANSWER: usize = 64 * 1024;

/// What one try found: the listener's answer, or why there was none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Condition(LinksApplied),
    /// The listener could not be asked, or answered with an error: its text.
    NoAnswer(String),
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answer::Condition(c) => write!(f, "isthmus.dev/links-applied {c}"),
            Answer::NoAnswer(e) => write!(f, "no answer from the operator: {e}"),
        }
    }
}

/// The wait's state between tries. Pure.
#[derive(Debug, Default)]
pub struct Waiting {
    last: Option<Answer>,
}

/// What to do after a try.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// The links are applied: run the pod.
    Done,
    /// Ask again; `Some` is a new answer, to be said once.
    Again(Option<String>),
}

impl Waiting {
    pub fn step(&mut self, answer: Answer) -> Step {
        if matches!(&answer, Answer::Condition(c) if c.status == "True") {
            return Step::Done;
        }
        let news = (self.last.as_ref() != Some(&answer)).then(|| answer.to_string());
        self.last = Some(answer);
        Step::Again(news)
    }

    /// The error at the timeout: the timeout and what was last heard.
    pub fn timed_out(&self, after: Duration) -> WaitError {
        let last = self.last.as_ref().map_or_else(|| "nothing yet".to_owned(), ToString::to_string);
        WaitError::TimedOut { after, last }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    #[error(
        "the pod's links were not applied within {}s (the hold's timeout; annotation \
         isthmus.dev/wait-for-links-timeout); last: {last}",
        after.as_secs()
    )]
    TimedOut { after: Duration, last: String },
    #[error("{name}: {reason}")]
    Config { name: &'static str, reason: String },
}

/// The container's configuration, from its environment.
#[derive(Debug, Clone)]
pub struct WaitConfig {
    /// Host (checked against the certificate), port and path of the listener's endpoint.
    pub host: String,
    pub port: u16,
    pub path: String,
    /// Where to connect: the Service's ClusterIP when given, else the URL's host resolved.
    pub address: Option<SocketAddr>,
    pub ca_bundle: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub timeout: Duration,
}

impl WaitConfig {
    /// Reads the environment through `var`, naming the variable of any value it cannot use.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Self, WaitError> {
        let need = |name: &'static str| {
            var(name).filter(|v| !v.is_empty()).ok_or(WaitError::Config { name, reason: "not set".into() })
        };
        let url = need(env::URL)?;
        let bad_url = |reason: &str| WaitError::Config { name: env::URL, reason: format!("{url:?}: {reason}") };
        let rest = url.strip_prefix("https://").ok_or_else(|| bad_url("not an https:// URL"))?;
        let (authority, path) = rest.split_once('/').map_or((rest, "/".to_owned()), |(a, p)| (a, format!("/{p}")));
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), p.parse().map_err(|_| bad_url("its port is not a number"))?),
            None => (authority.to_owned(), 443),
        };
        let address =
            match var(env::ADDRESS).filter(|v| !v.is_empty()) {
                Some(a) => Some(a.parse().map_err(|e| WaitError::Config {
                    name: env::ADDRESS,
                    reason: format!("{a:?}: {e} (an IP:port)"),
                })?),
                None => None,
            };
        let timeout = need(env::TIMEOUT)?;
        let seconds: u64 = timeout.parse().map_err(|_| WaitError::Config {
            name: env::TIMEOUT,
            reason: format!("{timeout:?}: not a number of seconds"),
        })?;
        Ok(WaitConfig {
            host,
            port,
            path,
            address,
            ca_bundle: need(env::CA_BUNDLE)?,
            namespace: need(env::NAMESPACE)?,
            name: need(env::NAME)?,
            uid: need(env::UID)?,
            timeout: Duration::from_secs(seconds),
        })
    }

    /// The request's path and query: the pod, named with its UID.
    pub fn path_and_query(&self) -> String {
        format!("{}?namespace={}&name={}&uid={}", self.path, self.namespace, self.name, self.uid)
    }
}

/// Waits until the pod's links are applied, or fails at the timeout.
pub async fn run(config: WaitConfig) -> Result<(), WaitError> {
    let tls = tls_config(&config)?;
    let deadline = tokio::time::Instant::now() + config.timeout;
    let mut waiting = Waiting::default();
    let mut connection = None;
    println!(
        "waiting for the links of pod {}/{} (uid {}) to be applied, at most {}s",
        config.namespace,
        config.name,
        config.uid,
        config.timeout.as_secs()
    );
    loop {
        let answer = match tokio::time::timeout(EXCHANGE_TIMEOUT, ask(&config, &tls, &mut connection)).await {
            Ok(answer) => answer,
            Err(_) => {
                connection = None;
                Answer::NoAnswer(format!("no reply within {}s", EXCHANGE_TIMEOUT.as_secs()))
            }
        };
        match waiting.step(answer) {
            Step::Done => {
                println!("the pod's links are applied: starting it");
                return Ok(());
            }
            Step::Again(news) => {
                if let Some(news) = news {
                    println!("{news}");
                }
            }
        }
        if tokio::time::Instant::now() + POLL > deadline {
            return Err(waiting.timed_out(config.timeout));
        }
        tokio::time::sleep(POLL).await;
    }
}

fn tls_config(config: &WaitConfig) -> Result<Arc<rustls::ClientConfig>, WaitError> {
    let bad = |reason: String| WaitError::Config { name: env::CA_BUNDLE, reason };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(config.ca_bundle.as_bytes()) {
        roots.add(cert.map_err(|e| bad(e.to_string()))?).map_err(|e| bad(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(bad("holds no certificate".into()));
    }
    let tls = rustls::ClientConfig::builder_with_provider(isthmus_agent_api::tls::crypto_provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(tls))
}

/// The connection to the listener, kept between polls (the listener closes it after a minute; a new one is
/// opened when it is gone), so that a held pod costs the operator one TLS handshake, not four a second.
struct Connection {
    sender: hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    driver: tokio::task::JoinHandle<()>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// Asks the listener once, over `connection` when it is still open; a failed exchange drops it.
async fn ask(config: &WaitConfig, tls: &Arc<rustls::ClientConfig>, connection: &mut Option<Connection>) -> Answer {
    let result = exchange(config, tls, connection).await;
    if result.is_err() {
        *connection = None;
    }
    match result {
        Ok((StatusCode::OK, body)) => match serde_json::from_slice::<LinksApplied>(&body) {
            Ok(c) => Answer::Condition(c),
            Err(e) => Answer::NoAnswer(format!("an answer it cannot read: {e}")),
        },
        Ok((status, body)) => Answer::NoAnswer(format!("{status}: {}", String::from_utf8_lossy(&body).trim())),
        Err(e) => Answer::NoAnswer(e),
    }
}

async fn connect(config: &WaitConfig, tls: &Arc<rustls::ClientConfig>) -> Result<Connection, String> {
    let server_name =
        ServerName::try_from(config.host.clone()).map_err(|e| format!("{:?} is no DNS name: {e}", config.host))?;
    let tcp = match config.address {
        Some(address) => tokio::net::TcpStream::connect(address).await,
        None => tokio::net::TcpStream::connect((config.host.as_str(), config.port)).await,
    }
    .map_err(|e| format!("connecting: {e}"))?;
    let stream = tokio_rustls::TlsConnector::from(tls.clone())
        .connect(server_name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let (sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| format!("HTTP: {e}"))?;
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(Connection { sender, driver })
}

async fn exchange(
    config: &WaitConfig,
    tls: &Arc<rustls::ClientConfig>,
    connection: &mut Option<Connection>,
) -> Result<(StatusCode, Bytes), String> {
    if connection.as_ref().is_none_or(|c| c.sender.is_closed()) {
        *connection = Some(connect(config, tls).await?);
    }
    let sender = &mut connection.as_mut().expect("connected above").sender;
    sender.ready().await.map_err(|e| format!("HTTP: {e}"))?;
    let request = Request::get(config.path_and_query())
        .header(hyper::header::HOST, config.host.as_str())
        .body(Empty::<Bytes>::new())
        .map_err(|e| format!("the request: {e}"))?;
    let response = sender.send_request(request).await.map_err(|e| format!("HTTP: {e}"))?;
    let status = response.status();
    let body = Limited::new(response.into_body(), MAX_ANSWER).collect().await;
    body.map(|b| (status, b.to_bytes())).map_err(|e| format!("reading the answer: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(status: &str, reason: &str) -> Answer {
        Answer::Condition(LinksApplied { status: status.into(), reason: reason.into(), message: String::new() })
    }

    #[test]
    fn each_new_answer_is_said_once_and_true_ends_the_wait() {
        let mut w = Waiting::default();
        let said = |s: Step| match s {
            Step::Again(news) => news,
            Step::Done => panic!("done too soon"),
        };
        assert_eq!(
            said(w.step(Answer::NoAnswer("connecting: refused".into()))).unwrap(),
            "no answer from the operator: connecting: refused"
        );
        assert_eq!(said(w.step(Answer::NoAnswer("connecting: refused".into()))), None);
        assert_eq!(said(w.step(condition("Unknown", ""))).unwrap(), "isthmus.dev/links-applied Unknown");
        assert_eq!(said(w.step(condition("Unknown", ""))), None);
        assert_eq!(
            said(w.step(condition("False", "PodNotFound"))).unwrap(),
            "isthmus.dev/links-applied False (PodNotFound)"
        );
        assert_eq!(
            w.timed_out(Duration::from_secs(120)).to_string(),
            "the pod's links were not applied within 120s (the hold's timeout; annotation \
             isthmus.dev/wait-for-links-timeout); last: isthmus.dev/links-applied False (PodNotFound)"
        );
        assert_eq!(w.step(condition("True", "Applied")), Step::Done);
        assert_eq!(
            Waiting::default().timed_out(Duration::from_secs(5)).to_string(),
            "the pod's links were not applied within 5s (the hold's timeout; annotation \
             isthmus.dev/wait-for-links-timeout); last: nothing yet"
        );
    }

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: std::collections::HashMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| map.get(k).cloned()
    }

    fn full() -> Vec<(&'static str, &'static str)> {
        vec![
            (env::URL, "https://isthmus-webhook.isthmus-system.svc:9443/v1/links-applied"),
            (env::ADDRESS, "10.96.0.20:9443"),
            (env::CA_BUNDLE, "pem"),
            (env::NAMESPACE, "shop"),
            (env::NAME, "api-0"),
            (env::UID, "0b4e"),
            (env::TIMEOUT, "120"),
        ]
    }

    #[test]
    fn the_environment_is_read_and_a_bad_value_is_named() {
        let c = WaitConfig::from_env(vars(&full())).unwrap();
        assert_eq!(
            (c.host.as_str(), c.port, c.path.as_str()),
            ("isthmus-webhook.isthmus-system.svc", 9443, "/v1/links-applied")
        );
        assert_eq!(c.address, Some("10.96.0.20:9443".parse().unwrap()));
        assert_eq!(c.timeout, Duration::from_secs(120));
        assert_eq!(c.path_and_query(), "/v1/links-applied?namespace=shop&name=api-0&uid=0b4e");
        let without_address: Vec<_> = full().into_iter().filter(|(k, _)| *k != env::ADDRESS).collect();
        assert_eq!(WaitConfig::from_env(vars(&without_address)).unwrap().address, None);
        for (name, value, error) in [
            (env::URL, "http://x/y", "ISTHMUS_LINKS_APPLIED_URL: \"http://x/y\": not an https:// URL"),
            (env::URL, "https://x:port/y", "ISTHMUS_LINKS_APPLIED_URL: \"https://x:port/y\": its port is not a number"),
            (
                env::ADDRESS,
                "webhook:9443",
                "ISTHMUS_OPERATOR_ADDRESS: \"webhook:9443\": invalid socket address syntax (an IP:port)",
            ),
            (env::TIMEOUT, "2m", "ISTHMUS_WAIT_TIMEOUT_SECONDS: \"2m\": not a number of seconds"),
            (env::UID, "", "ISTHMUS_POD_UID: not set"),
        ] {
            let mut v = full();
            v.retain(|(k, _)| *k != name);
            v.push((name, value));
            assert_eq!(WaitConfig::from_env(vars(&v)).unwrap_err().to_string(), error);
        }
    }
}
