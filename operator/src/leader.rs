//! Leader election on a `coordination.k8s.io` Lease (kube-lease-manager): only the leader sends plans and writes
//! statuses and finalizers; a follower keeps its index warm so that a hand-over costs one resync, not a re-list.

use kube::Client;
use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[derive(Debug, Clone)]
pub struct LeaderConfig {
    pub lease_name: String,
    pub lease_namespace: String,
    /// This replica's identity in the Lease (its pod name).
    pub identity: String,
    /// Seconds a lease lasts without renewal.
    pub duration_s: u64,
    /// Seconds before expiry at which the holder renews.
    pub grace_s: u64,
}

/// A running election: `is_leader` flips as the lease is won or lost.
pub struct Election {
    pub is_leader: watch::Receiver<bool>,
    task: JoinHandle<Result<kube_lease_manager::LeaseManager, LeaseManagerError>>,
}

impl Election {
    pub async fn start(client: Client, config: &LeaderConfig) -> Result<Self, LeaseManagerError> {
        let manager = LeaseManagerBuilder::new(client, &config.lease_name)
            .with_namespace(&config.lease_namespace)
            .with_identity(&config.identity)
            .with_duration(config.duration_s)
            .with_grace(config.grace_s)
            .build()
            .await?;
        let (is_leader, task) = manager.watch().await;
        Ok(Self { is_leader, task })
    }

    /// A fixed answer, for a single replica run without election (`--leader-election=false`).
    pub fn always_leader() -> (watch::Sender<bool>, watch::Receiver<bool>) {
        watch::channel(true)
    }

    /// Gives the lease up (dropping every receiver makes the manager release it) and waits for that.
    pub async fn release(self, others: Vec<watch::Receiver<bool>>) {
        drop(others);
        drop(self.is_leader);
        match self.task.await {
            Ok(Ok(_)) => tracing::info!("leader lease released"),
            Ok(Err(e)) => tracing::warn!(error = %e, "releasing the leader lease"),
            Err(e) => tracing::warn!(error = %e, "lease task ended abnormally"),
        }
    }
}
