//! The operator's own counters, read from its plain /metrics (OpenMetrics text) on loopback: how many status
//! writes and plan recomputations the apply cost.

use isthmus_test_kit::openmetrics;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub status_writes: u64,
    pub recomputes: u64,
}

impl Counters {
    pub fn since(self, before: Counters) -> Counters {
        Counters {
            status_writes: self.status_writes.saturating_sub(before.status_writes),
            recomputes: self.recomputes.saturating_sub(before.recomputes),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error("reading the operator's metrics at {address}: {source}")]
    Io { address: String, source: std::io::Error },
    #[error("the operator's metrics at {address} answered without a body")]
    NoBody { address: String },
}

/// GET /metrics from `address` (host:port).
pub async fn counters(address: &str) -> Result<Counters, ScrapeError> {
    let io = |source| ScrapeError::Io { address: address.to_owned(), source };
    let mut stream = tokio::net::TcpStream::connect(address).await.map_err(io)?;
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.map_err(io)?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.map_err(io)?;
    let (_, body) = answer.split_once("\r\n\r\n").ok_or_else(|| ScrapeError::NoBody { address: address.to_owned() })?;
    Ok(parse(body))
}

fn parse(text: &str) -> Counters {
    Counters {
        status_writes: openmetrics::sum(text, "isthmus_operator_status_patches_total", &["result=\"ok\""]) as u64,
        recomputes: openmetrics::sum(text, "isthmus_operator_reconciles_total", &[]) as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_summed_over_their_samples_and_only_the_named_label_counts() {
        let text = "# TYPE isthmus_operator_status_patches counter\n\
                    isthmus_operator_status_patches_total{result=\"ok\"} 120\n\
                    isthmus_operator_status_patches_total{result=\"error\"} 3\n\
                    isthmus_operator_reconciles_total 17\n\
                    isthmus_operator_reconciles_total_other 5\n\
                    isthmus_operator_reconcile_duration_seconds_count 17\n# EOF\n";
        assert_eq!(parse(text), Counters { status_writes: 120, recomputes: 17 });
        let later = Counters { status_writes: 150, recomputes: 20 };
        assert_eq!(later.since(parse(text)), Counters { status_writes: 30, recomputes: 3 });
    }
}
