//! Netlink route sockets bound to a network namespace.
//!
//! A netlink socket belongs to the namespace of the thread that created it, for its whole life. So the sockets
//! are created inside the target namespace, on a thread that enters it and ends (`Netns::run_inside`, the one
//! way in), and are then driven from the async runtime: by the tc datapath's connection and by the userspace
//! datapath's capture set-up.

use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};

use netlink_sys::{Socket, SocketAddr, TokioSocket, protocols::NETLINK_ROUTE};

use super::{Netns, NetnsId};

/// Room for the kernel's replies to a window of pipelined requests and to large dumps (1,000-destination
/// trees dump thousands of objects): without it the kernel drops replies with ENOBUFS.
const RECEIVE_BUFFER_BYTES: usize = 8 << 20;

/// How long a batch waits for the kernel's replies. They are queued before `sendmsg` returns, so this only
/// bounds the wait should one be lost (the socket then reports ENOBUFS or the wait ends with EAGAIN).
const BATCH_REPLY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Entering the namespace or setting up a socket in it failed.
#[derive(Debug, thiserror::Error)]
#[error("netns {netns}: {action}: {source}")]
pub struct SocketError {
    pub netns: NetnsId,
    pub action: &'static str,
    pub source: std::io::Error,
}

/// Two route sockets opened inside one namespace.
pub struct NamespacedSocket {
    /// For rtnetlink: dumps and lookups.
    pub socket: TokioSocket,
    /// A second, blocking socket in the same namespace for the tc datapath's mutation batches.
    pub batch: Socket,
}

/// Opens the sockets inside `netns`.
pub async fn open_in(netns: &Netns) -> Result<NamespacedSocket, SocketError> {
    let id = netns.id();
    let (socket, batch) = netns.run_inside(move || route_sockets(id)).await.map_err(|source| SocketError {
        netns: id,
        action: "enter the namespace",
        source,
    })??;
    // SAFETY: the fd comes from a valid, owned netlink socket whose ownership moves into the TokioSocket.
    let socket = unsafe { TokioSocket::from_raw_fd(socket.into_raw_fd()) };
    Ok(NamespacedSocket { socket, batch })
}

/// Asks the kernel for extended acks (`NETLINK_EXT_ACK`) and for errors that echo only the request's header
/// (`NETLINK_CAP_ACK`), which is what `datapath::netlink::KernelError::from_error_message` with `capped = true`
/// expects. `Socket::set_netlink_get_strict_chk(true)` additionally makes the kernel filter dumps by the
/// request's header fields (e.g. `tcm_ifindex`).
pub fn enable_extended_ack(socket: &Socket) -> std::io::Result<()> {
    socket.set_ext_ack(true)?;
    socket.set_cap_ack(true)
}

/// The two sockets: (asynchronous for rtnetlink, blocking for mutation batches).
fn route_sockets(netns: NetnsId) -> Result<(Socket, Socket), SocketError> {
    let err = |action| move |source| SocketError { netns, action, source };
    let connection = route_socket(netns)?;
    connection.set_non_blocking(true).map_err(err("set non-blocking"))?;
    let batch = route_socket(netns)?;
    set_receive_timeout(&batch, BATCH_REPLY_TIMEOUT).map_err(err("set receive timeout"))?;
    Ok((connection, batch))
}

fn route_socket(netns: NetnsId) -> Result<Socket, SocketError> {
    let err = |action| move |source| SocketError { netns, action, source };
    let mut socket = Socket::new(NETLINK_ROUTE).map_err(err("create netlink socket"))?;
    socket.bind_auto().map_err(err("bind netlink socket"))?;
    socket.connect(&SocketAddr::new(0, 0)).map_err(err("connect netlink socket"))?;
    enable_extended_ack(&socket).map_err(err("enable extended acks"))?;
    // Dumps filtered by the request's interface index instead of every interface's objects.
    socket.set_netlink_get_strict_chk(true).map_err(err("enable strict checking"))?;
    force_receive_buffer(&socket).map_err(err("size receive buffer"))?;
    Ok(socket)
}

fn set_receive_timeout(socket: &Socket, timeout: std::time::Duration) -> std::io::Result<()> {
    let value = libc::timeval { tv_sec: timeout.as_secs() as _, tv_usec: 0 };
    set_socket_option(socket, libc::SO_RCVTIMEO, &value)
}

fn force_receive_buffer(socket: &Socket) -> std::io::Result<()> {
    let size = RECEIVE_BUFFER_BYTES as libc::c_int;
    // SO_RCVBUFFORCE passes rmem_max for a privileged agent; fall back to what an unprivileged one may ask for.
    if set_socket_option(socket, libc::SO_RCVBUFFORCE, &size).is_err() {
        socket.set_rx_buf_sz(RECEIVE_BUFFER_BYTES)?;
    }
    Ok(())
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
