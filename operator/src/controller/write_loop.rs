//! The loop both background writers share (link statuses, readiness gate conditions): jobs queued per object
//! by the controller task, written while this replica leads, at once when notified or after a leadership
//! change; a job that failed is tried again on the next retry tick (every 5 s) unless a newer one for its object
//! came first.
//!
//! Writes are a pipeline, not batches: up to [`CONCURRENT_WRITES`] are in flight, each to another object, and a
//! slot that frees takes the next queued job at once. An object has at most one write in flight, so its writes
//! land in the order they were queued, and a job queued while its object's write is in flight waits for that
//! write (the newest job replacing an older one still queued). Written one batch at a time, a link's status
//! queued just after a batch began waited for the batch's slowest write (an API server busy with a hundred new
//! links took 400 ms for some), then for the whole next batch: a link whose pairs were all applied 30 ms after
//! it was seen showed it a second later (`make bench-scale`, docs/benchmarks.md).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::{Notify, watch};

use crate::index::ObjectKey;

/// Writes in flight at once, each to another object.
const CONCURRENT_WRITES: usize = 8;
const RETRY_EVERY: Duration = Duration::from_secs(5);

/// The writes queued, the newest per object.
pub(super) type Jobs<J> = Arc<Mutex<BTreeMap<ObjectKey, J>>>;

/// Runs `write` on every queued job while `leader` says this replica leads. A job that `write` hands back
/// failed: it is queued again on the next retry tick unless a newer one for the same object took its place.
/// Runs until aborted.
pub(super) async fn write_while_leading<J, F, Fut>(
    mut leader: watch::Receiver<bool>,
    jobs: Jobs<J>,
    notify: Arc<Notify>,
    write: F,
) where
    F: Fn(ObjectKey, J) -> Fut,
    Fut: Future<Output = Result<(), J>>,
{
    let write = &write;
    let mut in_flight = FuturesUnordered::new();
    let mut busy: BTreeSet<ObjectKey> = BTreeSet::new();
    let mut failed: BTreeMap<ObjectKey, J> = BTreeMap::new();
    let mut retry = tokio::time::interval(RETRY_EVERY);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // Lost the lease: no new write (those in flight finish); the next leader decides everything again.
        if *leader.borrow_and_update() {
            let mut queued = jobs.lock().unwrap_or_else(|p| p.into_inner());
            let free = CONCURRENT_WRITES.saturating_sub(in_flight.len());
            let next: Vec<ObjectKey> = queued.keys().filter(|k| !busy.contains(*k)).take(free).cloned().collect();
            for key in next {
                let job = queued.remove(&key).expect("a key just listed");
                // A newer job than one that failed: the failed one must never follow it.
                failed.remove(&key);
                busy.insert(key.clone());
                in_flight.push(async move { (key.clone(), write(key, job).await) });
            }
        }
        tokio::select! {
            Some((key, result)) = in_flight.next(), if !in_flight.is_empty() => {
                busy.remove(&key);
                // A newer job for the object, already queued, starts next and drops this one.
                if let Err(job) = result {
                    failed.insert(key, job);
                }
            }
            _ = notify.notified() => {}
            _ = leader.changed() => {}
            _ = retry.tick() => {
                let mut queued = jobs.lock().unwrap_or_else(|p| p.into_inner());
                for (key, job) in std::mem::take(&mut failed) {
                    queued.entry(key).or_insert(job);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// What the fake writer saw: each write's key and job, in the order they started, and the most in flight.
    #[derive(Default)]
    struct Seen {
        started: Mutex<Vec<(String, u32)>>,
        now: AtomicUsize,
        most: AtomicUsize,
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("ns", name)
    }

    fn queue(jobs: &Jobs<u32>, notify: &Notify, name: &str, job: u32) {
        jobs.lock().unwrap().insert(key(name), job);
        notify.notify_one();
    }

    /// Starts the loop with a writer that takes `took` for each write and fails job numbers in `fail`.
    fn start(
        leader: watch::Receiver<bool>,
        took: Duration,
        fail: &'static [u32],
    ) -> (Jobs<u32>, Arc<Notify>, Arc<Seen>, tokio::task::JoinHandle<()>) {
        let (jobs, notify, seen): (Jobs<u32>, Arc<Notify>, Arc<Seen>) = Default::default();
        let (j, n, s) = (jobs.clone(), notify.clone(), seen.clone());
        let task = tokio::spawn(async move {
            write_while_leading(leader, j, n, |key, job| {
                let s = s.clone();
                async move {
                    s.started.lock().unwrap().push((key.name.clone(), job));
                    let now = s.now.fetch_add(1, Ordering::SeqCst) + 1;
                    s.most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(took).await;
                    s.now.fetch_sub(1, Ordering::SeqCst);
                    if fail.contains(&job) { Err(job) } else { Ok(()) }
                }
            })
            .await
        });
        (jobs, notify, seen, task)
    }

    fn started(seen: &Seen) -> Vec<(String, u32)> {
        seen.started.lock().unwrap().clone()
    }

    #[tokio::test(start_paused = true)]
    async fn a_slot_that_frees_takes_the_next_job_at_once_and_no_more_than_the_limit_run() {
        let (_tx, rx) = watch::channel(true);
        let (jobs, notify, seen, task) = start(rx, Duration::from_millis(100), &[]);
        for i in 0..20 {
            queue(&jobs, &notify, &format!("l{i:02}"), i);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(started(&seen).len(), CONCURRENT_WRITES);
        // One more queued while all slots are busy starts as soon as the first write ends, not after a batch.
        queue(&jobs, &notify, "late", 99);
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(started(&seen).len(), 2 * CONCURRENT_WRITES);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(started(&seen).len(), 21);
        assert_eq!(seen.most.load(Ordering::SeqCst), CONCURRENT_WRITES);
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn an_object_has_one_write_in_flight_and_its_newest_job_follows_it() {
        let (_tx, rx) = watch::channel(true);
        let (jobs, notify, seen, task) = start(rx, Duration::from_millis(100), &[]);
        queue(&jobs, &notify, "a", 1);
        tokio::time::sleep(Duration::from_millis(10)).await;
        queue(&jobs, &notify, "a", 2);
        queue(&jobs, &notify, "a", 3);
        queue(&jobs, &notify, "b", 1);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(started(&seen), vec![("a".into(), 1), ("b".into(), 1)], "a's second write waits for its first");
        assert_eq!(seen.most.load(Ordering::SeqCst), 2);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(started(&seen), vec![("a".into(), 1), ("b".into(), 1), ("a".into(), 3)], "only the newest follows");
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_job_waits_for_the_retry_tick_unless_a_newer_one_comes() {
        let (_tx, rx) = watch::channel(true);
        let (jobs, notify, seen, task) = start(rx, Duration::from_millis(10), &[1, 5]);
        queue(&jobs, &notify, "a", 1);
        queue(&jobs, &notify, "b", 5);
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Another object's job does not bring the failed ones back early.
        queue(&jobs, &notify, "c", 7);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(started(&seen).len(), 3);
        // A newer job for "b" replaces its failed one.
        queue(&jobs, &notify, "b", 6);
        tokio::time::sleep(RETRY_EVERY).await;
        let writes = started(&seen);
        assert_eq!(writes[3..].to_vec(), vec![("b".into(), 6), ("a".into(), 1)], "{writes:?}");
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_that_fails_while_a_newer_job_waits_is_dropped() {
        let (_tx, rx) = watch::channel(true);
        let (jobs, notify, seen, task) = start(rx, Duration::from_millis(100), &[1]);
        queue(&jobs, &notify, "a", 1);
        tokio::time::sleep(Duration::from_millis(10)).await;
        queue(&jobs, &notify, "a", 2);
        tokio::time::sleep(RETRY_EVERY * 2).await;
        assert_eq!(started(&seen), vec![("a".into(), 1), ("a".into(), 2)]);
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_written_while_another_replica_leads_and_the_queue_waits_for_the_lease() {
        let (tx, rx) = watch::channel(false);
        let (jobs, notify, seen, task) = start(rx, Duration::from_millis(10), &[]);
        queue(&jobs, &notify, "a", 1);
        tokio::time::sleep(RETRY_EVERY * 2).await;
        assert!(started(&seen).is_empty());
        tx.send(true).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(started(&seen), vec![("a".into(), 1)]);
        task.abort();
    }
}
