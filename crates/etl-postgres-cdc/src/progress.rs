//! Offsets of changes, and the position the slot may be confirmed at.
//!
//! The slot is one partition. A transaction's changes take consecutive
//! offsets starting at its commit LSN, or just after the previous
//! transaction's last offset when that is higher (a large transaction
//! followed closely by another): offsets increase strictly in the order
//! the server sends, which is commit order, and stay near the commit LSN.
//!
//! A transaction is delivered when the checkpointer's committed offset is
//! past its last change; only then may the slot be confirmed at the end
//! of its commit record. A partially delivered transaction keeps the slot
//! before its start, so after any restart the server sends it again.
//! While the process runs, the offsets each unconfirmed transaction was
//! given are kept, so a replay (a seek, a reconnect) gives its changes
//! the same offsets again and skips exactly the delivered ones. After a
//! process restart they are not known: the transactions the server sends
//! again get fresh offsets at or after the committed one, so a partially
//! delivered transaction is delivered again whole (at least once).

use std::collections::{BTreeMap, HashMap};

use crate::Lsn;

/// One transaction read and not yet confirmed.
#[derive(Clone, Copy, Debug)]
struct Txn {
    final_lsn: Lsn,
    /// The end of its commit record, once the commit was read.
    end_lsn: Option<Lsn>,
    /// Its changes, once the commit was read.
    changes: i64,
}

/// What the source knows of offsets and confirmations, shared by the
/// reading task, the status task and [`Source::commit`](etl_source::Source::commit).
#[derive(Debug)]
pub(crate) struct Progress {
    /// Unconfirmed transactions by first offset.
    txns: BTreeMap<i64, Txn>,
    /// First offsets by commit LSN.
    by_lsn: HashMap<Lsn, i64>,
    /// The position the server may confirm: everything before it is
    /// delivered. Never decreases.
    flushed: Lsn,
    /// The server's end of WAL as last heard.
    received: Lsn,
    /// The lowest offset the next new transaction may take.
    next_free: i64,
    /// The highest offset the checkpointer committed, as last heard.
    committed: i64,
    /// The server's end of WAL, as its last message said.
    server_end: Lsn,
}

/// What [`Progress::begin`] decided for a transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Begun {
    /// Delivered and confirmed already: skip it.
    Confirmed,
    /// Its first change's offset.
    At(i64),
}

impl Progress {
    /// Nothing read yet; the slot is confirmed at `confirmed`, and offsets
    /// start at `floor` (the committed offset).
    pub(crate) fn new(confirmed: Lsn, floor: i64) -> Self {
        Progress {
            txns: BTreeMap::new(),
            by_lsn: HashMap::new(),
            flushed: confirmed,
            received: confirmed,
            next_free: floor,
            committed: 0,
            server_end: confirmed,
        }
    }

    /// The server's end of WAL is at least `lsn` (the header of every
    /// message it streams says where it is).
    pub(crate) fn server_end(&mut self, lsn: Lsn) {
        self.server_end = self.server_end.max(lsn);
    }

    /// Bytes of WAL the slot retains past the position to confirm: the
    /// server's end of WAL as last heard minus that position
    /// (`pg_current_wal_lsn() - confirmed_flush_lsn` as of the last
    /// message).
    pub(crate) fn retained(&self) -> u64 {
        self.server_end
            .0
            .max(self.received.0)
            .saturating_sub(self.flushed.0)
    }

    /// The offset the server's end of WAL stands for: every change it
    /// holds takes an offset below it (offsets follow commit LSNs, or the
    /// offsets given already when those run ahead).
    pub(crate) fn high_watermark(&self) -> i64 {
        let end = self.server_end.0.max(self.received.0);
        i64::try_from(end).unwrap_or(i64::MAX).max(self.next_free)
    }

    /// The highest offset the checkpointer committed, as last heard
    /// (through [`delivered`](Self::delivered)).
    pub(crate) fn committed(&self) -> i64 {
        self.committed
    }

    /// An initial snapshot starts: its rows take offsets from the one
    /// returned on, which is at or above `floor` and above every offset
    /// given before.
    pub(crate) fn snapshot_start(&mut self, floor: i64) -> i64 {
        self.next_free = self.next_free.max(floor);
        self.next_free
    }

    /// The snapshot's rows took the offsets before `end`: the changes
    /// after it come after them.
    pub(crate) fn snapshot_end(&mut self, end: i64) {
        self.next_free = self.next_free.max(end);
    }

    /// The position to confirm to the server.
    pub(crate) fn flushed(&self) -> Lsn {
        self.flushed
    }

    /// The server's end of WAL as last heard.
    pub(crate) fn received(&self) -> Lsn {
        self.received
    }

    /// The slot is confirmed at `lsn` on the server (read at connect):
    /// nothing before it comes again.
    pub(crate) fn server_confirmed(&mut self, lsn: Lsn) {
        self.flushed = self.flushed.max(lsn);
        self.received = self.received.max(lsn);
    }

    /// Seeking to `floor`: new transactions take offsets from there on.
    pub(crate) fn seek(&mut self, floor: i64) {
        self.next_free = self.next_free.max(floor);
    }

    /// A transaction committing at `final_lsn` starts.
    pub(crate) fn begin(&mut self, final_lsn: Lsn) -> Result<Begun, String> {
        if final_lsn < self.flushed {
            return Ok(Begun::Confirmed);
        }
        if let Some(first) = self.by_lsn.get(&final_lsn) {
            return Ok(Begun::At(*first));
        }
        let lsn = i64::try_from(final_lsn.0)
            .map_err(|_| format!("commit LSN {final_lsn} is beyond the offsets' range"))?;
        let first = lsn.max(self.next_free);
        self.txns.insert(
            first,
            Txn {
                final_lsn,
                end_lsn: None,
                changes: 0,
            },
        );
        self.by_lsn.insert(final_lsn, first);
        Ok(Begun::At(first))
    }

    /// The transaction that started at `first` committed with `changes`
    /// changes; its commit record ends at `end_lsn`.
    pub(crate) fn commit(&mut self, first: i64, end_lsn: Lsn, changes: i64) {
        self.next_free = self.next_free.max(first.saturating_add(changes));
        self.received = self.received.max(end_lsn);
        if changes == 0 {
            // Nothing to deliver: a later delivered transaction, or the
            // next keepalive, confirms past it.
            if let Some(txn) = self.txns.remove(&first) {
                self.by_lsn.remove(&txn.final_lsn);
            }
            return;
        }
        if let Some(txn) = self.txns.get_mut(&first) {
            txn.end_lsn = Some(end_lsn);
            txn.changes = changes;
        }
    }

    /// The checkpointer committed `offset` (the offset after the last
    /// delivered change): confirm past every transaction it covers.
    /// Returns whether the position to confirm moved.
    pub(crate) fn delivered(&mut self, offset: i64) -> bool {
        self.committed = self.committed.max(offset);
        let before = self.flushed;
        while let Some((&first, txn)) = self.txns.first_key_value() {
            let Some(end_lsn) = txn.end_lsn else { break };
            if first.saturating_add(txn.changes) > offset {
                break;
            }
            self.flushed = self.flushed.max(end_lsn);
            self.by_lsn.remove(&txn.final_lsn);
            self.txns.remove(&first);
        }
        self.flushed != before
    }

    /// The server says it has sent everything before `wal_end` and the
    /// reader has taken all of it: with nothing unconfirmed, the slot may
    /// move there (a quiet publication on a busy server does not pin
    /// WAL). Returns whether the position to confirm moved.
    pub(crate) fn idle(&mut self, wal_end: Lsn) -> bool {
        self.received = self.received.max(wal_end);
        self.server_end = self.server_end.max(wal_end);
        if self.txns.is_empty() && wal_end > self.flushed {
            self.flushed = wal_end;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slot_moves_only_past_transactions_delivered_whole() {
        let mut p = Progress::new(Lsn(100), 0);
        let Begun::At(a) = p.begin(Lsn(1000)).expect("begin") else {
            panic!("new transaction")
        };
        assert_eq!(a, 1000);
        p.commit(a, Lsn(1040), 3);
        // A large transaction right after: its offsets start after the
        // first one's, not at its commit LSN.
        let Begun::At(b) = p.begin(Lsn(1001)).expect("begin") else {
            panic!("new transaction")
        };
        assert_eq!(b, 1003);
        p.commit(b, Lsn(1100), 5000);

        // Two of the first transaction's three changes delivered.
        assert!(!p.delivered(1002));
        assert_eq!(p.flushed(), Lsn(100));
        assert!(p.delivered(1003));
        assert_eq!(p.flushed(), Lsn(1040));
        // All but the last change of the second.
        assert!(!p.delivered(1003 + 4999));
        assert_eq!(p.flushed(), Lsn(1040));
        assert!(p.delivered(1003 + 5000));
        assert_eq!(p.flushed(), Lsn(1100));
    }

    proptest::proptest! {
        /// Against a model: offsets grow strictly in commit order, and
        /// after any committed offset the position to confirm is past
        /// exactly the transactions delivered whole, in order.
        #[test]
        fn the_confirmed_position_is_the_end_of_the_delivered_prefix(
            txns in proptest::collection::vec((1u64..64, 0i64..40), 1..30),
            commits in proptest::collection::vec(0usize..2000, 1..20),
        ) {
            let mut p = Progress::new(Lsn(8), 0);
            let mut lsn = 8u64;
            // (first offset, changes, end of commit record)
            let mut made: Vec<(i64, i64, Lsn)> = Vec::new();
            let mut last = -1i64;
            for (gap, changes) in txns {
                lsn += gap * 8;
                let Ok(Begun::At(first)) = p.begin(Lsn(lsn)) else {
                    panic!("a new transaction at {lsn}");
                };
                if changes > 0 {
                    proptest::prop_assert!(first > last, "offsets go back: {first} after {last}");
                    last = first + changes - 1;
                }
                let end = Lsn(lsn + 8);
                lsn += 8;
                p.commit(first, end, changes);
                made.push((first, changes, end));
            }
            let mut committed = 0i64;
            for step in commits {
                committed = committed.max(made[step % made.len()].0 + (step as i64 % 3));
                p.delivered(committed);
                // The model: the end of the last transaction before the
                // first one not delivered whole.
                let mut expected = Lsn(8);
                for &(first, changes, end) in &made {
                    if changes > 0 && first + changes > committed {
                        break;
                    }
                    if changes > 0 {
                        expected = end;
                    }
                }
                proptest::prop_assert_eq!(p.flushed(), expected, "committed {}", committed);
            }
        }
    }

    #[test]
    fn the_retained_wal_is_the_servers_end_past_the_position_to_confirm() {
        let mut p = Progress::new(Lsn(1000), 0);
        assert_eq!(p.retained(), 0);
        let Begun::At(at) = p.begin(Lsn(1100)).expect("begin") else {
            panic!("new transaction")
        };
        p.server_end(Lsn(1500));
        p.commit(at, Lsn(1120), 2);
        assert_eq!(p.retained(), 500, "read, not delivered");
        assert_eq!(p.high_watermark(), 1500);
        assert!(p.delivered(at + 2));
        assert_eq!(
            p.retained(),
            380,
            "the server wrote on past the delivered commit"
        );
        // The server's end as a keepalive says it, nothing unconfirmed:
        // the slot moves there and retains nothing.
        assert!(p.idle(Lsn(1600)));
        assert_eq!(p.retained(), 0);
        // Offsets that ran ahead of the WAL (a snapshot's rows): the high
        // watermark is past every offset given.
        let first = p.snapshot_start(0);
        p.snapshot_end(first + 5000);
        assert_eq!(p.high_watermark(), first + 5000);
    }

    #[test]
    fn a_replayed_transaction_gets_its_offsets_again() {
        let mut p = Progress::new(Lsn(0), 0);
        let first = p.begin(Lsn(500)).expect("begin");
        if let Begun::At(at) = first {
            p.commit(at, Lsn(520), 4);
        }
        p.seek(502);
        assert_eq!(p.begin(Lsn(500)).expect("again"), first);
        // Confirmed transactions are skipped when sent again.
        assert!(p.delivered(504));
        assert_eq!(p.begin(Lsn(500)).expect("again"), Begun::Confirmed);
    }

    #[test]
    fn keepalives_confirm_only_when_nothing_is_unconfirmed() {
        let mut p = Progress::new(Lsn(10), 0);
        let Begun::At(at) = p.begin(Lsn(50)).expect("begin") else {
            panic!("new transaction")
        };
        assert!(!p.idle(Lsn(80)), "a transaction in flight pins the slot");
        p.commit(at, Lsn(60), 1);
        assert!(!p.idle(Lsn(90)), "read but not delivered");
        assert!(p.delivered(at + 1));
        assert_eq!(p.flushed(), Lsn(60));
        assert!(p.idle(Lsn(90)));
        assert_eq!(p.flushed(), Lsn(90));
        // An empty transaction holds nothing.
        let Begun::At(at) = p.begin(Lsn(95)).expect("begin") else {
            panic!("new transaction")
        };
        p.commit(at, Lsn(99), 0);
        assert!(p.idle(Lsn(120)));
    }
}
