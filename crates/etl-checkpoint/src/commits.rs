//! Commits, revokes and shutdown on the checkpointer thread.
//!
//! Only watermarks are committed, and only once they pass the partition's
//! floor (its last commit, or where it started), so a commit never
//! regresses. A failed commit is logged, counted in the metrics and
//! returned to whoever asked; the previous commit stands and the next
//! commit retries, except after an I/O failure of the store
//! ([`CheckpointError::Io`]): that store is lost (every later commit
//! fails too), so the handles are told ([`CheckpointHandle::store_lost`])
//! and the run stops.
//!
//! [`CheckpointHandle::store_lost`]: crate::CheckpointHandle::store_lost

use std::time::Instant;

use etl_record::PartitionId;

use crate::CheckpointError;
use crate::handle::{CheckpointSummary, Reply};
use crate::store::PartitionOffsets;
use crate::sync::lock;
use crate::worker::{PendingRevoke, Worker};

/// What a pending revocation does on a pass of the checkpointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RevokeGate {
    /// Not yet: batches are in flight before the deadline, or a write is
    /// under way before it.
    Wait,
    /// The deadline passed with an exactly-once write under way: the run
    /// halts, and the revocation waits on until the write ended.
    Halt,
    /// Commit, drop the partitions and answer.
    Finish,
}

/// The revocation's decision, from `unresolved` (batches of its
/// partitions the checkpointer counts in flight), whether its deadline
/// passed and whether the fence has an exactly-once write of one of its
/// partitions under way ([`WriteFence::writing`]). Unless `force`d (a
/// shutdown), a write under way keeps the partitions whatever
/// `unresolved` is: a failure ends the epoch and forgets every batch of
/// it, while an earlier batch's write may still land.
///
/// [`WriteFence::writing`]: etl_ack::WriteFence::writing
pub(crate) fn revoke_gate(
    force: bool,
    unresolved: usize,
    past_deadline: bool,
    writing: bool,
) -> RevokeGate {
    if force {
        RevokeGate::Finish
    } else if writing {
        if past_deadline {
            RevokeGate::Halt
        } else {
            RevokeGate::Wait
        }
    } else if unresolved == 0 || past_deadline {
        RevokeGate::Finish
    } else {
        RevokeGate::Wait
    }
}

impl Worker {
    /// Begin revoking `partitions`; with `hand_over` (they go to another
    /// owner), close their epochs on the write fence.
    pub(crate) fn start_revoke(
        &mut self,
        partitions: Vec<PartitionId>,
        hand_over: bool,
        reply: Reply<PartitionOffsets>,
    ) {
        let mut known = Vec::with_capacity(partitions.len());
        for p in partitions {
            if let Some(state) = self.partitions.get_mut(&p) {
                state.revoking = true;
                // From now on no exactly-once write of this epoch (or an
                // earlier one) starts: not a queued batch, not a retry.
                if hand_over {
                    self.fence.close(p, state.tracker.epoch());
                }
                known.push((p, state.assignment));
            }
        }
        self.revokes.push(PendingRevoke {
            partitions: known,
            deadline: Instant::now() + self.config.revoke_deadline,
            reply,
            unsettled: None,
            writing: false,
        });
        self.finish_revokes(false);
    }

    /// The partitions of `revoke` still held by the assignment it names.
    fn revoked(&self, revoke: &[(PartitionId, u64)]) -> Vec<PartitionId> {
        revoke
            .iter()
            .filter(|(p, a)| self.partitions.get(p).is_some_and(|s| s.assignment == *a))
            .map(|(p, _)| *p)
            .collect()
    }

    pub(crate) fn unresolved(&self, partitions: &[PartitionId]) -> usize {
        partitions
            .iter()
            .filter_map(|p| self.partitions.get(p))
            .map(|s| s.tracker.unresolved())
            .sum()
    }

    /// Complete every revoke whose partitions have nothing in flight and
    /// no exactly-once write under way, whose deadline passed with no
    /// such write, or all of them with `force`: commit, end the epochs,
    /// release their credit, drop the state, reply. (See [`revoke_gate`].)
    pub(crate) fn finish_revokes(&mut self, force: bool) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.revokes.len() {
            let partitions = self.revoked(&self.revokes[i].partitions);
            let unresolved = self.unresolved(&partitions);
            // Asked whatever `unresolved` says: a failure ends the epoch
            // and forgets every batch of it, while an earlier batch's
            // write may still be under way.
            let writing: Vec<PartitionId> = if force {
                Vec::new()
            } else {
                partitions
                    .iter()
                    .copied()
                    .filter(|p| self.fence.writing(*p))
                    .collect()
            };
            let gate = revoke_gate(
                force,
                unresolved,
                now >= self.revokes[i].deadline,
                !writing.is_empty(),
            );
            self.revokes[i].writing = !writing.is_empty();
            match gate {
                RevokeGate::Wait => {
                    i += 1;
                    continue;
                }
                RevokeGate::Halt => {
                    self.halt_unsettled(i, writing);
                    i += 1;
                    continue;
                }
                RevokeGate::Finish => {}
            }
            let revoke = self.revokes.swap_remove(i);
            if unresolved > 0 {
                tracing::warn!(
                    partitions = ?partitions, unresolved,
                    "revoking with batches still in flight; committing the watermark they pin"
                );
            }
            let result = self.commit_partitions(&partitions).map(|_| {
                partitions
                    .iter()
                    .filter_map(|p| Some((*p, self.partitions.get(p)?.committed()?)))
                    .collect::<PartitionOffsets>()
            });
            for p in &partitions {
                if let Some(mut state) = self.partitions.remove(p) {
                    let release = state.tracker.end_epoch();
                    self.next_epoch
                        .insert(*p, state.tracker.epoch().wrapping_add(1));
                    self.budget.release_many(*p, release.batches, release.bytes);
                }
            }
            self.publish_metrics();
            let result = match revoke.unsettled {
                None => result,
                Some(partitions) => {
                    if let Err(e) = result {
                        tracing::error!(error = %e, "the commit of a revocation that halted the run failed");
                    }
                    Err(CheckpointError::RevokeUnsettled {
                        partitions,
                        deadline: self.config.revoke_deadline,
                    })
                }
            };
            let _ = revoke.reply.send(result);
        }
    }

    /// Revoke `i`'s deadline passed with an exactly-once write of
    /// `writing` under way. The first time, the run halts: the write must
    /// end (the halt tears it down) before the partitions are handed to
    /// another owner, or it could land after the new owner's first write
    /// and set its progress back.
    fn halt_unsettled(&mut self, i: usize, writing: Vec<PartitionId>) {
        if self.revokes[i].unsettled.is_some() {
            return;
        }
        tracing::error!(
            partitions = ?writing, deadline = ?self.config.revoke_deadline,
            "revoke deadline passed with an exactly-once write of the revoked partitions under way; halting the run rather than handing them over while it can land"
        );
        self.halting.record();
        self.unsettled_tx
            .send_replace(Some((writing.clone(), self.config.revoke_deadline)));
        self.revokes[i].unsettled = Some(writing);
    }

    /// Commit the watermarks of `partitions` that moved past their floor;
    /// returns what was committed.
    pub(crate) fn commit_partitions(
        &mut self,
        partitions: &[PartitionId],
    ) -> Result<PartitionOffsets, CheckpointError> {
        let mut moved = PartitionOffsets::new();
        for p in partitions {
            if let Some(state) = self.partitions.get(p) {
                let w = state.tracker.watermark();
                if w > state.floor {
                    moved.insert(*p, w);
                }
            }
        }
        if moved.is_empty() {
            return Ok(moved);
        }
        // A lost store is not asked again: a failed write or fsync
        // retried can report success for data that never reached the disk.
        let result = match self.lost_error("an earlier commit failed") {
            Some(lost) => Err(lost),
            None => self.store.commit(&moved),
        };
        match result {
            Ok(()) => {
                for (p, o) in &moved {
                    if let Some(state) = self.partitions.get_mut(p) {
                        state.set_committed(*o);
                    }
                }
                self.commits += 1;
                self.last_commit_error = None;
                tracing::debug!(offsets = ?moved, "committed");
                Ok(moved)
            }
            Err(e) => {
                tracing::error!(offsets = ?moved, error = %e, "commit failed; the previous commit stands");
                self.commit_errors += 1;
                self.last_commit_error = Some(e.to_string());
                if let CheckpointError::Io { path, op, source } = &e
                    && self.lost.is_none()
                {
                    self.lost = Some((path.clone(), *op, source.kind(), source.to_string()));
                    self.lost_tx.send_replace(true);
                }
                Err(CheckpointError::Commit {
                    partitions: moved.keys().copied().collect(),
                    source: Box::new(e),
                })
            }
        }
    }

    /// The error of a lost store (see [`Worker::lost`]), saying `what`.
    fn lost_error(&self, what: &str) -> Option<CheckpointError> {
        let (path, op, kind, reason) = self.lost.as_ref()?;
        Some(CheckpointError::Io {
            path: path.clone(),
            op,
            source: std::io::Error::new(
                *kind,
                format!("{what}, and the store is lost since: {reason}"),
            ),
        })
    }

    /// Commit every assigned partition's moved watermark.
    pub(crate) fn commit_moved(&mut self) -> Result<PartitionOffsets, CheckpointError> {
        self.last_commit = Instant::now();
        let all: Vec<PartitionId> = self.partitions.keys().copied().collect();
        self.commit_partitions(&all)
    }

    /// Finish a requested shutdown once nothing is in flight or its
    /// deadline passed: then the thread stops, and answers the caller
    /// with what this returns once the worker (its store included) is
    /// dropped.
    pub(crate) fn try_finish_shutdown(&mut self) -> Option<ShutdownAnswer> {
        let Some((deadline, _)) = &self.shutdown else {
            return None;
        };
        let all: Vec<PartitionId> = self.partitions.keys().copied().collect();
        let unresolved = self.unresolved(&all);
        if unresolved > 0 && Instant::now() < *deadline {
            return None;
        }
        if unresolved > 0 {
            tracing::warn!(
                unresolved,
                "shutdown deadline passed with batches in flight; committing the watermarks they pin"
            );
        }
        self.finish_revokes(true);
        // With nothing left to commit, the last commit attempt decides: a
        // revocation whose commit failed (a Kafka group that dropped this
        // member while its broker was down) leaves nothing moved, yet the
        // run's work is not committed, and the run must not end as if it
        // were.
        let result = self.commit_moved().and_then(|moved| {
            match (&self.last_commit_error, moved.is_empty()) {
                // A lost store's failure stays an I/O error to the end.
                (Some(_), true) if self.lost.is_some() => Err(self
                    .lost_error("the last commit failed and nothing committed since")
                    .unwrap_or(CheckpointError::Stopped)),
                (Some(e), true) => Err(CheckpointError::Store(
                    format!("the last commit failed and nothing committed since: {e}").into(),
                )),
                _ => Ok(moved),
            }
        });
        self.publish_metrics();
        let summary = result.map(|_| CheckpointSummary {
            committed: self
                .partitions
                .iter()
                .filter_map(|(p, s)| s.committed().map(|c| (*p, c)))
                .collect(),
            timed_out: unresolved > 0,
            metrics: lock(&self.metrics).to_metrics(),
        });
        Some(ShutdownAnswer {
            reply: self.shutdown.take().map(|(_, reply)| reply),
            summary,
        })
    }
}

/// The answer to a shutdown request, sent once the worker is gone.
pub(crate) struct ShutdownAnswer {
    reply: Option<Reply<CheckpointSummary>>,
    summary: Result<CheckpointSummary, CheckpointError>,
}

impl ShutdownAnswer {
    pub(crate) fn send(self) {
        if let Some(reply) = self.reply {
            let _ = reply.send(self.summary);
        }
    }
}
