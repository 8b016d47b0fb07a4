//! A TCP proxy in front of a server that can be cut or frozen, to simulate
//! outages and hung servers.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A TCP proxy in front of a server that can be taken down (every
/// connection through it is cut, new ones are closed at once) and brought back,
/// or frozen: connections stay open but no byte passes either way, as with a
/// server that hangs (SIGSTOP, a stalled disk, a lost network).
pub struct Proxy {
    pub port: u16,
    up: watch::Sender<bool>,
    frozen: Arc<watch::Sender<bool>>,
    stall: Arc<Stall>,
    /// Chunks the server sent that were passed on to the client.
    replies: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

/// Where a timed freeze is: armed to begin at the next chunk a client sends,
/// holding that chunk, and thawing itself after its duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StallState {
    Idle,
    Armed(Duration),
    Stalling,
    Ended,
}

struct Stall {
    state: watch::Sender<StallState>,
    frozen: Arc<watch::Sender<bool>>,
    // Serializes arming and firing.
    lock: Mutex<()>,
}

impl Stall {
    /// A client sent a chunk: an armed stall begins now, before it passes.
    fn client_sent(self: &Arc<Self>) {
        let _guard = self.lock.lock().unwrap();
        let StallState::Armed(duration) = *self.state.borrow() else {
            return;
        };
        self.frozen.send_replace(true);
        self.state.send_replace(StallState::Stalling);
        let stall = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(duration).await;
            let _guard = stall.lock.lock().unwrap();
            stall.frozen.send_replace(false);
            stall.state.send_replace(StallState::Ended);
        });
    }
}

/// Copies `from` to `to`, holding every chunk while `frozen` says so. With
/// `half_close`, the end of `from` is passed on as the end of `to` (after the
/// bytes before it, and not while frozen), as a TCP path does.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: watch::Receiver<bool>,
    stall: Option<Arc<Stall>>,
    passed: Option<Arc<AtomicU64>>,
    half_close: bool,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let Ok(n) = from.read(&mut buf).await else {
            return;
        };
        if n > 0 {
            if let Some(stall) = &stall {
                stall.client_sent();
            }
        }
        if n == 0 && !half_close {
            return;
        }
        if frozen.wait_for(|f| !*f).await.is_err() {
            return;
        }
        if n == 0 {
            let _ = to.shutdown().await;
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        if let Some(passed) = &passed {
            passed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Proxy {
    /// A proxy whose connection is cut in both directions as soon as either
    /// side closes it.
    pub async fn start(target: SocketAddr) -> Self {
        Self::start_with(target, false).await
    }

    /// A proxy that passes a close on as TCP does: a side that closes after
    /// sending has its bytes delivered (after a freeze, once it thaws) and the
    /// other side may still answer. A client that gives up on a hung server
    /// and closes its connection is then seen by the server as it would be:
    /// the requests it sent first still arrive, then its close.
    pub async fn start_half_closing(target: SocketAddr) -> Self {
        Self::start_with(target, true).await
    }

    async fn start_with(target: SocketAddr, half_close: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (up, watch_up) = watch::channel(true);
        let (frozen, watch_frozen) = watch::channel(false);
        let frozen = Arc::new(frozen);
        let stall = Arc::new(Stall {
            state: watch::channel(StallState::Idle).0,
            frozen: frozen.clone(),
            lock: Mutex::new(()),
        });
        let stalls = stall.clone();
        let replies = Arc::new(AtomicU64::new(0));
        let counted = replies.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                if !*watch_up.borrow() {
                    drop(inbound);
                    continue;
                }
                let mut watch_up = watch_up.clone();
                let mut watch_frozen = watch_frozen.clone();
                let stall = stalls.clone();
                let counted = counted.clone();
                tokio::spawn(async move {
                    // A frozen server does not even accept.
                    if watch_frozen.wait_for(|f| !*f).await.is_err() {
                        return;
                    }
                    let Ok(outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    let (in_read, in_write) = inbound.into_split();
                    let (out_read, out_write) = outbound.into_split();
                    let upstream = pump(
                        in_read,
                        out_write,
                        watch_frozen.clone(),
                        Some(stall),
                        None,
                        half_close,
                    );
                    let downstream = pump(
                        out_read,
                        in_write,
                        watch_frozen,
                        None,
                        Some(counted),
                        half_close,
                    );
                    let both = async {
                        if half_close {
                            tokio::join!(upstream, downstream);
                        } else {
                            tokio::select! {
                                _ = upstream => {}
                                _ = downstream => {}
                            }
                        }
                    };
                    tokio::select! {
                        _ = both => {}
                        _ = watch_up.wait_for(|up| !*up) => {}
                    }
                });
            }
        });
        Self {
            port,
            up,
            frozen,
            stall,
            replies,
            task,
        }
    }

    /// Freezes every connection (as `set_frozen(true)`) the moment a client
    /// next sends anything, holding that chunk, and thaws them `duration`
    /// later: a stall that begins exactly as a request is sent.
    pub fn freeze_at_next_request(&self, duration: Duration) {
        let _guard = self.stall.lock.lock().unwrap();
        self.stall.state.send_replace(StallState::Armed(duration));
    }

    /// Where the last timed freeze is.
    pub fn stall_state(&self) -> StallState {
        *self.stall.state.borrow()
    }

    pub fn set_up(&self, up: bool) {
        self.up.send_replace(up);
    }

    /// Holds every byte in both directions (`true`) or lets them pass again.
    pub fn set_frozen(&self, frozen: bool) {
        self.frozen.send_replace(frozen);
    }

    /// Freezes now and thaws after `stall` (a one-shot hang of that length);
    /// the returned task ends at the thaw. Bytes read before the thaw are
    /// delivered then, as a hung server that resumes would see them.
    pub fn freeze_for(&self, stall: std::time::Duration) -> tokio::task::JoinHandle<()> {
        self.frozen.send_replace(true);
        let frozen = self.frozen.clone();
        tokio::spawn(async move {
            tokio::time::sleep(stall).await;
            frozen.send_replace(false);
        })
    }

    /// Whether bytes are held now.
    pub fn is_frozen(&self) -> bool {
        *self.frozen.borrow()
    }

    /// How many chunks of the server's replies were passed on so far: one
    /// more after a thaw says a held request reached the server and was
    /// answered.
    pub fn replies(&self) -> u64 {
        self.replies.load(Ordering::Relaxed)
    }

    /// Resolves once the proxy is frozen (`true`) or passing bytes (`false`).
    pub async fn until_frozen(&self, frozen: bool) {
        let mut watch = self.frozen.subscribe();
        let _ = watch.wait_for(|f| *f == frozen).await;
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.up.send_replace(false);
        self.task.abort();
    }
}
