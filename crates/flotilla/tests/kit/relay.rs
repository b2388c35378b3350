//! A TCP relay of the test's own between a worker and the coordinator: it forwards bytes both
//! ways until told to cut the link (a black hole: the connections stay open and carry
//! nothing, as when a cable is pulled; what was sent waits, as TCP keeps retransmitting it,
//! and arrives when the link heals), to reset it (every connection closed, new ones closed as
//! they arrive), to slow it, or to heal it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

const OPEN: u8 = 0;
const BLACK_HOLE: u8 = 1;
const RESET: u8 = 2;

#[derive(Default)]
struct State {
    mode: AtomicU8,
    /// Bumped at every reset: connections of an older generation close.
    generation: AtomicU64,
    /// Added before each forwarded chunk.
    delay_ms: AtomicU64,
}

/// A relay; dropped, it stops.
pub(crate) struct Relay {
    /// Where workers connect instead of the coordinator.
    pub(crate) addr: SocketAddr,
    state: Arc<State>,
    _rt: tokio::runtime::Runtime,
}

impl Relay {
    /// A relay to `target` on a free port of 127.0.0.1.
    pub(crate) fn start(target: SocketAddr) -> Relay {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let state = Arc::new(State::default());
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("a free port");
        let addr = listener.local_addr().expect("its address");
        let st = state.clone();
        rt.spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                if st.mode.load(Ordering::SeqCst) == RESET {
                    drop(inbound);
                    continue;
                }
                let st = st.clone();
                tokio::spawn(async move {
                    let Ok(outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let gen = st.generation.load(Ordering::SeqCst);
                    let (ri, wi) = inbound.into_split();
                    let (ro, wo) = outbound.into_split();
                    let a = tokio::spawn(pump(ri, wo, st.clone(), gen));
                    let b = tokio::spawn(pump(ro, wi, st, gen));
                    let _ = tokio::join!(a, b);
                });
            }
        });
        Relay {
            addr,
            state,
            _rt: rt,
        }
    }

    /// Nothing passes any more, in either direction; the connections stay open.
    pub(crate) fn black_hole(&self) {
        self.state.mode.store(BLACK_HOLE, Ordering::SeqCst);
    }

    /// Every connection is closed, and new ones are closed as they arrive.
    pub(crate) fn reset(&self) {
        self.state.mode.store(RESET, Ordering::SeqCst);
        self.state.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Each chunk waits `delay` before it is forwarded.
    pub(crate) fn slow(&self, delay: Duration) {
        self.state
            .delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// Forwards again (connections cut by a reset stay closed; new ones pass).
    pub(crate) fn heal(&self) {
        self.state.delay_ms.store(0, Ordering::SeqCst);
        self.state.mode.store(OPEN, Ordering::SeqCst);
    }
}

/// Copies `from` to `to` while the link is open; while it is a black hole, reads nothing and
/// holds what it read (delivered when the link heals); stops at a reset or an end.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    st: Arc<State>,
    gen: u64,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // Silent: nothing moves until the link heals or is reset.
        while st.mode.load(Ordering::SeqCst) == BLACK_HOLE {
            if st.generation.load(Ordering::SeqCst) != gen {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = tokio::time::sleep(Duration::from_millis(50)) => 0,
        };
        // Reset: both halves drop, closing both connections.
        if st.generation.load(Ordering::SeqCst) != gen || st.mode.load(Ordering::SeqCst) == RESET {
            return;
        }
        if n == 0 {
            continue;
        }
        // Read just as the link went silent: held until it heals.
        while st.mode.load(Ordering::SeqCst) == BLACK_HOLE {
            if st.generation.load(Ordering::SeqCst) != gen {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let delay = st.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
