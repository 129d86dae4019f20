//! The crate's error type.

use std::path::PathBuf;

use etl_record::{Offset, PartitionId};

/// Everything that can go wrong in a source or the source driver. Each
/// variant names what it concerns (a path, a partition, an offset).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// A file could not be opened, read or positioned.
    #[error("{path}: {source}")]
    Io {
        /// The file concerned.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// An input is not a regular file (a FIFO, a socket, a device, a
    /// directory): it could not be read again from a committed offset,
    /// and opening a FIFO would block until a writer appears.
    #[error("{path} is {kind}; the file source reads regular files only")]
    NotAFile {
        /// The input concerned.
        path: PathBuf,
        /// What it is instead.
        kind: &'static str,
    },
    /// An input file was replaced or rewritten since its offsets were
    /// committed, and the source is configured to stop rather than read
    /// it as a new file.
    #[error("{path} (partition {partition}) changed: {reason}; refusing to read it as configured")]
    InputReplaced {
        /// The file concerned.
        path: PathBuf,
        /// The partition its committed offsets belong to.
        partition: PartitionId,
        /// What changed.
        reason: String,
    },
    /// The file source's record of its inputs (in the state folder) cannot
    /// be read.
    #[error("{path}: unreadable record of the input files: {detail}")]
    State {
        /// The registry file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// A glob pattern is malformed.
    #[error("invalid glob pattern {pattern:?}: {reason}")]
    Pattern {
        /// The pattern as given.
        pattern: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A glob pattern matched no file (an input that names nothing is a
    /// configuration mistake, not an empty source).
    #[error("glob pattern {pattern:?} matched no files")]
    NoMatch {
        /// The pattern as given.
        pattern: String,
    },
    /// Two input files map to the same partition id. The file source no
    /// longer returns it: it allocates ids so that no two files share one.
    #[error(
        "input files {first} and {second} both map to partition {partition}; \
         rename or move one of them"
    )]
    PartitionCollision {
        /// The partition id they share.
        partition: PartitionId,
        /// The file that took the id first.
        first: PathBuf,
        /// The file that collided with it.
        second: PathBuf,
    },
    /// A source was asked about a partition it does not serve.
    #[error("partition {partition} is not served by this source")]
    UnknownPartition {
        /// The partition asked for.
        partition: PartitionId,
    },
    /// A configuration value is out of range.
    #[error("invalid source configuration: {0}")]
    Config(String),
    /// A source broke the implementor contract (for example offsets going
    /// backwards within a batch, or a batch of an unassigned partition).
    #[error("source contract violated on partition {partition}: {reason}")]
    Contract {
        /// The partition concerned.
        partition: PartitionId,
        /// What the source did wrong.
        reason: String,
    },
    /// A record failed every replay and the poison policy is to halt.
    #[error(
        "poison record at partition {partition} offset {offset}: failed {replays} replays; \
         halting as configured"
    )]
    Poison {
        /// The record's partition.
        partition: PartitionId,
        /// The record's offset.
        offset: Offset,
        /// How many times it was replayed alone before giving up.
        replays: u32,
    },
    /// Downstream dropped its receiver: nobody consumes the source's output.
    #[error("the downstream channel is closed")]
    DownstreamClosed,
    /// The acknowledgement receiver is gone (the checkpointer stopped), so
    /// no batch can be opened any more.
    #[error("cannot open batch of partition {partition}: the checkpointer is gone")]
    CheckpointerGone {
        /// The partition whose batch could not be opened.
        partition: PartitionId,
    },
    /// The checkpointer failed or stopped (assign, revoke or commit).
    #[error(transparent)]
    Checkpoint(#[from] etl_checkpoint::CheckpointError),
    /// An error of a user-written source, passed through unchanged.
    #[error(transparent)]
    Custom(Box<dyn std::error::Error + Send + Sync>),
}

impl SourceError {
    /// Wrap an error of a user-written source.
    pub fn custom(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        SourceError::Custom(error.into())
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        SourceError::Io {
            path: path.into(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_their_subject() {
        let e = SourceError::io(
            "/data/in.ndjson",
            std::io::Error::from(std::io::ErrorKind::NotFound),
        );
        assert!(e.to_string().starts_with("/data/in.ndjson: "));
        let e = SourceError::Poison {
            partition: PartitionId(3),
            offset: Offset(120),
            replays: 4,
        };
        let text = e.to_string();
        assert!(text.contains("partition 3") && text.contains("offset 120") && text.contains('4'));
        let e = SourceError::custom("broker unreachable");
        assert_eq!(e.to_string(), "broker unreachable");
    }
}
