//! Network namespaces: one identity ([`NetnsId`]), one handle ([`Netns`], an open descriptor that keeps the
//! namespace alive), and one way in: a thread created for the work, which enters the namespace, checks that it
//! got there, does the work and ends. `setns` affects only the calling thread, so no thread of the async
//! runtime or of a pool ever changes namespace. Finding a pod's namespace is `lookup`; what a namespace holds
//! (addresses, interfaces) is `inventory`; route sockets opened inside a namespace are `socket`.

mod inventory;
mod lookup;
mod owner;
pub mod socket;

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::mpsc;

use nix::sched::CloneFlags;

pub use self::inventory::{Inventory, inventory_many};
pub use self::lookup::{PodIdentity, ResolveError, Resolver, Sources, all_namespaces};

/// A network namespace's identity: the (device, inode) of its nsfs file, as `stat -L` shows it. Displayed as
/// /proc shows namespace links: `net:[inode]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NetnsId {
    pub dev: u64,
    pub inode: u64,
}

impl NetnsId {
    fn of_fd(fd: BorrowedFd<'_>) -> io::Result<Self> {
        let st = nix::sys::stat::fstat(fd).map_err(io::Error::from)?;
        Ok(NetnsId { dev: st.st_dev, inode: st.st_ino })
    }

    /// Of the namespace file at `path` (following links, as `/proc/<pid>/ns/net` is one).
    fn of_path(path: &Path) -> io::Result<Self> {
        Ok(Self::of_metadata(&std::fs::metadata(path)?))
    }

    fn of_metadata(meta: &std::fs::Metadata) -> Self {
        NetnsId { dev: meta.dev(), inode: meta.ino() }
    }
}

impl std::fmt::Display for NetnsId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "net:[{}]", self.inode)
    }
}

/// The calling thread's namespace, as a path that refers to it from any process.
const THIS_THREAD: &str = "/proc/thread-self/ns/net";

/// An open network namespace. Holding it keeps the namespace alive, so the resolver drops it as soon as no
/// path on the node reaches the namespace any more.
#[derive(Debug)]
pub struct Netns {
    fd: OwnedFd,
    id: NetnsId,
}

impl Netns {
    /// Opens the namespace file at `path` (a `/proc/<pid>/ns/net` link or an nsfs bind mount).
    pub fn open(path: &Path) -> io::Result<Self> {
        Self::held(OwnedFd::from(File::open(path)?))
    }

    /// The namespace of the calling thread.
    pub fn current() -> io::Result<Self> {
        Self::open(Path::new(THIS_THREAD))
    }

    /// The namespace `fd` refers to, held by a descriptor of its own.
    pub fn from_fd(fd: BorrowedFd<'_>) -> io::Result<Self> {
        Self::held(fd.try_clone_to_owned()?)
    }

    fn held(fd: OwnedFd) -> io::Result<Self> {
        let id = NetnsId::of_fd(fd.as_fd())?;
        Ok(Netns { fd, id })
    }

    /// A new, empty namespace that lives as long as this handle and whatever was opened inside it.
    pub async fn scratch() -> io::Result<Self> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        on_fresh_thread(move || {
            let created = nix::sched::unshare(CloneFlags::CLONE_NEWNET).map_err(io::Error::from);
            let _ = tx.send(created.and_then(|()| Netns::current()));
        })?;
        rx.await.unwrap_or_else(|_| Err(ended_without_answer()))
    }

    pub fn id(&self) -> NetnsId {
        self.id
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Runs `f` inside this namespace, without blocking the async runtime while it does.
    pub async fn run_inside<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.spawn_inside(f, move |outcome| {
            let _ = tx.send(outcome);
        })?;
        rx.await.unwrap_or_else(|_| Err(ended_without_answer()))
    }

    /// Starts `f` inside this namespace, for a blocking caller to wait for (several can run at once).
    pub fn start_inside<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> io::Result<Inside<T>> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.spawn_inside(f, move |outcome| {
            let _ = tx.send(outcome);
        })?;
        Ok(Inside(rx))
    }

    /// `f` on a new thread that enters this namespace first; `deliver` gets, on that thread, what `f` returned
    /// or why the thread could not enter.
    fn spawn_inside<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
        deliver: impl FnOnce(io::Result<T>) + Send + 'static,
    ) -> io::Result<()> {
        let fd = self.fd.try_clone()?;
        let id = self.id;
        on_fresh_thread(move || deliver(enter(fd.as_fd(), id).map(|()| f())))
    }
}

/// What work started inside a namespace returns (see [`Netns::start_inside`]).
#[derive(Debug)]
pub struct Inside<T>(mpsc::Receiver<io::Result<T>>);

impl<T> Inside<T> {
    /// Blocks until the work is done.
    pub fn wait(self) -> io::Result<T> {
        self.0.recv().unwrap_or_else(|_| Err(ended_without_answer()))
    }
}

/// Runs `f` on a new OS thread that ends with it, so that whatever namespace it moves into dies with it.
fn on_fresh_thread(f: impl FnOnce() + Send + 'static) -> io::Result<()> {
    std::thread::Builder::new().name("isthmus-netns".into()).spawn(f).map(drop)
}

/// Moves the calling thread into the namespace and checks that it arrived there.
fn enter(fd: BorrowedFd<'_>, id: NetnsId) -> io::Result<()> {
    nix::sched::setns(fd, CloneFlags::CLONE_NEWNET)
        .map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, format!("setns: {e}")))?;
    let now = NetnsId::of_path(Path::new(THIS_THREAD))?;
    if now != id {
        return Err(io::Error::other(format!("the thread is in {now} after setns")));
    }
    Ok(())
}

fn ended_without_answer() -> io::Error {
    io::Error::other("the namespace thread ended without an answer")
}
