//! The crate's error type.

use std::path::PathBuf;

use etl_record::PartitionId;

/// What can go wrong in checkpointing. More kinds may be added in a
/// minor version: a `match` needs a wildcard arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// An I/O error on an offset store file.
    #[error("offset store {}: {op}: {source}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The cause.
        source: std::io::Error,
    },
    /// Store files exist but none holds a valid generation.
    #[error(
        "offset store {} has no valid generation ({detail}); refusing to restart from zero — \
         inspect the files, then write a new generation for the partitions you name \
         (`etl offsets reset CONFIG --partition ID --to OFFSET`)",
        path.display()
    )]
    Corrupt {
        /// The store's folder.
        path: PathBuf,
        /// What was wrong with each file.
        detail: String,
    },
    /// The store's lock cannot be taken: another pipeline owns the store
    /// ([`LockError::InUse`](etl_record::LockError::InUse), naming the
    /// holder's process id), or the lock file cannot be used.
    #[error("offset store: {0}")]
    Lock(#[from] etl_record::LockError),
    /// A store of another kind failed (e.g. a consumer group commit).
    #[error("offset store: {0}")]
    Store(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A commit failed; the previous commit stands.
    #[error("commit of partitions {} failed: {source}", list(partitions))]
    Commit {
        /// The partitions that were being committed.
        partitions: Vec<PartitionId>,
        /// The cause.
        #[source]
        source: Box<CheckpointError>,
    },
    /// A revocation's `revoke_deadline` passed while an exactly-once
    /// sink was still writing a batch of a revoked partition: handing the
    /// partition over then would let that write land after the next
    /// owner's, so the run halts instead.
    #[error(
        "the revocation of partitions {} passed its revoke_deadline ({deadline:?}) \
         with an exactly-once write of them still under way; the run halts rather than hand \
         them to another owner while that write can land (the next run starts from the \
         sink's stored progress)",
        list(partitions)
    )]
    RevokeUnsettled {
        /// The revoked partitions with a write under way.
        partitions: Vec<PartitionId>,
        /// The revoke deadline that passed.
        deadline: std::time::Duration,
    },
    /// The checkpointer thread is gone (shut down or panicked).
    #[error("the checkpointer has stopped")]
    Stopped,
    /// The checkpointer thread could not be started.
    #[error("cannot start the checkpointer thread: {0}")]
    Spawn(#[source] std::io::Error),
}

/// Partitions as the user reads them: `3, 12`.
fn list(partitions: &[PartitionId]) -> String {
    partitions
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(all(test, not(etl_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_revocation_that_halted_names_its_partitions_as_the_user_reads_them() {
        let err = CheckpointError::RevokeUnsettled {
            partitions: vec![PartitionId(3), PartitionId(12)],
            deadline: std::time::Duration::from_secs(10),
        };
        let text = err.to_string();
        assert!(text.contains("partitions 3, 12 "), "{text}");
        assert!(!text.contains("PartitionId"), "{text}");
        assert!(text.contains("revoke_deadline (10s)"), "{text}");
    }
}
