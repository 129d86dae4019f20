//! Several conditions judged on one reading of a record: the fast forms
//! behind [`Conditions`](crate::Conditions).
//!
//! Each condition is judged as its own stage's fast path would judge it
//! (a fused JSON stage of filters as [`Step::Filters`](super::Step), a
//! filter `condition` as [`LiteProgram::run`] without writing), on the
//! record as read: what one condition's program assigns or deletes is
//! forgotten before the next is judged.

use std::sync::Arc;

use vrl::value::Value;

use super::{Arena, Cx, JsonFilter, LiteProgram, Spare, Stop, Val};

/// The fast form of one condition.
#[derive(Debug, Clone)]
pub(crate) enum Form {
    /// Declarative filters: the condition holds when every one does.
    Filters(Vec<JsonFilter>),
    /// A filter `condition`: it holds when the program gives `true`.
    Program(Arc<LiteProgram>),
}

/// One record, read once, for judging conditions on it. Its vectors go
/// back to the spare ones when it is dropped.
pub(crate) struct Reading<'a> {
    cx: Option<Cx<'a>>,
    spare: &'a mut Spare,
}

impl std::fmt::Debug for Reading<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reading")
            .field("doc", &self.cx.as_ref().map(|cx| cx.doc))
            .finish_non_exhaustive()
    }
}

impl<'a> Reading<'a> {
    /// Read `input`'s top level (and, unless `checked`, check all of it);
    /// `None` for what the fast path leaves to the conditions' own stages
    /// (see [`LiteProgram::run`]).
    pub(crate) fn open(input: &'a [u8], checked: bool, arena: &'a mut Arena) -> Option<Self> {
        let spare = &mut arena.spare;
        let cx = Cx::open(input, checked, spare)?;
        Some(Reading {
            cx: Some(cx),
            spare,
        })
    }

    /// Whether the condition holds for the record as read; `None` when
    /// its fast form cannot say.
    pub(crate) fn holds(&mut self, form: &Form) -> Option<bool> {
        let cx = self.cx.as_mut()?;
        // Another condition's assignments are not this one's record.
        cx.overlay.0.clear();
        let held = match form {
            Form::Filters(filters) => filters
                .iter()
                .try_fold(true, |all, f| Ok::<_, Stop>(all && cx.json_filter(f)?)),
            Form::Program(program) => match cx.program(program).and_then(Val::into_value) {
                Ok(Value::Boolean(b)) => Ok(b),
                Ok(_) => Ok(false),
                Err(e) => Err(e),
            },
        };
        match held {
            Ok(held) => Some(held),
            // As the condition's stage: `abort` filters the record.
            Err(Stop::Abort) => Some(false),
            Err(Stop::Fallback) => None,
        }
    }
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        if let Some(cx) = self.cx.take() {
            cx.close(self.spare);
        }
    }
}
