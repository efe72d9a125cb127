//! Leader election on a `coordination.k8s.io` Lease (kube-lease-manager): only the leader sends plans and writes
//! statuses and finalizers; a follower keeps its index warm so that a hand-over costs one resync, not a re-list.
//!
//! kube-lease-manager keeps saying "leader" while it cannot reach the API server: its renewals fail, but its
//! answer only changes when it sees the Lease again. Meanwhile the Lease expires and, once the API server is back,
//! another replica takes it, so for a while two replicas would dispatch plans. A fence closes that window: while
//! the manager says "leader", this replica reads the Lease itself every second and leads only until the Lease it
//! last saw (held by this identity) expires, minus a margin for clock skew. Without a fresh read it steps down
//! before any other replica could have taken over.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How often the leader reads its Lease, and how long one read may take.
const FENCE_PERIOD: Duration = Duration::from_secs(1);

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

impl LeaderConfig {
    /// How long before the Lease's expiry this replica stops leading: half the renewal grace (renewals land
    /// earlier than that, so a healthy leader never steps down), at most 2 s.
    fn fence_margin(&self) -> Duration {
        Duration::from_millis(self.grace_s * 500).min(Duration::from_secs(2))
    }
}

/// A running election: `is_leader` flips as the lease is won or lost, or can no longer be confirmed.
pub struct Election {
    pub is_leader: watch::Receiver<bool>,
    manager: JoinHandle<Result<kube_lease_manager::LeaseManager, LeaseManagerError>>,
    fence: JoinHandle<()>,
}

impl Election {
    pub async fn start(client: Client, config: &LeaderConfig) -> Result<Self, LeaseManagerError> {
        let manager = LeaseManagerBuilder::new(client.clone(), &config.lease_name)
            .with_namespace(&config.lease_namespace)
            .with_identity(&config.identity)
            .with_duration(config.duration_s)
            .with_grace(config.grace_s)
            .build()
            .await?;
        let (holds, manager) = manager.watch().await;
        let (tx, is_leader) = watch::channel(false);
        let fence = Fence {
            leases: Api::namespaced(client, &config.lease_namespace),
            lease_name: config.lease_name.clone(),
            identity: config.identity.clone(),
            margin: config.fence_margin(),
        };
        let fence = tokio::spawn(fence.run(holds, tx));
        Ok(Self { is_leader, manager, fence })
    }

    /// A fixed answer, for a single replica run without election (`--leader-election=false`).
    pub fn always_leader() -> (watch::Sender<bool>, watch::Receiver<bool>) {
        watch::channel(true)
    }

    /// Gives the lease up and waits for that: dropping every receiver stops the fence, which drops the manager's
    /// last receiver, which makes the manager release the Lease.
    pub async fn release(self, others: Vec<watch::Receiver<bool>>) {
        drop(others);
        drop(self.is_leader);
        if let Err(e) = self.fence.await {
            tracing::warn!(error = %e, "leader fence ended abnormally");
        }
        match self.manager.await {
            Ok(Ok(_)) => tracing::info!("leader lease released"),
            Ok(Err(e)) => tracing::warn!(error = %e, "releasing the leader lease"),
            Err(e) => tracing::warn!(error = %e, "lease task ended abnormally"),
        }
    }
}

struct Fence {
    leases: Api<Lease>,
    lease_name: String,
    identity: String,
    margin: Duration,
}

impl Fence {
    /// Publishes "leader" while the manager says so and the last read of the Lease vouches for now. The step-down
    /// is timed by the Lease's expiry, not by the reads: a read that hangs is cut off when the Lease runs out.
    async fn run(self, mut holds: watch::Receiver<bool>, out: watch::Sender<bool>) {
        let mut confirmed_until: Option<SystemTime> = None;
        let mut tick = tokio::time::interval(FENCE_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let leading = *out.borrow();
            let expiry = time_left(confirmed_until).filter(|_| leading).unwrap_or(Duration::MAX);
            tokio::select! {
                biased;
                _ = out.closed() => return,
                changed = holds.changed() => if changed.is_err() {
                    out.send_replace(false);
                    tracing::warn!("the lease manager stopped; not leading");
                    return;
                },
                _ = tokio::time::sleep(expiry) => {}
                _ = tick.tick() => {}
            }
            let manager_holds = *holds.borrow_and_update();
            if !manager_holds {
                confirmed_until = None;
            } else {
                // While leading, a read may not outlast the Lease it is meant to renew our confidence in.
                let budget = match leading {
                    true => time_left(confirmed_until).map_or(Duration::ZERO, |left| left.min(FENCE_PERIOD)),
                    false => FENCE_PERIOD,
                };
                match tokio::time::timeout(budget, self.leases.get_opt(&self.lease_name)).await {
                    Ok(Ok(lease)) => {
                        confirmed_until = lease.and_then(|l| lease_held_until(&l, &self.identity, self.margin))
                    }
                    Ok(Err(e)) => tracing::debug!(error = %e, "reading the leader Lease"),
                    Err(_) => tracing::debug!("reading the leader Lease timed out"),
                }
            }
            let now_leading = manager_holds && time_left(confirmed_until).is_some();
            out.send_if_modified(|current| std::mem::replace(current, now_leading) != now_leading);
            if leading && !now_leading && manager_holds {
                tracing::warn!(
                    lease = %self.lease_name,
                    "the leader Lease could not be confirmed before it expires; not leading until it is"
                );
            }
        }
    }
}

/// Time until `until`, `None` once it has passed (or when there is nothing to wait for).
fn time_left(until: Option<SystemTime>) -> Option<Duration> {
    until?.duration_since(SystemTime::now()).ok().filter(|left| !left.is_zero())
}

/// Until when `lease` says `identity` holds it, less `margin`; `None` when someone else (or no one) holds it or
/// it carries no renewal.
pub fn lease_held_until(lease: &Lease, identity: &str, margin: Duration) -> Option<SystemTime> {
    let spec = lease.spec.as_ref()?;
    if spec.holder_identity.as_deref() != Some(identity) {
        return None;
    }
    let renewed: SystemTime = spec.renew_time.as_ref()?.0.into();
    let duration = Duration::from_secs(u64::try_from(spec.lease_duration_seconds?).ok()?);
    renewed.checked_add(duration)?.checked_sub(margin)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::Timestamp;

    fn lease(holder: Option<&str>, renewed: Option<SystemTime>, duration_s: Option<i32>) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                renew_time: renewed.map(|t| MicroTime(Timestamp::try_from(t).unwrap())),
                lease_duration_seconds: duration_s,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_lease_held_by_this_identity_vouches_until_its_expiry_less_the_margin() {
        let renewed = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let until = lease_held_until(&lease(Some("a"), Some(renewed), Some(15)), "a", Duration::from_secs(2));
        assert_eq!(until, Some(renewed + Duration::from_secs(13)));
    }

    #[test]
    fn a_lease_held_by_another_or_no_one_or_never_renewed_vouches_for_nothing() {
        let now = SystemTime::now();
        let margin = Duration::from_secs(2);
        assert_eq!(lease_held_until(&lease(Some("b"), Some(now), Some(15)), "a", margin), None);
        assert_eq!(lease_held_until(&lease(None, Some(now), Some(15)), "a", margin), None);
        assert_eq!(lease_held_until(&lease(Some("a"), None, Some(15)), "a", margin), None);
        assert_eq!(lease_held_until(&lease(Some("a"), Some(now), None), "a", margin), None);
        assert_eq!(lease_held_until(&lease(Some("a"), Some(now), Some(-1)), "a", margin), None);
        assert_eq!(lease_held_until(&Lease::default(), "a", margin), None);
    }

    #[test]
    fn the_margin_is_below_the_renewal_grace_so_a_healthy_leader_never_steps_down() {
        for grace_s in [1, 2, 5, 10, 30] {
            let config = LeaderConfig {
                lease_name: "l".into(),
                lease_namespace: "n".into(),
                identity: "a".into(),
                duration_s: 15,
                grace_s,
            };
            let margin = config.fence_margin();
            assert!(margin < Duration::from_secs(grace_s), "grace {grace_s} s, margin {margin:?}");
            assert!(margin > Duration::ZERO);
        }
    }
}
