//! The loop both background writers share (link statuses, readiness gate conditions): jobs queued per object
//! by the controller task, written while this replica leads — at once when notified, after a leadership
//! change, and every 5 s for the ones that failed.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};

use crate::index::ObjectKey;

/// The writes queued, the newest per object.
pub(super) type Jobs<J> = Arc<Mutex<BTreeMap<ObjectKey, J>>>;

/// Runs `write` on every queued job while `leader` says this replica leads. A job that `write` hands back
/// failed: it is queued again unless a newer one for the same object took its place. Runs until aborted.
pub(super) async fn write_while_leading<J, F, Fut>(
    mut leader: watch::Receiver<bool>,
    jobs: Jobs<J>,
    notify: Arc<Notify>,
    mut write: F,
) where
    F: FnMut(ObjectKey, J) -> Fut,
    Fut: Future<Output = Result<(), J>>,
{
    loop {
        tokio::select! {
            _ = notify.notified() => {}
            _ = leader.changed() => {}
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
        if !*leader.borrow_and_update() {
            continue;
        }
        let batch = std::mem::take(&mut *jobs.lock().unwrap_or_else(|p| p.into_inner()));
        for (key, job) in batch {
            if !*leader.borrow() {
                break; // lost the lease: stop writing at once; the next leader decides everything again
            }
            if let Err(job) = write(key.clone(), job).await {
                jobs.lock().unwrap_or_else(|p| p.into_inner()).entry(key).or_insert(job);
            }
        }
    }
}
