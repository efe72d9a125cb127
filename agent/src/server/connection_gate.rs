//! Admission of connections to one listener phase: at most `capacity` at once, shared fairly between source
//! addresses, so that nobody can keep the operator (or kubelet's probes) out by opening connections and letting
//! them sit.
//!
//! A connection that arrives when every slot is taken takes one from somebody else, or is refused:
//! 1. from the address holding the most slots, when that address holds at least two more than the newcomer's
//!    (its oldest connection goes): one address alone can fill the gate only while nobody else needs it, and a
//!    caller with one connection gets in unless the gate is spread over `capacity` different addresses;
//! 2. otherwise from the oldest holder, once it has held its slot for `stale_after`: a TLS handshake or a probe
//!    takes milliseconds, so a connection that has sat for seconds is not a caller worth waiting for;
//! 3. otherwise the newcomer is refused (closed at once), which costs the gate nothing.
//!
//! Admission is synchronous and never waits, so the accept loop stays the only place that holds sockets that have
//! no slot. An evicted holder is told through its [`Slot`] and closes its connection.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

/// How a connection was let in when the gate was full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eviction {
    /// The address with the most slots gave one up.
    Heaviest,
    /// The oldest holder had held its slot for longer than `stale_after`.
    Stale,
}

/// Every slot is taken and none can be given up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused;

#[derive(Debug)]
pub struct ConnectionGate {
    state: Arc<Mutex<State>>,
    capacity: usize,
    stale_after: Duration,
}

#[derive(Debug, Default)]
struct State {
    next: u64,
    /// By admission order: the first entry is the oldest.
    holders: BTreeMap<u64, Holder>,
    by_address: HashMap<IpAddr, BTreeSet<u64>>,
}

#[derive(Debug)]
struct Holder {
    address: IpAddr,
    since: Instant,
    evict: oneshot::Sender<()>,
}

impl State {
    fn remove(&mut self, id: u64) -> Option<Holder> {
        let holder = self.holders.remove(&id)?;
        if let Some(ids) = self.by_address.get_mut(&holder.address) {
            ids.remove(&id);
            if ids.is_empty() {
                self.by_address.remove(&holder.address);
            }
        }
        Some(holder)
    }

    fn held_by(&self, address: &IpAddr) -> usize {
        self.by_address.get(address).map_or(0, BTreeSet::len)
    }

    /// The holder to give up a slot for a newcomer from `address`, and by which rule.
    fn victim(&self, address: &IpAddr, now: Instant, stale_after: Duration) -> Option<(u64, Eviction)> {
        let newcomer = self.held_by(address);
        let heaviest = self.by_address.values().max_by_key(|ids| ids.len());
        if let Some(ids) = heaviest
            && ids.len() >= newcomer + 2
        {
            return ids.first().map(|id| (*id, Eviction::Heaviest));
        }
        let (id, oldest) = self.holders.first_key_value()?;
        (now.duration_since(oldest.since) >= stale_after).then_some((*id, Eviction::Stale))
    }
}

impl ConnectionGate {
    pub fn new(capacity: usize, stale_after: Duration) -> Self {
        Self { state: Arc::default(), capacity: capacity.max(1), stale_after }
    }

    /// A slot for a connection from `address`, taking one from another holder if the gate is full (see the
    /// module's rules).
    pub fn admit(&self, address: IpAddr) -> Result<(Slot, Option<Eviction>), Refused> {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut eviction = None;
        if state.holders.len() >= self.capacity {
            let (victim, rule) = state.victim(&address, now, self.stale_after).ok_or(Refused)?;
            if let Some(holder) = state.remove(victim) {
                // The holder may have ended meanwhile; its slot is free either way.
                let _ = holder.evict.send(());
            }
            eviction = Some(rule);
        }
        let id = state.next;
        state.next += 1;
        let (evict, evicted) = oneshot::channel();
        state.holders.insert(id, Holder { address, since: now, evict });
        state.by_address.entry(address).or_default().insert(id);
        Ok((Slot { state: self.state.clone(), id, evicted }, eviction))
    }

    /// Slots taken now.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).holders.len()
    }
}

/// One admitted connection's slot, given back when dropped.
#[derive(Debug)]
pub struct Slot {
    state: Arc<Mutex<State>>,
    id: u64,
    evicted: oneshot::Receiver<()>,
}

impl Slot {
    /// Resolves when the gate took this slot for another connection; the holder must then close.
    pub async fn evicted(&mut self) {
        std::future::poll_fn(|cx| self.poll_evicted(cx)).await
    }

    /// Ready when the gate took this slot for another connection; registers `cx` otherwise.
    pub fn poll_evicted(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        use std::future::Future;
        match std::pin::Pin::new(&mut self.evicted).poll(cx) {
            std::task::Poll::Ready(Ok(())) => std::task::Poll::Ready(()),
            // The sender lives in the gate until this slot is dropped or evicted: an error is never seen.
            std::task::Poll::Ready(Err(_)) | std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).remove(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    fn is_evicted(slot: &mut Slot) -> bool {
        matches!(slot.evicted.try_recv(), Ok(()))
    }

    #[tokio::test(start_paused = true)]
    async fn free_slots_are_taken_and_given_back() {
        let gate = ConnectionGate::new(2, Duration::from_secs(2));
        let (a, none) = gate.admit(ip(1)).unwrap();
        assert_eq!(none, None);
        let _b = gate.admit(ip(2)).unwrap();
        assert_eq!(gate.held(), 2);
        drop(a);
        assert_eq!(gate.held(), 1);
        assert!(gate.admit(ip(3)).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn one_address_filling_the_gate_gives_way_to_another() {
        let gate = ConnectionGate::new(4, Duration::from_secs(2));
        let mut flood: Vec<Slot> = (0..4).map(|_| gate.admit(ip(9)).unwrap().0).collect();
        // The same address gets no more: it holds the most, but not two more than itself.
        assert_eq!(gate.admit(ip(9)).unwrap_err(), Refused);
        // Anyone else gets in at once, taking the flood's oldest connection.
        let (_operator, rule) = gate.admit(ip(1)).unwrap();
        assert_eq!(rule, Some(Eviction::Heaviest));
        assert!(is_evicted(&mut flood[0]), "the oldest of the flood goes");
        assert!(!is_evicted(&mut flood[1]));
        assert_eq!(gate.held(), 4);
        // A second newcomer from another address: the flood (3) still holds two more than it (0).
        let (_other, rule) = gate.admit(ip(2)).unwrap();
        assert_eq!(rule, Some(Eviction::Heaviest));
        assert!(is_evicted(&mut flood[1]));
        // Now 2 / 1 / 1: nobody holds two more than address 1, and nobody is stale yet.
        assert_eq!(gate.admit(ip(1)).unwrap_err(), Refused);
    }

    #[tokio::test(start_paused = true)]
    async fn a_gate_spread_over_many_addresses_gives_up_stale_slots_only() {
        let stale_after = Duration::from_secs(2);
        let gate = ConnectionGate::new(3, stale_after);
        let mut spread: Vec<Slot> = (10..13).map(|i| gate.admit(ip(i)).unwrap().0).collect();
        assert_eq!(gate.admit(ip(1)).unwrap_err(), Refused, "every holder is fresh and alone on its address");
        tokio::time::advance(stale_after).await;
        let (_operator, rule) = gate.admit(ip(1)).unwrap();
        assert_eq!(rule, Some(Eviction::Stale));
        assert!(is_evicted(&mut spread[0]), "the oldest one goes");
        assert!(!is_evicted(&mut spread[1]) && !is_evicted(&mut spread[2]));
    }

    #[tokio::test(start_paused = true)]
    async fn an_evicted_holder_is_told_and_its_drop_frees_nothing_twice() {
        let gate = ConnectionGate::new(1, Duration::from_secs(2));
        let (mut first, _) = gate.admit(ip(9)).unwrap();
        assert_eq!(gate.admit(ip(9)).unwrap_err(), Refused);
        assert_eq!(gate.admit(ip(1)).unwrap_err(), Refused, "one slot each: nobody holds two more");
        tokio::time::advance(Duration::from_secs(2)).await;
        let (kept, rule) = gate.admit(ip(1)).unwrap();
        assert_eq!(rule, Some(Eviction::Stale));
        tokio::time::timeout(Duration::from_millis(1), first.evicted()).await.expect("told at once");
        drop(first);
        assert_eq!(gate.held(), 1, "the evicted slot was already free; the newcomer keeps its own");
        drop(kept);
        assert_eq!(gate.held(), 0);
    }
}
