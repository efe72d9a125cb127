//! Netlink sockets bound to a network namespace.
//!
//! A netlink socket belongs to the namespace of the thread that created it, for its whole life. So a
//! short-lived std thread enters the target namespace (`setns`), checks by inode that it really is there,
//! creates the socket and exits; the socket is then driven from the async runtime. No runtime thread ever
//! changes namespace, and the entering thread dies with its namespace change.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use netlink_sys::{Socket, SocketAddr, TokioSocket, protocols::NETLINK_ROUTE};
use nix::sched::{CloneFlags, setns, unshare};

use super::error::DatapathError;
use super::netlink::enable_extended_ack;

/// Room for the kernel's replies to a window of pipelined requests and to large dumps (1,000-destination
/// trees dump thousands of objects): without it the kernel drops replies with ENOBUFS.
const RECEIVE_BUFFER_BYTES: usize = 8 << 20;

/// A socket opened inside a namespace, with that namespace's identity for error messages.
pub(crate) struct NamespacedSocket {
    pub socket: TokioSocket,
    /// A second, blocking socket in the same namespace for mutation batches (see `batch`).
    pub batch: Socket,
    /// `net:[inode]`, as /proc shows namespace links.
    pub netns: String,
}

fn identity(inode: u64) -> String {
    format!("net:[{inode}]")
}

fn thread_netns_inode() -> std::io::Result<u64> {
    Ok(std::fs::metadata("/proc/thread-self/ns/net")?.ino())
}

/// The two sockets of a `Datapath`: (asynchronous for rtnetlink, blocking for mutation batches).
fn route_sockets(netns: &str) -> Result<(Socket, Socket), DatapathError> {
    let connection = route_socket(netns)?;
    connection.set_non_blocking(true).map_err(|source| DatapathError::Namespace {
        netns: netns.to_owned(),
        action: "set non-blocking",
        source,
    })?;
    let batch = route_socket(netns)?;
    set_receive_timeout(&batch, BATCH_REPLY_TIMEOUT).map_err(|source| DatapathError::Namespace {
        netns: netns.to_owned(),
        action: "set receive timeout",
        source,
    })?;
    Ok((connection, batch))
}

/// How long a batch waits for the kernel's replies. They are queued before `sendmsg` returns, so this only
/// bounds the wait should one be lost (the socket then reports ENOBUFS or the wait ends with EAGAIN).
const BATCH_REPLY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

fn set_receive_timeout(socket: &Socket, timeout: std::time::Duration) -> std::io::Result<()> {
    let value = libc::timeval { tv_sec: timeout.as_secs() as libc::time_t, tv_usec: 0 };
    set_socket_option(socket, libc::SO_RCVTIMEO, &value)
}

/// `setsockopt(SOL_SOCKET, option, value)` on a socket we own.
fn set_socket_option<T>(socket: &Socket, option: libc::c_int, value: &T) -> std::io::Result<()> {
    // SAFETY: `value` is a live `T` and the size passed is its size.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            option,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc != 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
}

fn route_socket(netns: &str) -> Result<Socket, DatapathError> {
    let err = |action| move |source| DatapathError::Namespace { netns: netns.to_owned(), action, source };
    let mut socket = Socket::new(NETLINK_ROUTE).map_err(err("create netlink socket"))?;
    socket.bind_auto().map_err(err("bind netlink socket"))?;
    socket.connect(&SocketAddr::new(0, 0)).map_err(err("connect netlink socket"))?;
    enable_extended_ack(&socket).map_err(err("enable extended acks"))?;
    // Dumps filtered by the request's interface index instead of every interface's objects.
    socket.set_netlink_get_strict_chk(true).map_err(err("enable strict checking"))?;
    force_receive_buffer(&socket).map_err(err("size receive buffer"))?;
    Ok(socket)
}

fn force_receive_buffer(socket: &Socket) -> std::io::Result<()> {
    let size = RECEIVE_BUFFER_BYTES as libc::c_int;
    // SO_RCVBUFFORCE passes rmem_max for a privileged agent; fall back to what an unprivileged one may ask for.
    if set_socket_option(socket, libc::SO_RCVBUFFORCE, &size).is_err() {
        socket.set_rx_buf_sz(RECEIVE_BUFFER_BYTES)?;
    }
    Ok(())
}

fn into_tokio(socket: Socket) -> TokioSocket {
    // SAFETY: the fd comes from a valid, owned netlink socket whose ownership moves into the TokioSocket.
    unsafe { TokioSocket::from_raw_fd(socket.into_raw_fd()) }
}

/// Opens a route socket inside the namespace `netns` refers to (an fd of /proc/PID/ns/net or /run/netns/X).
pub(crate) async fn open_in(netns: BorrowedFd<'_>) -> Result<NamespacedSocket, DatapathError> {
    let target_inode = std::fs::File::from(netns.try_clone_to_owned().map_err(|source| DatapathError::Namespace {
        netns: "fd".into(),
        action: "duplicate namespace fd",
        source,
    })?);
    let inode = target_inode.metadata().map(|m| m.ino()).map_err(|source| DatapathError::Namespace {
        netns: "fd".into(),
        action: "stat namespace fd",
        source,
    })?;
    let netns_id = identity(inode);
    let fd: OwnedFd = target_inode.into();
    let id = netns_id.clone();
    let socket = on_fresh_thread(move || {
        let fail = |action, source| DatapathError::Namespace { netns: id.clone(), action, source };
        setns(fd.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|e| fail("setns", e.into()))?;
        let now = thread_netns_inode().map_err(|e| fail("read /proc/thread-self/ns/net", e))?;
        if now != inode {
            return Err(fail(
                "verify namespace",
                std::io::Error::other(format!("thread is in {} after setns, expected {}", identity(now), id)),
            ));
        }
        route_sockets(&id)
    })
    .await?;
    Ok(NamespacedSocket { socket: into_tokio(socket.0), batch: socket.1, netns: netns_id })
}

/// Opens a route socket in a brand-new, empty namespace that lives exactly as long as the socket (nothing else
/// refers to it), so dropping the socket removes it: the scratch space of the capability probe.
pub(crate) async fn open_scratch() -> Result<NamespacedSocket, DatapathError> {
    let (socket, netns) = on_fresh_thread(|| {
        let fail = |action, source| DatapathError::Namespace { netns: "scratch".into(), action, source };
        unshare(CloneFlags::CLONE_NEWNET).map_err(|e| fail("unshare", e.into()))?;
        let netns = thread_netns_inode().map(identity).map_err(|e| fail("read /proc/thread-self/ns/net", e))?;
        Ok((route_sockets(&netns)?, netns))
    })
    .await?;
    Ok(NamespacedSocket { socket: into_tokio(socket.0), batch: socket.1, netns })
}

/// Runs `f` on a new OS thread that ends afterwards, awaiting it without blocking the runtime.
async fn on_fresh_thread<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, DatapathError> + Send + 'static,
) -> Result<T, DatapathError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("isthmus-netns".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .map_err(|source| DatapathError::Namespace { netns: "-".into(), action: "spawn namespace thread", source })?;
    rx.await.map_err(|_| DatapathError::Namespace {
        netns: "-".into(),
        action: "namespace thread",
        source: std::io::Error::other("the thread ended without an answer"),
    })?
}
