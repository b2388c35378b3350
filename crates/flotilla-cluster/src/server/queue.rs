//! The core's request queue: bounded (a full queue refuses new requests as busy), and closed
//! for good when the core ends, whatever ends it.
//!
//! A bounded crossbeam channel keeps the messages it holds when its receiver is dropped,
//! until its last sender goes. The handlers hold senders until the API port has closed, and
//! the API port waits for the handlers: a request queued just before the core ended (a
//! coordinator of a group stepping down, found in the chaos suite) kept its reply open, and
//! its client waited for ever. Here the end of the core refuses every later request and
//! drops every queued one, which answers its client "the coordinator is stopping".

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError, TrySendError};
use parking_lot::RwLock;

use super::core::Req;

/// The sending side, one per handler.
#[derive(Clone)]
pub(crate) struct CoreQueue {
    tx: Sender<Req>,
    /// `false` once the core has ended. Read around each send, so that a request is either
    /// queued before the inbox is drained or refused.
    open: Arc<RwLock<bool>>,
}

/// The core's side. Dropping it closes the queue and drops what waits in it.
pub(crate) struct Inbox {
    rx: Receiver<Req>,
    open: Arc<RwLock<bool>>,
}

/// A queue holding at most `capacity` requests.
pub(crate) fn queue(capacity: usize) -> (CoreQueue, Inbox) {
    let (tx, rx) = crossbeam_channel::bounded(capacity.max(1));
    let open = Arc::new(RwLock::new(true));
    (
        CoreQueue {
            tx,
            open: open.clone(),
        },
        Inbox { rx, open },
    )
}

impl CoreQueue {
    /// Queues `req`, or gives it back: `Full` when the queue is, `Disconnected` once the core
    /// has ended. (The request given back is as large as crossbeam's own `try_send` gives.)
    #[allow(clippy::result_large_err)]
    pub(crate) fn try_send(&self, req: Req) -> Result<(), TrySendError<Req>> {
        let open = self.open.read();
        if !*open {
            return Err(TrySendError::Disconnected(req));
        }
        self.tx.try_send(req)
    }
}

impl Inbox {
    pub(crate) fn recv_timeout(&self, timeout: Duration) -> Result<Req, RecvTimeoutError> {
        self.rx.recv_timeout(timeout)
    }

    pub(crate) fn try_recv(&self) -> Result<Req, TryRecvError> {
        self.rx.try_recv()
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        let mut open = self.open.write();
        *open = false;
        // Each dropped request drops its reply: its handler answers "stopping".
        while self.rx.try_recv().is_ok() {}
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A request for the cluster's overview, and where its answer comes.
    pub(in crate::server) fn ask() -> (
        Req,
        tokio::sync::oneshot::Receiver<Result<String, tonic::Status>>,
    ) {
        let (reply, rx) = tokio::sync::oneshot::channel();
        (
            Req::Status {
                job: None,
                scope: crate::access::Scope::All,
                trace: false,
                limit: None,
                from: 0,
                states: Vec::new(),
                reply,
            },
            rx,
        )
    }

    #[test]
    fn a_request_queued_when_the_core_ends_is_answered_and_later_ones_are_refused() {
        let (queue, inbox) = queue(4);
        let (req, mut answer) = ask();
        assert!(queue.try_send(req).is_ok());
        // The core ends without reading it (the handlers still hold their senders).
        drop(inbox);
        assert!(
            matches!(
                answer.try_recv(),
                Err(tokio::sync::oneshot::error::TryRecvError::Closed)
            ),
            "the queued request's reply is dropped, so its client is answered"
        );
        let (req, _answer) = ask();
        assert!(matches!(
            queue.try_send(req),
            Err(TrySendError::Disconnected(_))
        ));
    }

    #[test]
    fn a_full_queue_gives_the_request_back() {
        let (queue, _inbox) = queue(1);
        let (a, _a) = ask();
        let (b, _b) = ask();
        assert!(queue.try_send(a).is_ok());
        assert!(matches!(queue.try_send(b), Err(TrySendError::Full(_))));
    }
}
