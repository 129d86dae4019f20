//! The runtime's error type.

use etl_record::IdempotencyKey;

/// Why a pipeline could not be built or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The pipeline is missing a part or has contradictory parts.
    #[error("invalid pipeline: {0}")]
    Invalid(String),
    /// The source or its driver failed.
    #[error(transparent)]
    Source(#[from] etl_source::SourceError),
    /// A sink failed for good.
    #[error("sink {name:?}: {source}")]
    Sink {
        /// The sink's name.
        name: String,
        /// The cause.
        #[source]
        source: etl_sink::SinkDriverError,
    },
    /// The checkpointer or the offset store failed.
    #[error(transparent)]
    Checkpoint(#[from] etl_checkpoint::CheckpointError),
    /// A record had to be dead-lettered and no dead-letter sink is set.
    #[error(
        "record {key} must go to the dead-letter path ({reason}), but no [dead_letter] sink is configured"
    )]
    NoDeadLetterSink {
        /// The record's identity.
        key: IdempotencyKey,
        /// Why it was set aside.
        reason: String,
    },
    /// A transform halted on a record (a `remap` step with
    /// `drop_on_error = false` met a runtime error).
    #[error("record {key}: {reason}; the step halts on errors, so the run stopped")]
    TransformHalted {
        /// The record's identity.
        key: IdempotencyKey,
        /// The step and its error.
        reason: String,
    },
    /// A batch failed and the delivery policy says halt.
    #[error(
        "a batch of partition {partition} failed (offsets from {from}) and on_failure = \"halt\"; \
         nothing past offset {from} was committed"
    )]
    Halted {
        /// The partition.
        partition: etl_record::PartitionId,
        /// Its watermark: everything below was delivered and committed.
        from: etl_record::Offset,
    },
    /// A graceful stop did not finish within `shutdown_timeout`: these
    /// parts were torn down, and what they held failed (it is read again
    /// on the next run). Nothing past the last commit counts as
    /// delivered.
    #[error(
        "the graceful stop did not finish within shutdown_timeout ({}): {parts} stopped \
         by force; records they held were not committed and will be read again",
        humantime::format_duration(*timeout)
    )]
    ShutdownTimeout {
        /// The parts that had to be torn down.
        parts: String,
        /// The timeout.
        timeout: std::time::Duration,
    },
    /// The run's last commit failed or did not finish: the offset store
    /// holds an earlier commit, so records delivered since are read again
    /// on the next run.
    #[error("final commit: {0}; the previous commit stands and later records will be read again")]
    FinalCommit(String),
    /// A connector failed to start.
    #[error("{0}")]
    Connector(Box<dyn std::error::Error + Send + Sync>),
    /// A task of the runtime panicked.
    #[error("internal error: {0}")]
    Internal(String),
}
