//! One HTTP/1.1 request over a new TLS connection, written and read raw, for the tests of the listeners
//! themselves (the agent's API and metrics listeners, the operator's metrics listener): a raw exchange shows
//! exactly what the server sent, including refusals a typed client would turn into errors.

use std::net::SocketAddr;
use std::sync::Arc;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Sends `request` over a new TLS connection to `addr` (verified under `server_name` by `config`): everything the
/// server answered up to the connection's end, or the error.
pub async fn tls_exchange(
    addr: SocketAddr,
    server_name: &str,
    config: rustls::ClientConfig,
    request: &[u8],
) -> Result<String, String> {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = ServerName::try_from(server_name.to_owned()).map_err(|e| e.to_string())?;
    let mut tls = connector.connect(name, tcp).await.map_err(|e| e.to_string())?;
    // With TLS 1.3 the server's refusal of a client arrives after the client's side of the handshake: on first
    // use.
    tls.write_all(request).await.map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    match tls.read_to_end(&mut response).await {
        // A peer that closes without close_notify after a whole answer still answered.
        Err(e) if response.is_empty() => Err(e.to_string()),
        _ => Ok(String::from_utf8_lossy(&response).into_owned()),
    }
}

/// A server's answer to one request, split.
#[derive(Debug)]
pub struct Answer {
    /// The status code (0 where the status line could not be read).
    pub status: u16,
    /// The header lines, as sent.
    pub headers: String,
    pub body: String,
}

impl Answer {
    /// Splits a raw HTTP/1.1 response.
    pub fn parse(response: &str) -> Self {
        let (head, body) = response.split_once("\r\n\r\n").unwrap_or((response, ""));
        let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let headers = head.split_once("\r\n").map_or("", |(_, h)| h).to_owned();
        Answer { status, headers, body: body.to_owned() }
    }

    /// The value of the header `name` (case-insensitive), the first where several are sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.eq_ignore_ascii_case(name).then(|| value.trim())
        })
    }
}

/// `GET path` over a new TLS connection, with `Authorization: Bearer <token>` where a token is given.
pub async fn bearer_get(
    addr: SocketAddr,
    server_name: &str,
    config: rustls::ClientConfig,
    path: &str,
    token: Option<&str>,
) -> Result<Answer, String> {
    let authorization = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {server_name}\r\n{authorization}Connection: close\r\n\r\n");
    Ok(Answer::parse(&tls_exchange(addr, server_name, config, request.as_bytes()).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_split_into_status_headers_and_body() {
        let answer =
            Answer::parse("HTTP/1.1 401 Unauthorized\r\nwww-authenticate: Bearer\r\ncontent-length: 2\r\n\r\nno");
        assert_eq!(answer.status, 401);
        assert_eq!(answer.header("WWW-Authenticate"), Some("Bearer"));
        assert_eq!(answer.header("Content-Length"), Some("2"));
        assert_eq!(answer.header("Server"), None);
        assert_eq!(answer.body, "no");
        let garbled = Answer::parse("garbled");
        assert_eq!((garbled.status, garbled.headers.as_str(), garbled.body.as_str()), (0, "", ""));
    }
}
