//! Offsets of changes, and the position the slot may be confirmed at.
//!
//! The slot is one partition. A transaction's changes take consecutive
//! offsets starting at its commit LSN, or just after the previous
//! transaction's last offset when that is higher (a large transaction
//! followed closely by another): offsets increase strictly in the order
//! the server sends, which is commit order, and stay near the commit LSN.
//! A transaction whose offsets start at its commit LSN (every offset given
//! before it lies below that LSN) is *anchored*.
//!
//! The server sends, after a restart, exactly the transactions whose
//! commit record starts at or after the slot's confirmed position (it
//! skips the others while decoding). So the slot is confirmed only where
//! the first transaction it sends again is anchored, and nothing before
//! is undelivered: at the commit LSN of an anchored transaction with
//! every transaction before it delivered, at the end of a delivered
//! commit record that lies above every offset given, or at the server's
//! end of WAL from a keepalive when everything read is delivered and it
//! lies above every offset given. The first transaction after any
//! restart, of the process or of the server (which may go back to a
//! position confirmed earlier), then takes its commit LSN as its first
//! offset, as it did before, and every later one follows as before:
//! offsets given again are the offsets given before, and the committed
//! offset skips exactly the changes delivered. The cost is that the slot
//! may stay at the start of a delivered transaction (or of a chain of
//! transactions that were not anchored) until the next position allowed.
//!
//! While the process runs, the offsets of unconfirmed transactions are
//! kept as well, so a replay within the run (a seek, a reconnect) needs
//! no anchor.

use std::collections::{BTreeMap, HashMap};

use crate::Lsn;

/// One transaction read and not yet confirmed.
#[derive(Clone, Copy, Debug)]
struct Txn {
    final_lsn: Lsn,
    /// Where its first change is in the WAL (a restart that sends it
    /// again decodes the WAL from there).
    first_lsn: Lsn,
    /// The end of its commit record, once the commit was read.
    end_lsn: Option<Lsn>,
    /// Its changes, once the commit was read.
    changes: i64,
}

impl Txn {
    /// Whether its changes start at its commit LSN (`first` is its first
    /// offset): every offset given before it lies below its commit LSN.
    fn anchored(&self, first: i64) -> bool {
        lsn_offset(self.final_lsn) == Some(first)
    }
}

/// What the source knows of offsets and confirmations, shared by the
/// reading task, the status task and [`Source::commit`](etl_source::Source::commit).
#[derive(Debug)]
pub(crate) struct Progress {
    /// Unconfirmed transactions by first offset, then commit LSN: a
    /// transaction without changes takes no offset, so the next one
    /// starts at the same first offset.
    txns: BTreeMap<(i64, Lsn), Txn>,
    /// First offsets by commit LSN, kept for transactions without
    /// changes too (until the slot passes them), so that one sent again
    /// takes its place in commit order again.
    by_lsn: HashMap<Lsn, i64>,
    /// The transaction being read: the stream sends one at a time.
    reading: Option<(i64, Lsn)>,
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
    /// An exactly-once sink's stored progress, read when the pipeline was
    /// built: the sink skips every offset below it.
    stored: i64,
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
    /// Nothing read yet; the slot is confirmed at `confirmed`. The first
    /// transaction read takes offsets from its commit LSN on, whatever
    /// the committed offset: it is anchored (module docs).
    pub(crate) fn new(confirmed: Lsn) -> Self {
        Progress {
            txns: BTreeMap::new(),
            by_lsn: HashMap::new(),
            reading: None,
            flushed: confirmed,
            received: confirmed,
            next_free: 0,
            committed: 0,
            server_end: confirmed,
            stored: 0,
        }
    }

    /// The server's end of WAL is at least `lsn` (the header of every
    /// message it streams says where it is).
    pub(crate) fn server_end(&mut self, lsn: Lsn) {
        self.server_end = self.server_end.max(lsn);
    }

    /// Bytes of WAL the slot retains for the pipeline: the server's end
    /// of WAL as last heard minus the position to confirm or, when
    /// earlier, the first change of a transaction the server would send
    /// again (the slot may be confirmed at the commit of a transaction
    /// not delivered, whose changes lie before it).
    pub(crate) fn retained(&self) -> u64 {
        let from = self
            .txns
            .values()
            .map(|txn| txn.first_lsn)
            .fold(self.flushed, Lsn::min);
        self.server_end
            .0
            .max(self.received.0)
            .saturating_sub(from.0)
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

    /// What the pipeline holds as delivered: `floor` (the committed
    /// offset) or an exactly-once sink's stored progress, the higher.
    pub(crate) fn held(&self, floor: i64) -> i64 {
        floor.max(self.stored)
    }

    /// An exactly-once sink stored progress up to `offset`: it skips
    /// every record below it, so a snapshot's rows (a new read, not a
    /// replay) take offsets at or above it.
    pub(crate) fn stored_progress(&mut self, offset: i64) {
        self.stored = self.stored.max(offset);
    }

    /// An initial snapshot starts: its rows take offsets from the one
    /// returned on, which is at or above `floor`, at or above an
    /// exactly-once sink's stored progress and above every offset given
    /// before, so no stale progress skips them.
    pub(crate) fn snapshot_start(&mut self, floor: i64) -> i64 {
        self.next_free = self.next_free.max(floor).max(self.stored);
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

    /// A transaction committing at `final_lsn` starts, its first change
    /// at `first_lsn` (where the server says its `BEGIN` message is).
    pub(crate) fn begin_at(&mut self, final_lsn: Lsn, first_lsn: Lsn) -> Result<Begun, String> {
        self.reading = None;
        if final_lsn < self.flushed {
            return Ok(Begun::Confirmed);
        }
        let first = match self.by_lsn.get(&final_lsn) {
            Some(first) => *first,
            None => {
                let lsn = lsn_offset(final_lsn).ok_or_else(|| {
                    format!("commit LSN {final_lsn} is beyond the offsets' range")
                })?;
                let first = lsn.max(self.next_free);
                self.by_lsn.insert(final_lsn, first);
                first
            }
        };
        // Sent again, a transaction without changes is read anew (it was
        // let go of at its commit); any other keeps what it had.
        self.txns.entry((first, final_lsn)).or_insert(Txn {
            final_lsn,
            first_lsn: first_lsn.min(final_lsn),
            end_lsn: None,
            changes: 0,
        });
        self.reading = Some((first, final_lsn));
        Ok(Begun::At(first))
    }

    /// The transaction being read, which started at `first`, committed
    /// with `changes` changes; its commit record ends at `end_lsn`.
    pub(crate) fn commit(&mut self, first: i64, end_lsn: Lsn, changes: i64) {
        self.next_free = self.next_free.max(first.saturating_add(changes));
        self.received = self.received.max(end_lsn);
        let key = match self.reading.take() {
            Some(key) if key.0 == first => Some(key),
            _ => self
                .txns
                .iter()
                .find(|((f, _), txn)| *f == first && txn.end_lsn.is_none())
                .map(|(key, _)| *key),
        };
        let Some(key) = key else { return };
        if changes == 0 {
            // Nothing to deliver: a later delivered transaction, or the
            // next keepalive, confirms past it. Its first offset stays
            // known (`by_lsn`) until then.
            self.txns.remove(&key);
            return;
        }
        if let Some(txn) = self.txns.get_mut(&key) {
            txn.end_lsn = Some(end_lsn);
            txn.changes = changes;
        }
    }

    /// The checkpointer committed `offset` (the offset after the last
    /// delivered change): move the position to confirm as far as the
    /// rule allows (see the module docs). Returns whether it moved.
    pub(crate) fn delivered(&mut self, offset: i64) -> bool {
        self.committed = self.committed.max(offset);
        let before = self.flushed;
        let mut best = self.flushed;
        // The end of a delivered transaction's commit record, kept until
        // the next transaction's commit LSN shows it is not past it.
        let mut pending_end: Option<Lsn> = None;
        for (&(first, _), txn) in &self.txns {
            if let Some(end) = pending_end.take()
                && end <= txn.final_lsn
            {
                best = best.max(end);
            }
            if txn.anchored(first) {
                // Everything before it is delivered: a restart here
                // gives it, and so everything after it, the same offsets.
                best = best.max(txn.final_lsn);
            }
            let Some(end_lsn) = txn.end_lsn else { break };
            if first.saturating_add(txn.changes) > self.committed {
                break;
            }
            // Delivered whole: its commit record's end is a position to
            // confirm when every offset given so far lies below it (the
            // next transaction commits there or later, so it is anchored).
            if lsn_offset(end_lsn).is_some_and(|end| end >= first.saturating_add(txn.changes)) {
                pending_end = Some(end_lsn);
            }
        }
        if let Some(end) = pending_end {
            // The last transaction read, delivered whole.
            best = best.max(end);
        }
        self.flushed = best;
        let flushed = self.flushed;
        self.txns.retain(|_, txn| txn.final_lsn >= flushed);
        self.by_lsn.retain(|final_lsn, _| *final_lsn >= flushed);
        self.flushed != before
    }

    /// The server says it has sent everything before `wal_end` and the
    /// reader has taken all of it: with every transaction read delivered
    /// and every offset given below `wal_end`, the slot may move there
    /// (the next transaction commits there or later and is anchored), so
    /// a quiet publication on a busy server does not pin WAL. Returns
    /// whether the position to confirm moved.
    pub(crate) fn idle(&mut self, wal_end: Lsn) -> bool {
        self.received = self.received.max(wal_end);
        self.server_end = self.server_end.max(wal_end);
        let all_delivered = self.txns.iter().all(|(&(first, _), txn)| {
            txn.end_lsn.is_some()
                && txn.final_lsn < wal_end
                && first.saturating_add(txn.changes) <= self.committed
        });
        let above_offsets = lsn_offset(wal_end).is_some_and(|end| end >= self.next_free);
        if all_delivered && above_offsets && wal_end > self.flushed {
            self.flushed = wal_end;
            self.txns.clear();
            self.by_lsn.clear();
            return true;
        }
        false
    }
}

/// `lsn` as an offset, when it is in the offsets' range.
fn lsn_offset(lsn: Lsn) -> Option<i64> {
    i64::try_from(lsn.0).ok()
}

#[cfg(test)]
impl Progress {
    /// [`begin_at`](Self::begin_at) a transaction of one record.
    fn begin(&mut self, final_lsn: Lsn) -> Result<Begun, String> {
        self.begin_at(final_lsn, final_lsn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A transaction without a change in the publication (PostgreSQL 14
    /// and older send their BEGIN and COMMIT), sent again by a reconnect
    /// while a later transaction was being read, took the later one's
    /// first offset and replaced its entry: the slot was then confirmed
    /// past that transaction's changes, none of them delivered.
    #[test]
    fn an_empty_transaction_sent_again_keeps_the_one_read_after_it() {
        let mut p = Progress::new(Lsn(900));
        // A large transaction runs the offsets past the next commits.
        let l = begun(&mut p, 1000);
        p.commit(l, Lsn(1050), 500);
        let e = begun(&mut p, 1100);
        assert_eq!(e, 1500);
        p.commit(e, Lsn(1150), 0);
        let x = begun(&mut p, 1200);
        assert_eq!(x, 1500);
        // The connection drops in X; the server sends L, E and X again.
        assert_eq!(begun(&mut p, 1000), 1000);
        p.commit(1000, Lsn(1050), 500);
        let e = begun(&mut p, 1100);
        p.commit(e, Lsn(1150), 0);
        assert_eq!(begun(&mut p, 1200), 1500);
        p.commit(1500, Lsn(1250), 3);
        assert_eq!(begun(&mut p, 5000), 5000);
        // L delivered, X not: the slot stays at or before X's commit.
        p.delivered(1500);
        assert!(p.flushed() <= Lsn(1200), "confirmed at {}", p.flushed());
        // Nor does a keepalive move it past X.
        p.commit(5000, Lsn(5050), 1);
        assert!(!p.idle(Lsn(6000)));
        assert!(p.flushed() <= Lsn(1200), "confirmed at {}", p.flushed());
        // X and the last delivered: the slot moves on.
        assert!(p.delivered(5001));
        assert_eq!(p.flushed(), Lsn(5050));
    }

    /// The same with a keepalive right after the empty transaction sent
    /// again, while X is read.
    #[test]
    fn a_keepalive_after_an_empty_transaction_sent_again_keeps_the_slot_before_x() {
        let mut p = Progress::new(Lsn(900));
        let l = begun(&mut p, 1000);
        p.commit(l, Lsn(1050), 500);
        let e = begun(&mut p, 1100);
        p.commit(e, Lsn(1150), 0);
        let _x = begun(&mut p, 1200);
        assert_eq!(begun(&mut p, 1000), 1000);
        p.commit(1000, Lsn(1050), 500);
        let e = begun(&mut p, 1100);
        p.commit(e, Lsn(1150), 0);
        p.delivered(1500);
        assert!(!p.idle(Lsn(1600)));
        assert!(p.flushed() <= Lsn(1200), "confirmed at {}", p.flushed());
    }

    /// A started transaction, its first offset.
    fn begun(p: &mut Progress, lsn: u64) -> i64 {
        match p.begin(Lsn(lsn)) {
            Ok(Begun::At(first)) => first,
            other => panic!("a new transaction at {lsn}: {other:?}"),
        }
    }

    #[test]
    fn the_slot_is_confirmed_only_where_a_restart_gives_the_same_offsets() {
        let mut p = Progress::new(Lsn(100));
        // Anchored: its offsets start at its commit LSN.
        let a = begun(&mut p, 1000);
        assert_eq!(a, 1000);
        p.commit(a, Lsn(1040), 100);
        // A large transaction committing right after: its offsets start
        // after the first one's, not at its commit LSN (not anchored).
        let b = begun(&mut p, 1040);
        assert_eq!(b, 1100);
        p.commit(b, Lsn(1100), 5000);
        // Anchored again once the commit LSNs pass the offsets.
        let c = begun(&mut p, 7000);
        assert_eq!(c, 7000);
        p.commit(c, Lsn(7050), 2);

        // Nothing delivered: the slot may go to the first transaction's
        // commit, which the server then sends again.
        assert!(p.delivered(0));
        assert_eq!(p.flushed(), Lsn(1000));
        // The first delivered: its commit record ends below its offsets,
        // and the second is not anchored, so a restart past the first
        // would give the second other offsets: the slot stays.
        assert!(!p.delivered(1099));
        assert!(!p.delivered(1100));
        assert_eq!(p.flushed(), Lsn(1000));
        assert!(!p.delivered(1100 + 4999));
        // The second delivered: the third's commit LSN, anchored, is the
        // position to confirm.
        assert!(p.delivered(1100 + 5000));
        assert_eq!(p.flushed(), Lsn(7000));
        // Sent again within the run, the delivered ones are skipped, the
        // third takes its offsets again.
        assert_eq!(p.begin(Lsn(1040)).expect("again"), Begun::Confirmed);
        assert_eq!(p.begin(Lsn(7000)).expect("again"), Begun::At(7000));
        // The third delivered: its commit record's end lies above its
        // offsets.
        assert!(p.delivered(7002));
        assert_eq!(p.flushed(), Lsn(7050));
    }

    proptest::proptest! {
        /// Against a model: the position to confirm never passes a
        /// change not delivered, and is the furthest position from which
        /// the server sends again transactions that take the offsets they
        /// had: the commit LSN of an anchored transaction after which
        /// nothing is delivered, or the end of a delivered commit record
        /// above every offset given.
        #[test]
        fn the_confirmed_position_never_passes_an_undelivered_change(
            txns in proptest::collection::vec((0u64..64, 0i64..40), 1..30),
            commits in proptest::collection::vec(0usize..2000, 1..20),
        ) {
            let mut p = Progress::new(Lsn(8));
            let mut lsn = 8u64;
            // (commit LSN, end of commit record, first offset, changes)
            let mut made: Vec<(Lsn, Lsn, i64, i64)> = Vec::new();
            let mut last = -1i64;
            for (gap, changes) in txns {
                lsn += gap * 8;
                let first = begun(&mut p, lsn);
                if changes > 0 {
                    proptest::prop_assert!(first > last, "offsets go back: {first} after {last}");
                    proptest::prop_assert!(first >= lsn as i64);
                    last = first + changes - 1;
                }
                let end = Lsn(lsn + 8);
                lsn += 8;
                p.commit(first, end, changes);
                if changes > 0 {
                    made.push((Lsn(end.0 - 8), end, first, changes));
                }
            }
            let mut committed = 0i64;
            let mut expected = Lsn(8);
            for step in commits {
                if made.is_empty() {
                    break;
                }
                committed = committed.max(made[step % made.len()].2 + (step as i64 % 3));
                p.delivered(committed);
                let undelivered = made.iter().position(|t| t.2 + t.3 > committed);
                for (i, &(commit, end, first, changes)) in made.iter().enumerate() {
                    if undelivered.is_some_and(|u| i > u) {
                        break;
                    }
                    if first == commit.0 as i64 {
                        expected = expected.max(commit);
                    }
                    let delivered = undelivered.is_none_or(|u| i < u);
                    let next_commit = made.get(i + 1).map(|t| t.0);
                    if delivered
                        && end.0 as i64 >= first + changes
                        && next_commit.is_none_or(|next| next >= end)
                    {
                        expected = expected.max(end);
                    }
                }
                proptest::prop_assert_eq!(p.flushed(), expected, "committed {}", committed);
                if let Some(u) = undelivered {
                    proptest::prop_assert!(p.flushed() <= made[u].0, "past an undelivered change");
                }
            }
        }
    }

    /// The write-ahead log of a model run: each transaction's commit LSN,
    /// the end of its commit record and its number of changes. Commits
    /// follow each other closely, so a large transaction's offsets often
    /// run past the next commit LSN.
    fn model_wal(spec: &[(u64, u64, i64)]) -> Vec<(Lsn, Lsn, i64)> {
        let mut lsn = 64u64;
        spec.iter()
            .map(|&(gap, len, changes)| {
                let commit = lsn + gap;
                lsn = commit + len;
                (Lsn(commit), Lsn(lsn), changes)
            })
            .collect()
    }

    /// What a model pipeline with an exactly-once sink saw over runs of
    /// the source separated by crashes.
    #[derive(Default)]
    struct ModelSink {
        /// The sink's stored progress: the offset after the last change
        /// it holds.
        progress: i64,
        /// The offset every change (transaction, index) was given.
        given: HashMap<(usize, i64), i64>,
        /// How many times each change was stored.
        stored: HashMap<(usize, i64), u32>,
        /// Every position confirmed to the server (a restarted server may
        /// go back to any of them).
        confirmed: Vec<Lsn>,
    }

    impl ModelSink {
        /// The commit LSN of the first transaction not stored whole, if
        /// any was read.
        fn first_undelivered(&self, wal: &[(Lsn, Lsn, i64)]) -> Option<Lsn> {
            wal.iter()
                .enumerate()
                .find(|(i, (_, _, changes))| {
                    (0..*changes).any(|j| !self.stored.contains_key(&(*i, j)))
                })
                .map(|(_, (commit, _, _))| *commit)
        }

        /// One run of the source: the server streams from `start`; the
        /// pipeline reads `reads` transactions (each begun counts, sent
        /// again or not), storing the changes read `lag` changes behind,
        /// then the process dies (`reads` past the end: the run reads and
        /// stores everything). Each of `reconnects`, `(at, cut, back)`,
        /// drops the stream within the run after `cut` changes (modulo the
        /// transaction's changes plus one) of the `at`-th transaction
        /// begun: the batch being filled is lost, and the server streams
        /// again from its confirmed position, or from the one `back`
        /// confirmations before after its own crash, while the process
        /// keeps what it knows.
        fn run(
            &mut self,
            wal: &[(Lsn, Lsn, i64)],
            start: Lsn,
            reads: usize,
            lag: usize,
            reconnects: &[(usize, i64, usize)],
        ) -> Result<(), proptest::test_runner::TestCaseError> {
            use proptest::test_runner::TestCaseError;

            let mut p = Progress::new(Lsn(0));
            p.server_confirmed(start);
            // The source skips what lies below the sink's progress; what
            // it handed on (`floor`) is not sent again after a reconnect.
            let mut floor = self.progress;
            let mut next = floor;
            // Changes read and not handed on yet: lost with the stream.
            let mut batch: Vec<((usize, i64), i64)> = Vec::new();
            let mut queue: std::collections::VecDeque<((usize, i64), i64)> =
                std::collections::VecDeque::new();
            let whole = reads == usize::MAX;
            // Store what lies `lag` changes behind the reader.
            let keep = if whole { 0 } else { lag };
            // Changes in a full batch.
            const BATCH: usize = 4;
            let mut begun = 0usize;
            let mut from = start;
            'stream: loop {
                let sent: Vec<usize> = (0..wal.len()).filter(|&i| wal[i].0 >= from).collect();
                for (n, &i) in sent.iter().enumerate() {
                    if begun >= reads {
                        break 'stream;
                    }
                    let (commit, end, changes) = wal[i];
                    let cut = reconnects
                        .iter()
                        .find(|r| r.0 == begun)
                        .map(|&(_, cut, back)| (cut.rem_euclid(changes + 1), back));
                    begun += 1;
                    let first = match p.begin(commit) {
                        Ok(Begun::At(first)) => Some(first),
                        Ok(Begun::Confirmed) => {
                            // Skipped: it must be delivered whole.
                            if let Some(j) =
                                (0..changes).find(|j| !self.stored.contains_key(&(i, *j)))
                            {
                                return Err(TestCaseError::fail(format!(
                                    "transaction {i} at {commit} skipped as confirmed, its change {j} not delivered"
                                )));
                            }
                            None
                        }
                        Err(e) => return Err(TestCaseError::fail(e)),
                    };
                    for j in 0..=changes {
                        if let Some((cut, back)) = cut
                            && cut == j
                        {
                            // The stream drops here: the batch is lost, and
                            // the server sends again from where it stands.
                            batch.clear();
                            next = floor;
                            let last = self.confirmed.len() - 1;
                            from = self.confirmed[last.saturating_sub(back)];
                            p.server_confirmed(from);
                            if let Some(undelivered) = self.first_undelivered(wal) {
                                proptest::prop_assert!(
                                    from <= undelivered,
                                    "reconnect at {} loses {}",
                                    from,
                                    undelivered
                                );
                            }
                            continue 'stream;
                        }
                        let Some(first) = first else { continue };
                        if j == changes {
                            break;
                        }
                        let offset = first + j;
                        let before = *self.given.entry((i, j)).or_insert(offset);
                        proptest::prop_assert_eq!(
                            before,
                            offset,
                            "change {} of transaction {} at {} took another offset (run from {}, stream from {})",
                            j,
                            i,
                            commit,
                            start,
                            from
                        );
                        if offset >= next {
                            next = offset + 1;
                            batch.push(((i, j), offset));
                        }
                        // A full batch goes to the pipeline, which stores
                        // while the transaction is still being read.
                        if batch.len() >= BATCH {
                            queue.extend(batch.drain(..));
                            floor = next;
                            self.store(&mut p, &mut queue, keep, wal)?;
                        }
                    }
                    if let Some(first) = first {
                        p.commit(first, end, changes);
                    }
                    // The batch goes to the pipeline at each commit.
                    queue.extend(batch.drain(..));
                    floor = next;
                    self.store(&mut p, &mut queue, keep, wal)?;
                    // A keepalive: the server's end of WAL is at most the
                    // next commit.
                    if queue.is_empty() {
                        let wal_end = sent.get(n + 1).map_or(end, |&k| wal[k].0);
                        if p.idle(wal_end) {
                            self.confirmed.push(p.flushed());
                        }
                        if let Some(undelivered) = self.first_undelivered(wal) {
                            proptest::prop_assert!(
                                p.flushed() <= undelivered,
                                "a keepalive at {} confirmed {} past an undelivered transaction at {}",
                                wal_end,
                                p.flushed(),
                                undelivered
                            );
                        }
                    }
                }
                break;
            }
            Ok(())
        }

        /// The pipeline stores what lies more than `keep` changes behind
        /// the reader, and the checkpointer commits it.
        fn store(
            &mut self,
            p: &mut Progress,
            queue: &mut std::collections::VecDeque<((usize, i64), i64)>,
            keep: usize,
            wal: &[(Lsn, Lsn, i64)],
        ) -> Result<(), proptest::test_runner::TestCaseError> {
            while queue.len() > keep {
                let Some((change, offset)) = queue.pop_front() else {
                    break;
                };
                *self.stored.entry(change).or_insert(0) += 1;
                self.progress = offset + 1;
                if p.delivered(self.progress) {
                    self.confirmed.push(p.flushed());
                }
                if let Some(undelivered) = self.first_undelivered(wal) {
                    proptest::prop_assert!(
                        p.flushed() <= undelivered,
                        "confirmed at {} past an undelivered transaction at {}",
                        p.flushed(),
                        undelivered
                    );
                }
            }
            Ok(())
        }
    }

    /// A model WAL's transactions: the gap before the commit, the commit
    /// record's length, the changes (one in four empty: PostgreSQL 14 and
    /// older send the `BEGIN` and `COMMIT` of a transaction without a
    /// change in the publication).
    fn model_spec() -> impl proptest::strategy::Strategy<Value = Vec<(u64, u64, i64)>> {
        use proptest::strategy::Strategy;
        let changes = proptest::prop_oneof![1 => proptest::strategy::Just(0i64), 3 => 0i64..40];
        proptest::collection::vec((0u64..48, 8u64..40, changes), 1..24).boxed()
    }

    proptest::proptest! {
        /// Exactly once over crashes and reconnects: whatever the
        /// transactions (empty ones among them), wherever the process
        /// dies (and the server restarts from any position it was
        /// confirmed at before), and wherever the stream drops within a
        /// run (mid-transaction, the server sending again from its
        /// confirmed position or an older one while later transactions
        /// were being read), a transaction sent again gives every change
        /// the offset it had, one skipped as confirmed was delivered, the
        /// sink's progress skips exactly what it holds, and in the end
        /// every change is stored once.
        #[test]
        fn transactions_sent_again_after_a_restart_take_the_offsets_they_had(
            spec in model_spec(),
            runs in proptest::collection::vec(
                (
                    0usize..8,
                    0usize..40,
                    0usize..60,
                    proptest::bool::ANY,
                    proptest::collection::vec((0usize..40, 0i64..40, 0usize..4), 0..4),
                ),
                1..8,
            ),
        ) {
            let wal = model_wal(&spec);
            let mut sink = ModelSink { confirmed: vec![Lsn(64)], ..ModelSink::default() };
            for (back, reads, lag, server_restarted, reconnects) in runs {
                // The server streams from its confirmed position: the
                // last one, or an older one after its own crash.
                let last = sink.confirmed.len() - 1;
                let start = if server_restarted {
                    sink.confirmed[last.saturating_sub(back)]
                } else {
                    sink.confirmed[last]
                };
                if let Some(undelivered) = sink.first_undelivered(&wal) {
                    proptest::prop_assert!(start <= undelivered, "restart at {start} loses {undelivered}");
                }
                sink.run(&wal, start, reads, lag, &reconnects)?;
            }
            let start = *sink.confirmed.last().unwrap_or(&Lsn(64));
            sink.run(&wal, start, usize::MAX, 0, &[])?;
            for (i, &(_, _, changes)) in wal.iter().enumerate() {
                for j in 0..changes {
                    proptest::prop_assert_eq!(
                        sink.stored.get(&(i, j)).copied(), Some(1),
                        "change {} of transaction {}", j, i
                    );
                }
            }
        }
    }

    #[test]
    fn the_retained_wal_is_the_servers_end_past_the_position_to_confirm() {
        let mut p = Progress::new(Lsn(1000));
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
        let mut p = Progress::new(Lsn(0));
        let first = p.begin(Lsn(500)).expect("begin");
        if let Begun::At(at) = first {
            p.commit(at, Lsn(520), 4);
        }
        // Sent again within the run (a seek, a reconnect).
        assert_eq!(p.begin(Lsn(500)).expect("again"), first);
        // Confirmed transactions are skipped when sent again.
        assert!(p.delivered(504));
        assert_eq!(p.begin(Lsn(500)).expect("again"), Begun::Confirmed);
    }

    #[test]
    fn keepalives_confirm_only_when_nothing_is_unconfirmed() {
        let mut p = Progress::new(Lsn(10));
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

    #[test]
    fn keepalives_confirm_no_position_below_the_offsets_given() {
        let mut p = Progress::new(Lsn(10));
        let at = begun(&mut p, 50);
        p.commit(at, Lsn(60), 100);
        assert!(p.delivered(at + 100));
        // Its commit record ends below its offsets: a transaction
        // committing at 60 would take offsets from 150 on, not from 60.
        assert_eq!(p.flushed(), Lsn(50));
        assert!(!p.idle(Lsn(120)), "the offsets given reach 149");
        assert_eq!(p.flushed(), Lsn(50));
        assert!(p.idle(Lsn(150)));
        assert_eq!(p.flushed(), Lsn(150));
        // Still anchored after the keepalive: the next takes its commit LSN.
        assert_eq!(begun(&mut p, 160), 160);
    }

    #[test]
    fn a_snapshot_below_its_consistent_point_leaves_the_stream_anchored() {
        let mut p = Progress::new(Lsn(0));
        // An exactly-once sink holds offsets below 300 (rows of a snapshot
        // interrupted earlier): the new snapshot's rows start above them.
        p.stored_progress(300);
        let first = p.snapshot_start(120);
        assert_eq!(first, 300);
        p.snapshot_end(first + 500);
        // The slot starts at the consistent point, above the rows.
        p.server_confirmed(Lsn(4096));
        assert_eq!(begun(&mut p, 4200), 4200, "the first change is anchored");
    }

    #[test]
    fn a_transaction_read_and_not_delivered_counts_as_retained_from_its_first_change() {
        let mut p = Progress::new(Lsn(1000));
        let Ok(Begun::At(at)) = p.begin_at(Lsn(9000), Lsn(1100)) else {
            panic!("a new transaction")
        };
        p.server_end(Lsn(9100));
        p.commit(at, Lsn(9040), 500);
        // Nothing before it undelivered: the slot may go to its commit,
        // but a restart decodes it again from its first change.
        assert!(p.delivered(0));
        assert_eq!(p.flushed(), Lsn(9000));
        assert_eq!(p.retained(), 8000);
        // Delivered, but its offsets run past its commit record: the slot
        // stays at its commit, and a restart decodes it again.
        assert!(!p.delivered(at + 500));
        assert_eq!(p.retained(), 8000);
        // A keepalive past its offsets: nothing retained.
        assert!(p.idle(Lsn(9600)));
        assert_eq!(p.retained(), 0);
    }
}
