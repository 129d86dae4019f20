//! Runs of stages that read each record once between them.
//!
//! A chain built from a configuration with declarative filters, filter
//! conditions and a `remap` step in a row (W1's `filter` then `remap`,
//! the nested job's `condition` then `remap`) would read each record once
//! per stage: check it, find its top-level entries, find the same nested
//! objects again. When every stage of such a run has a fast form, the run
//! reads the record once and evaluates the stages in order on that one
//! reading, each seeing the changes of the ones before.
//!
//! Invariant: a run decides a record only when every stage of it would
//! have been decided by its own fast path; anything else
//! ([`Steps::Fallback`]) runs the stages one by one, as if there were no
//! run, so outcomes, dead-letter reasons and stage names are the stages'
//! own.

use std::sync::Arc;

use super::remap_fast::{Arena, Step, Steps, run_steps};

/// Stages `start..start + len` of a chain, run together.
#[derive(Debug)]
pub(super) struct Run {
    /// The first stage of the run.
    pub(super) start: usize,
    /// How many stages it covers.
    pub(super) len: usize,
    steps: Arc<[Step]>,
    /// Whether records reaching the first stage are known to be valid
    /// JSON.
    checked: bool,
    arena: Arena,
}

impl Run {
    /// The run of `steps` starting at stage `start`.
    pub(super) fn new(start: usize, steps: Vec<Step>, checked: bool) -> Self {
        Run {
            start,
            len: steps.len(),
            steps: steps.into(),
            checked,
            arena: Arena::default(),
        }
    }

    /// The same run for another worker, with its own buffers.
    pub(super) fn fork(&self) -> Self {
        Run {
            start: self.start,
            len: self.len,
            steps: Arc::clone(&self.steps),
            checked: self.checked,
            arena: Arena::default(),
        }
    }

    /// Run the stages on one record's value.
    pub(super) fn apply(&mut self, value: &[u8]) -> Steps {
        run_steps(&self.steps, value, &mut self.arena, self.checked)
    }
}
