//! The source's offset and confirmation rule (`progress.rs`), for the
//! whole-pipeline simulation (`tests/tests/sim`): a simulated slot gives
//! its changes offsets and confirms positions through the rule the source
//! runs, not a copy of it. Behind the `testing` feature; not a stable
//! interface.

use crate::Lsn;
use crate::progress::{Begun, Progress};

/// What one source process knows of offsets and confirmations (see the
/// module docs of `progress.rs` and docs/postgres-cdc.md, "Offsets").
#[derive(Debug)]
pub struct SlotProgress(Progress);

impl SlotProgress {
    /// A process starts; nothing read yet.
    #[must_use]
    pub fn new() -> Self {
        SlotProgress(Progress::new(Lsn(0)))
    }

    /// The slot is confirmed at `lsn` on the server, as read when the
    /// stream (re)connects: the server sends the transactions whose
    /// commit LSN is at or after it.
    pub fn server_confirmed(&mut self, lsn: Lsn) {
        self.0.server_confirmed(lsn);
    }

    /// The server's end of WAL is at least `lsn` (every message's header).
    pub fn server_end(&mut self, lsn: Lsn) {
        self.0.server_end(lsn);
    }

    /// A transaction committing at `final_lsn` begins, its first change
    /// at `first_lsn`: the offset of its first change, or `None` when it
    /// is confirmed already and is skipped.
    ///
    /// # Errors
    ///
    /// A commit LSN beyond the offsets' range.
    pub fn begin(&mut self, final_lsn: Lsn, first_lsn: Lsn) -> Result<Option<i64>, String> {
        Ok(match self.0.begin_at(final_lsn, first_lsn)? {
            Begun::At(first) => Some(first),
            Begun::Confirmed => None,
        })
    }

    /// The transaction being read, whose first offset is `first`,
    /// committed with `changes` changes; its commit record ends at
    /// `end_lsn`.
    pub fn commit(&mut self, first: i64, end_lsn: Lsn, changes: i64) {
        self.0.commit(first, end_lsn, changes);
    }

    /// The checkpointer committed `offset`; whether the position to
    /// confirm moved.
    pub fn delivered(&mut self, offset: i64) -> bool {
        self.0.delivered(offset)
    }

    /// A keepalive: the server sent everything before `wal_end`, and no
    /// transaction is being read; whether the position to confirm moved.
    pub fn idle(&mut self, wal_end: Lsn) -> bool {
        self.0.idle(wal_end)
    }

    /// The position to confirm to the server.
    #[must_use]
    pub fn flushed(&self) -> Lsn {
        self.0.flushed()
    }

    /// The highest committed offset heard of.
    #[must_use]
    pub fn committed(&self) -> i64 {
        self.0.committed()
    }
}

impl Default for SlotProgress {
    fn default() -> Self {
        Self::new()
    }
}
