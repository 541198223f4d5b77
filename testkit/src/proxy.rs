//! A small TCP proxy in front of each node that injects network faults: silent
//! partitions, refused connections, lost replies and one-way latency.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// What the fault proxy currently does with the traffic of a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultMode {
    /// Forward everything in both directions.
    Normal,
    /// Silent partition: connections stay open, every byte in either direction is discarded.
    CutOff,
    /// Live proxied connections are closed; new ones are accepted and closed at once.
    Refuse,
    /// Requests reach the node; its replies are discarded.
    DropReplies,
}

#[derive(Clone, Copy, Debug)]
struct State {
    mode: FaultMode,
    latency: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    /// client -> node
    Request,
    /// node -> client
    Reply,
}

impl FaultMode {
    fn discards(self, dir: Direction) -> bool {
        match self {
            FaultMode::Normal | FaultMode::Refuse => false,
            FaultMode::CutOff => true,
            FaultMode::DropReplies => dir == Direction::Reply,
        }
    }
}

/// How long the proxy waits for the node's TCP accept before giving up on a connection.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Chunks queued per direction (latency queue) before reading applies back-pressure.
const QUEUE_CHUNKS: usize = 256;

/// A running proxy. Dropping it stops accepting and closes every proxied connection.
///
/// [`TestNode`](crate::TestNode) puts one in front of each container; a fault campaign puts
/// one per (client, node) in front of [`LocalNodes`](crate::LocalNodes), so it can cut one
/// client off from some nodes while the others still reach them.
pub struct FaultProxy {
    addr: SocketAddr,
    state: watch::Sender<State>,
    accept_task: tokio::task::AbortHandle,
}

impl FaultProxy {
    /// Listens on 127.0.0.1:0 and forwards every accepted connection to `upstream`. Panics
    /// when it cannot listen.
    pub async fn start(upstream: SocketAddr, label: &str) -> FaultProxy {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .unwrap_or_else(|e| panic!("{label}: fault proxy could not listen on 127.0.0.1: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("{label}: fault proxy has no local address: {e}"));
        let (state, rx) = watch::channel(State {
            mode: FaultMode::Normal,
            latency: Duration::ZERO,
        });
        let accept_task = tokio::spawn(accept_loop(listener, upstream, rx)).abort_handle();
        FaultProxy {
            addr,
            state,
            accept_task,
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Change what the proxy does with the traffic (applies to live connections too).
    pub fn set_mode(&self, mode: FaultMode) {
        self.state.send_modify(|s| s.mode = mode);
    }

    /// What the proxy does now.
    pub fn mode(&self) -> FaultMode {
        self.state.borrow().mode
    }

    /// Delay every chunk by `latency` in each direction.
    pub fn set_latency(&self, latency: Duration) {
        self.state.send_modify(|s| s.latency = latency);
    }

    /// The added latency.
    pub fn latency(&self) -> Duration {
        self.state.borrow().latency
    }
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("mode", &self.mode())
            .field("latency", &self.latency())
            .finish()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // The accept loop stops here; the connections stop when `state` (the only
        // sender) is dropped right after this, because their watchers see it closed.
        self.accept_task.abort();
    }
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, rx: watch::Receiver<State>) {
    loop {
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            Err(e) => {
                // E.g. out of file descriptors: back off instead of spinning.
                tracing::debug!("fault proxy accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if rx.borrow().mode == FaultMode::Refuse {
            drop(client);
            continue;
        }
        tokio::spawn(handle_connection(client, upstream, rx.clone()));
    }
}

async fn handle_connection(client: TcpStream, upstream: SocketAddr, rx: watch::Receiver<State>) {
    let _ = client.set_nodelay(true);
    let upstream =
        match tokio::time::timeout(UPSTREAM_CONNECT_TIMEOUT, TcpStream::connect(upstream)).await {
            Ok(Ok(stream)) => stream,
            _ => {
                // The node is down. Under a silent partition the client must not learn
                // that: keep its connection open and swallow its bytes until the mode
                // changes. Otherwise close, as a dead node's port would.
                if rx.borrow().mode == FaultMode::CutOff {
                    black_hole(client, rx).await;
                }
                return;
            }
        };
    let _ = upstream.set_nodelay(true);

    let tainted = AtomicBool::new(false);
    let (client_read, client_write) = client.into_split();
    let (node_read, node_write) = upstream.into_split();
    let requests = pump(
        client_read,
        node_write,
        Direction::Request,
        rx.clone(),
        &tainted,
    );
    let replies = pump(
        node_read,
        client_write,
        Direction::Reply,
        rx.clone(),
        &tainted,
    );
    tokio::select! {
        _ = async { tokio::try_join!(requests, replies) } => {}
        _ = close_on_fault(rx, &tainted) => {}
    }
    // Dropping the halves closes both sockets.
}

/// Keeps a client connection open, discarding what it sends, while the mode stays `CutOff`.
async fn black_hole(client: TcpStream, mut rx: watch::Receiver<State>) {
    // Keep the write half alive: dropping it would send a FIN.
    let (mut read, _write) = client.into_split();
    let sink = async {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n) = read.read(&mut buf).await {
            if n == 0 {
                return;
            }
        }
    };
    let until_changed = async {
        loop {
            if rx.changed().await.is_err() || rx.borrow_and_update().mode != FaultMode::CutOff {
                return;
            }
        }
    };
    tokio::select! {
        _ = sink => {}
        _ = until_changed => {}
    }
}

/// Resolves when the connection must be closed: the proxy refuses, or it was healed
/// after this connection lost bytes (its RESP stream is broken), or the proxy is gone.
async fn close_on_fault(mut rx: watch::Receiver<State>, tainted: &AtomicBool) {
    loop {
        {
            let state = rx.borrow_and_update();
            if state.mode == FaultMode::Refuse
                || (state.mode == FaultMode::Normal && tainted.load(Ordering::SeqCst))
            {
                return;
            }
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Copies one direction, applying the fault mode to every chunk read and delaying
/// every forwarded chunk by the latency in force when it was read (order is kept).
/// `Err` means: close the whole connection.
async fn pump(
    mut src: OwnedReadHalf,
    mut dst: OwnedWriteHalf,
    dir: Direction,
    rx: watch::Receiver<State>,
    tainted: &AtomicBool,
) -> Result<(), ()> {
    let (tx, mut queue) = mpsc::channel::<(Instant, Vec<u8>)>(QUEUE_CHUNKS);
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match src.read(&mut buf).await {
                Ok(0) => return Ok(()), // EOF: `tx` drops, the writer drains and shuts down.
                Ok(n) => n,
                Err(_) => return Err(()),
            };
            let latency = {
                // Decide under the watch's read lock, so that a concurrent `heal`
                // (which takes the write lock) sees `tainted` already set.
                let state = rx.borrow();
                if state.mode.discards(dir) {
                    tainted.store(true, Ordering::SeqCst);
                    continue;
                }
                if state.mode == FaultMode::Refuse || tainted.load(Ordering::SeqCst) {
                    // Never forward into a stream that already lost bytes.
                    return Err(());
                }
                state.latency
            };
            if tx
                .send((Instant::now() + latency, buf[..n].to_vec()))
                .await
                .is_err()
            {
                return Err(());
            }
        }
    };
    let writer = async {
        while let Some((due, bytes)) = queue.recv().await {
            tokio::time::sleep_until(due).await;
            if dst.write_all(&bytes).await.is_err() {
                return Err(());
            }
        }
        let _ = dst.shutdown().await;
        Ok(())
    };
    tokio::try_join!(reader, writer).map(|_| ())
}
