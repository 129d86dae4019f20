//! What the pipeline does once a batch fails: replay its partition from
//! the watermark, or halt.

/// What happens after a batch fails (`[delivery] on_failure` in a
/// configuration file: `"replay"` or `"halt"`; taken by
/// `etl::PipelineBuilder::on_failure`).
///
/// A failed batch pins its partition's watermark either way; the policy
/// says whether the checkpointer's [`ReplayRequest`](crate::ReplayRequest)
/// is followed or ends the run
/// ([`CheckpointHandle::halt_on_failure`](crate::CheckpointHandle::halt_on_failure)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum FailurePolicy {
    /// Replay the partition from its watermark.
    #[default]
    Replay,
    /// Stop the pipeline with an error.
    Halt,
}
