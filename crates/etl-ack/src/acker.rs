//! Opening batch handles, and receiving what happens to them.

use std::fmt;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Select, Sender, TryRecvError};

use crate::ack_ref::{AckRef, AckTx};
use crate::batch::{AckMsg, BatchMeta};
use crate::fence::WriteFence;
use crate::sync::Arc;

/// Create the two ends of acknowledgement tracking: the [`Acker`] the
/// source side opens batches with, and the [`AckReceiver`] the
/// checkpointer drains. Both channels are unbounded, as resolution must
/// never block a sink (a blocked `drop` would be a deadlock waiting to
/// happen).
#[must_use]
pub fn channel() -> (Acker, AckReceiver) {
    let (ack_tx, ack_rx) = crossbeam_channel::unbounded();
    let (open_tx, open_rx) = crossbeam_channel::unbounded();
    let fence = Arc::new(WriteFence::new());
    (
        Acker {
            tx: AckTx::Channel(ack_tx),
            opens: open_tx,
            fence: fence.clone(),
        },
        AckReceiver {
            acks: ack_rx,
            opens: open_rx,
            stashed: None,
            fence,
        },
    )
}

/// Opens batch handles. Cloneable; the only public way to create an
/// [`AckRef`] outside tests.
#[derive(Clone)]
pub struct Acker {
    tx: AckTx,
    opens: Sender<BatchMeta>,
    fence: Arc<WriteFence>,
}

impl fmt::Debug for Acker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Acker").finish_non_exhaustive()
    }
}

/// The [`AckReceiver`] is gone; the batch was not opened. Carries the
/// batch back, as a failed send hands back its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReceiverClosed(pub BatchMeta);

impl fmt::Display for ReceiverClosed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let id = self.0.id;
        write!(
            f,
            "cannot open batch {} of partition {} (epoch {}): the acknowledgement receiver is gone",
            id.seq, id.partition, id.epoch
        )
    }
}

impl std::error::Error for ReceiverClosed {}

impl Acker {
    /// Open a batch: announce it to the receiver, then return the handle
    /// whose last drop resolves it. The announcement is sent before the
    /// handle exists, so the receiver always sees `Opened` before
    /// `Resolved` for a batch.
    ///
    /// # Errors
    ///
    /// [`ReceiverClosed`] when the receiver was dropped (the checkpointer
    /// shut down); nothing was opened.
    pub fn open(&self, meta: BatchMeta) -> Result<AckRef, ReceiverClosed> {
        self.opens
            .send(meta)
            .map_err(|e| ReceiverClosed(e.into_inner()))?;
        Ok(AckRef::new(
            meta.id,
            meta.last_offset,
            self.tx.clone(),
            Some(self.fence.clone()),
        ))
    }
}

/// One thing that happened to a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckEvent {
    /// The source side opened a batch.
    Opened(BatchMeta),
    /// The last handle of a batch dropped.
    Resolved(AckMsg),
}

/// The checkpointer's end: yields [`AckEvent`]s, a batch's `Opened` always
/// before its `Resolved`.
#[derive(Debug)]
pub struct AckReceiver {
    acks: Receiver<AckMsg>,
    opens: Receiver<BatchMeta>,
    /// A resolution received while announcements sent before it may still
    /// be queued; it is returned once those are drained.
    stashed: Option<AckMsg>,
    /// The fence of every handle opened on this channel.
    fence: Arc<WriteFence>,
}

impl AckReceiver {
    /// The fence of this channel's handles: its owner (the checkpointer)
    /// closes the epochs of a partition being revoked, and an
    /// exactly-once sink then starts no write of their batches.
    #[must_use]
    pub fn fence(&self) -> Arc<WriteFence> {
        self.fence.clone()
    }

    /// The next event, if one is ready.
    ///
    /// # Errors
    ///
    /// [`TryRecvError::Empty`] when nothing is queued;
    /// [`TryRecvError::Disconnected`] when nothing is queued and every
    /// [`Acker`] and [`AckRef`] is gone, so nothing ever will be.
    pub fn try_next(&mut self) -> Result<AckEvent, TryRecvError> {
        // Announcements first: every announcement sent before a resolution
        // was sent is already queued when that resolution is received
        // (channel send/receive is a happens-before edge), so draining them
        // before returning the resolution keeps causal order.
        let opens = match self.opens.try_recv() {
            Ok(meta) => return Ok(AckEvent::Opened(meta)),
            Err(e) => e,
        };
        if let Some(msg) = self.stashed.take() {
            return Ok(AckEvent::Resolved(msg));
        }
        match self.acks.try_recv() {
            Ok(msg) => match self.opens.try_recv() {
                Ok(meta) => {
                    self.stashed = Some(msg);
                    Ok(AckEvent::Opened(meta))
                }
                Err(_) => Ok(AckEvent::Resolved(msg)),
            },
            Err(TryRecvError::Disconnected) if opens == TryRecvError::Disconnected => {
                Err(TryRecvError::Disconnected)
            }
            Err(_) => Err(TryRecvError::Empty),
        }
    }

    /// The next event, waiting up to `timeout` for one.
    ///
    /// # Errors
    ///
    /// [`RecvTimeoutError::Timeout`] when none arrived in time;
    /// [`RecvTimeoutError::Disconnected`] when none ever will.
    pub fn next_timeout(&mut self, timeout: Duration) -> Result<AckEvent, RecvTimeoutError> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            match self.try_next() {
                Ok(event) => return Ok(event),
                Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
                Err(TryRecvError::Empty) => {}
            }
            let mut select = Select::new();
            self.register(&mut select);
            if select.ready_deadline(deadline).is_err() {
                return Err(RecvTimeoutError::Timeout);
            }
        }
    }

    /// Register both underlying channels with a [`Select`], so a caller can
    /// wait on acknowledgements and its own channels at once. After
    /// [`Select::ready`] returns, call [`try_next`](Self::try_next): the
    /// readiness may belong to either channel.
    pub fn register<'a>(&'a self, select: &mut Select<'a>) {
        select.recv(&self.acks);
        select.recv(&self.opens);
    }

    /// Events queued right now (an instantaneous, racy count for metrics).
    #[must_use]
    pub fn len(&self) -> usize {
        self.acks.len() + self.opens.len() + usize::from(self.stashed.is_some())
    }

    /// Whether no event is queued right now.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(all(test, not(etl_loom)))]
mod tests {
    use std::thread;

    use etl_record::{Offset, PartitionId};

    use super::*;
    use crate::{AckStatus, BatchId};

    fn meta(seq: u64) -> BatchMeta {
        BatchMeta {
            id: BatchId {
                partition: PartitionId(2),
                epoch: 1,
                seq,
            },
            first_offset: Offset(seq as i64 * 10),
            last_offset: Offset(seq as i64 * 10 + 9),
            records: 10,
            bytes: 100,
        }
    }

    #[test]
    fn opened_comes_before_resolved_even_when_resolution_is_queued_first() {
        let (acker, mut rx) = channel();
        // Resolve batch 0 on another thread while batch 1 is opened here:
        // whatever the interleaving, each batch's Opened precedes its
        // Resolved.
        for _ in 0..200 {
            let a0 = acker.open(meta(0)).unwrap();
            let t = thread::spawn(move || drop(a0));
            let a1 = acker.open(meta(1)).unwrap();
            drop(a1);
            t.join().unwrap();
            let mut opened = Vec::new();
            while let Ok(ev) = rx.try_next() {
                match ev {
                    AckEvent::Opened(m) => opened.push(m.id.seq),
                    AckEvent::Resolved(msg) => {
                        assert!(opened.contains(&msg.id.seq), "resolved before opened");
                        assert_eq!(msg.status, AckStatus::Delivered);
                    }
                }
            }
            assert_eq!(opened.len(), 2);
        }
    }

    #[test]
    fn closed_receiver_hands_the_batch_back() {
        let (acker, rx) = channel();
        drop(rx);
        let err = acker.open(meta(4)).unwrap_err();
        assert_eq!(err.0, meta(4));
        assert!(err.to_string().contains("partition 2"));
    }

    #[test]
    fn disconnects_only_when_every_sender_is_gone() {
        let (acker, mut rx) = channel();
        let ack = acker.open(meta(0)).unwrap();
        drop(acker);
        assert!(matches!(rx.try_next(), Ok(AckEvent::Opened(_))));
        assert_eq!(rx.try_next(), Err(TryRecvError::Empty), "a handle lives");
        drop(ack);
        assert!(matches!(rx.try_next(), Ok(AckEvent::Resolved(_))));
        assert_eq!(rx.try_next(), Err(TryRecvError::Disconnected));
        assert_eq!(
            rx.next_timeout(Duration::from_millis(1)),
            Err(RecvTimeoutError::Disconnected)
        );
    }

    #[test]
    fn next_timeout_waits_for_a_resolution() {
        let (acker, mut rx) = channel();
        let ack = acker.open(meta(0)).unwrap();
        assert!(matches!(rx.try_next(), Ok(AckEvent::Opened(_))));
        assert_eq!(
            rx.next_timeout(Duration::from_millis(5)),
            Err(RecvTimeoutError::Timeout)
        );
        let t = thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            ack.fail();
            drop(ack);
        });
        match rx.next_timeout(Duration::from_secs(10)) {
            Ok(AckEvent::Resolved(msg)) => assert_eq!(msg.status, AckStatus::Failed),
            other => panic!("unexpected {other:?}"),
        }
        t.join().unwrap();
    }
}
