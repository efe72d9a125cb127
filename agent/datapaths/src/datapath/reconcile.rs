//! The I/O shell: dump what is installed, diff against the desired tree, send only the differences.
//!
//! Two ways to reach a desired state, with the same result on a kernel nobody else touches:
//! - [`Datapath::reconcile`], the full path: dump the interface (qdiscs, classes, u32 filters), diff, send.
//!   It sees and repairs any drift, and costs one dump — 12 to 29 ms at 1,000 destinations on the 2-core CI
//!   machine, most of a one-destination change (docs/benchmarks.md). Use it for resyncs and whenever the kernel
//!   may have changed behind isthmus's back.
//! - [`Datapath::update`], the fast path: diff against the record of what isthmus last installed or verified on
//!   the interface (kept per interface name and ifindex; a different ifindex drops it), send only the
//!   difference, no dump. Without a record it is the full path. Use it for plan changes.
//!
//! The trade-off: `update` trusts the record. A change made behind isthmus's back (`tc class del` by a person)
//! goes unnoticed by an `update` that does not touch the affected object, until the next `reconcile` repairs it.
//! An `update` that does touch it gets a refusal from the kernel (ENOENT on change, EEXIST on add, …): the record
//! is dropped and the full path runs once, so the result is the desired state or the full path's own error. A
//! targeted read-back of each touched object (non-dump RTM_GET*) was not chosen: it would not find drift in the
//! untouched objects either, and it adds one round trip per object to every change, while refusals already
//! reveal drift in the touched ones.
//!
//! The record is dropped on any error and after a call whose result holds a handle the kernel picked (a u32
//! entry added by node id into a new filter priority's generated table, as on a fresh install); the next
//! `update` is then a full one, which reads it. Calls on one `Datapath` are serialised, so the record always
//! describes the last call. The record lives as long as the `Datapath`: to benefit, keep one per namespace.
//! Its sockets need not: [`Datapath::release_connection`] closes them between calls (an agent keeps one
//! `Datapath` per pod, and idle sockets would cost each pod its buffers), and the next call opens them again in
//! the same namespace, held by file descriptor.

use std::collections::HashMap;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use isthmus_agent_api::Counters;
use netlink_packet_core::{NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::LinkAttribute;
use netlink_packet_route::tc::{TcHandle, TcMessage};
use tokio::sync::Mutex;
use tracing::{debug, info};

use super::batch::BatchSocket;
use super::desired::DesiredState;
use super::diff;
use super::error::{DatapathError, Place};
use super::handles::ROOT_QDISC;
use super::installed::{self, RootState};
use super::model::*;
use super::netlink::{self, KernelError};
use crate::netns::socket::{self, NamespacedSocket};
use crate::netns::{Netns, NetnsId};

/// A netlink connection bound to one network namespace.
pub struct Datapath {
    /// The namespace, held so that a released connection can be opened again in it.
    netns: Netns,
    connection: Mutex<Option<Arc<Connection>>>,
    /// Per interface name, what isthmus last installed or verified there. Held for a whole reconcile or
    /// update, which serialises them.
    records: Mutex<HashMap<String, Record>>,
}

/// The sockets of a [`Datapath`], opened inside its namespace.
struct Connection {
    handle: rtnetlink::Handle,
    /// Mutations go over a plain socket of their own, in batches; dumps and lookups over `handle`.
    batch: std::sync::Mutex<BatchSocket>,
}

impl Connection {
    fn start(socket: NamespacedSocket) -> Connection {
        let (connection, handle, _) = rtnetlink::from_socket(socket.socket);
        // The connection task ends when the last handle (this Connection) is dropped.
        tokio::spawn(connection);
        Connection { handle, batch: std::sync::Mutex::new(BatchSocket::new(socket.batch)) }
    }
}

/// The objects isthmus owns on one interface, as a dump would show them, after the last successful call.
struct Record {
    ifindex: u32,
    objects: Vec<TcObject>,
}

impl Record {
    /// Held for as long as the pod is: without the spare capacity that collecting and adding left (up to as
    /// much again), which across a node's pods is megabytes.
    fn new(ifindex: u32, mut objects: Vec<TcObject>) -> Record {
        objects.shrink_to_fit();
        Record { ifindex, objects }
    }
}

/// What one reconcile sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Mutating requests sent (additions + changes + deletions); 0 when the kernel already matched.
    pub mutations: usize,
    pub added: usize,
    pub changed: usize,
    pub deleted: usize,
}

/// Everything dumped from one interface, with the counters of qdiscs and classes.
pub(super) struct Dump {
    pub objects: Vec<TcObject>,
    pub counters: Vec<(Handle, Counters)>,
}

impl Datapath {
    /// Opens a connection inside the namespace `netns` refers to (see `crate::netns` for how it is entered);
    /// the namespace is held until the `Datapath` is dropped.
    pub async fn open(netns: BorrowedFd<'_>) -> Result<Datapath, DatapathError> {
        let netns = Netns::from_fd(netns)
            .map_err(|source| DatapathError::NamespaceUnavailable { action: "hold the namespace", source })?;
        Self::start(netns).await
    }

    /// A connection in a fresh, empty namespace that disappears when the `Datapath` is dropped.
    pub(crate) async fn open_scratch() -> Result<Datapath, DatapathError> {
        let netns = Netns::scratch()
            .await
            .map_err(|source| DatapathError::NamespaceUnavailable { action: "create a scratch namespace", source })?;
        Self::start(netns).await
    }

    async fn start(netns: Netns) -> Result<Datapath, DatapathError> {
        let connection = Connection::start(socket::open_in(&netns).await?);
        Ok(Datapath { netns, connection: Mutex::new(Some(Arc::new(connection))), records: Mutex::new(HashMap::new()) })
    }

    /// Closes the sockets until the next call, keeping the records; calls in progress keep theirs. Returns
    /// whether anything was closed (not when a call is opening one right now).
    pub fn release_connection(&self) -> bool {
        self.connection.try_lock().is_ok_and(|mut connection| connection.take().is_some())
    }

    /// The open connection, or a new one in the held namespace.
    async fn connection(&self) -> Result<Arc<Connection>, DatapathError> {
        let mut slot = self.connection.lock().await;
        if let Some(connection) = slot.as_ref() {
            return Ok(connection.clone());
        }
        let connection = Arc::new(Connection::start(socket::open_in(&self.netns).await?));
        *slot = Some(connection.clone());
        Ok(connection)
    }

    /// The namespace this connection works in.
    pub fn netns(&self) -> NetnsId {
        self.netns.id()
    }

    pub(super) fn place(&self, interface: &str) -> Place {
        Place { netns: self.netns.id(), interface: interface.to_owned() }
    }

    /// The full path: dump → diff → send only what differs, repairing any drift; refreshes the interface's
    /// record. The same desired state twice sends no mutation the second time. A root qdisc isthmus did not
    /// install is never touched: [`DatapathError::ForeignQdisc`].
    pub async fn reconcile(&self, interface: &str, desired: &DesiredState) -> Result<ReconcileReport, DatapathError> {
        let mut records = self.records.lock().await;
        self.reconcile_from_dump(&mut records, interface, desired).await
    }

    /// The fast path: diff against the record of what isthmus last installed or verified on the interface and
    /// send only the difference, without a dump; the full path ([`Self::reconcile`]) when there is no record
    /// or the interface's index changed. Drift the difference does not touch goes unnoticed (see the module
    /// documentation); when the kernel refuses anything, the record is dropped and the full path runs once.
    pub async fn update(&self, interface: &str, desired: &DesiredState) -> Result<ReconcileReport, DatapathError> {
        let mut records = self.records.lock().await;
        let Some(record) = records.remove(interface) else {
            return self.reconcile_from_dump(&mut records, interface, desired).await;
        };
        let place = self.place(interface);
        let (ifindex, mtu) = self.link(interface).await?;
        let desired = &desired.with_mtu(mtu);
        if ifindex != record.ifindex {
            debug!(netns = %self.netns.id(), interface, was = record.ifindex, now = ifindex, "interface replaced; reconciling from a dump");
            return self.reconcile_from_dump(&mut records, interface, desired).await;
        }
        let operations = match diff::operations(&place, &record.objects, desired) {
            Ok(operations) => operations,
            Err(error) => {
                // Nothing was sent: the record still describes the kernel.
                records.insert(interface.to_owned(), record);
                return Err(error);
            }
        };
        let report = report_of(&operations);
        let next = diff::after(record.objects, &operations);
        match self.send(&place, ifindex, operations).await {
            Ok(()) => {
                if let Some(objects) = next {
                    records.insert(interface.to_owned(), Record::new(ifindex, objects));
                }
                debug!(netns = %self.netns.id(), interface, ?report, "updated from the record");
                Ok(report)
            }
            Err(error) => {
                info!(netns = %self.netns.id(), interface, %error, "update from the record refused; reconciling from a dump");
                self.reconcile_from_dump(&mut records, interface, desired).await
            }
        }
    }

    async fn reconcile_from_dump(
        &self,
        records: &mut HashMap<String, Record>,
        interface: &str,
        desired: &DesiredState,
    ) -> Result<ReconcileReport, DatapathError> {
        records.remove(interface);
        let place = self.place(interface);
        let (ifindex, mtu) = self.link(interface).await?;
        let desired = &desired.with_mtu(mtu);
        let dump = self.dump(&place, ifindex).await?;
        if let RootState::Foreign { kind, handle } = installed::root_state(&dump.objects) {
            if !desired.is_empty() {
                return Err(DatapathError::ForeignQdisc { place, kind, handle: handle.to_string() });
            }
            // Nothing of isthmus's is there and nothing is to be installed: no record, so the next call looks again.
            return Ok(ReconcileReport::default());
        }
        let ours = installed::owned(&dump.objects);
        let operations = diff::operations(&place, &ours, desired)?;
        let report = report_of(&operations);
        let next = diff::after(ours, &operations);
        self.send(&place, ifindex, operations).await?;
        if let Some(objects) = next {
            records.insert(interface.to_owned(), Record::new(ifindex, objects));
        }
        debug!(netns = %self.netns.id(), interface, ?report, "reconciled");
        Ok(report)
    }

    /// Sends `operations` in order, packed into batches (see `batch`), and stops at the first refusal, which
    /// the error names (operation, kernel errno and extended-ack text).
    pub(crate) async fn send(
        &self,
        place: &Place,
        ifindex: u32,
        operations: Vec<Operation>,
    ) -> Result<(), DatapathError> {
        // The kernel processes a batch inside `sendmsg`; nothing here waits for anything but the kernel.
        let connection = self.connection().await?;
        let mut socket = connection.batch.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        socket.send(place, ifindex, &operations)
    }

    /// The interface's index, looked up over this namespace's socket (not the caller's namespace).
    pub(crate) async fn ifindex(&self, interface: &str) -> Result<u32, DatapathError> {
        Ok(self.link(interface).await?.0)
    }

    /// The interface's index and MTU (1500 when the kernel reports none).
    pub(crate) async fn link(&self, interface: &str) -> Result<(u32, u32), DatapathError> {
        let place = self.place(interface);
        let connection = self.connection().await?;
        let mut links = connection.handle.link().get().match_name(interface.to_owned()).execute();
        match links.try_next().await {
            Ok(Some(link)) => {
                let mtu = link.attributes.iter().find_map(|a| match a {
                    LinkAttribute::Mtu(m) => Some(*m),
                    _ => None,
                });
                Ok((link.header.index, mtu.unwrap_or(1500)))
            }
            Ok(None) => Err(DatapathError::InterfaceNotFound { place }),
            Err(rtnetlink::Error::NetlinkError(e)) => {
                let error = KernelError::from_error_message(&e, true);
                match error {
                    Some(k) if k.code == libc::ENODEV => Err(DatapathError::InterfaceNotFound { place }),
                    Some(k) => Err(DatapathError::from_kernel(
                        place,
                        "look up interface".into(),
                        None,
                        k.code,
                        k.message.unwrap_or_default(),
                    )),
                    None => Err(DatapathError::InterfaceNotFound { place }),
                }
            }
            Err(e) => Err(DatapathError::Protocol { place, message: format!("look up interface: {e}") }),
        }
    }

    pub(super) async fn dump(&self, place: &Place, ifindex: u32) -> Result<Dump, DatapathError> {
        let mut objects = Vec::new();
        let mut counters = Vec::new();
        for message in self.dump_kind(place, ifindex, Kind::Qdisc, Handle::UNSPEC).await? {
            let (q, c) = netlink::decode_qdisc(&message).map_err(|e| decode_error(place, e))?;
            counters.push((q.handle, c));
            objects.push(TcObject::Qdisc(q));
        }
        let ours = installed::root_state(&objects) == RootState::Isthmus;
        if ours {
            for message in self.dump_kind(place, ifindex, Kind::Class, Handle::UNSPEC).await? {
                let (c, n) = netlink::decode_class(&message).map_err(|e| decode_error(place, e))?;
                counters.push((c.handle, n));
                objects.push(TcObject::Class(c));
            }
            for message in self.dump_kind(place, ifindex, Kind::Filter, ROOT_QDISC).await? {
                objects.push(TcObject::Filter(netlink::decode_filter(&message).map_err(|e| decode_error(place, e))?));
            }
        }
        Ok(Dump { objects, counters })
    }

    async fn dump_kind(
        &self,
        place: &Place,
        ifindex: u32,
        kind: Kind,
        parent: Handle,
    ) -> Result<Vec<TcMessage>, DatapathError> {
        let mut request = TcMessage::with_index(ifindex as i32);
        request.header.parent = TcHandle::from(parent.0);
        let payload = match kind {
            Kind::Qdisc => RouteNetlinkMessage::GetQueueDiscipline(request),
            Kind::Class => RouteNetlinkMessage::GetTrafficClass(request),
            Kind::Filter => RouteNetlinkMessage::GetTrafficFilter(request),
        };
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        let mut message = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(payload));
        message.finalize();
        let mut handle = self.connection().await?.handle.clone();
        let replies = handle
            .request(message)
            .map_err(|e| DatapathError::Protocol { place: place.clone(), message: format!("dump {kind:?}: {e}") })?;
        let replies: Vec<_> = replies.collect().await;
        let mut out = Vec::with_capacity(replies.len());
        for reply in replies {
            if let Some(e) = KernelError::from_netlink_message(&reply) {
                return Err(DatapathError::from_kernel(
                    place.clone(),
                    format!("dump {kind:?}"),
                    None,
                    e.code,
                    e.message.unwrap_or_default(),
                ));
            }
            if let NetlinkPayload::InnerMessage(
                RouteNetlinkMessage::NewQueueDiscipline(m)
                | RouteNetlinkMessage::NewTrafficClass(m)
                | RouteNetlinkMessage::NewTrafficFilter(m),
            ) = reply.payload
                && netlink::ifindex(&m) == ifindex
            {
                out.push(m);
            }
        }
        Ok(out)
    }
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Qdisc,
    Class,
    Filter,
}

fn report_of(operations: &[Operation]) -> ReconcileReport {
    ReconcileReport {
        mutations: operations.len(),
        added: operations.iter().filter(|o| matches!(o, Operation::Add(_))).count(),
        changed: operations.iter().filter(|o| matches!(o, Operation::Change(_))).count(),
        deleted: operations.iter().filter(|o| matches!(o, Operation::Delete(_))).count(),
    }
}

fn decode_error(place: &Place, e: netlink::DecodeError) -> DatapathError {
    DatapathError::Protocol { place: place.clone(), message: format!("cannot read the installed tree: {e}") }
}
