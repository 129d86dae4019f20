//! Conditions judged on one reading of each record.
//!
//! A router asks every record several questions: which sinks' conditions
//! it matches. Run as stages of their own, the conditions would read the
//! record once each (check it, find its top-level entries, parse the
//! field). [`Conditions`] holds the fast forms of such conditions, and
//! judges them on one reading of the record: read lazily, at the first
//! condition with a fast form, and kept for the others.
//!
//! The steps that wrote the record can do better than one reading: a
//! fused run at the end of the shared steps, asked with
//! [`Conditions::judge_in`], judges the declarative conditions while it
//! holds its own reading of the record, and hands each kept record's
//! verdicts on with its bytes ([`Verdicts`]); the router reads a record
//! only for what they leave out.
//!
//! Invariant: a condition is judged here only when its own stage's fast
//! path would have judged the record, with the same result;
//! [`Judging::holds`] says `None` for anything else (a condition without
//! a fast form, a record the fast path does not read, a value it does not
//! handle), and the caller runs that condition's own stage on the record,
//! as if there were no one reading.

use bytes::Bytes;
use etl_transform::Transform;

#[cfg(feature = "remap")]
use crate::remap_fast::Arena;
#[cfg(feature = "remap")]
use crate::remap_fast::judge::{Fields, Form, Reading};

/// Without the `remap` feature no condition has a fast form here.
#[cfg(not(feature = "remap"))]
#[derive(Debug, Clone)]
enum Form {}

/// The fast form of one condition (see [`Conditions`]).
#[derive(Debug, Clone)]
pub struct Condition {
    form: Form,
    checked: bool,
}

impl Condition {
    /// The fast form of a JSON stage used as a condition (it holds for a
    /// record the stage keeps): `None` unless the stage has filters only,
    /// all on the fast path (and the `remap` feature is on).
    #[must_use]
    pub fn json(stage: &crate::JsonStage) -> Option<Condition> {
        #[cfg(feature = "remap")]
        {
            stage.filters().map(|filters| Condition {
                form: Form::Filters(filters),
                checked: false,
            })
        }
        #[cfg(not(feature = "remap"))]
        {
            let _ = stage;
            None
        }
    }

    /// The fast form of a filter `condition` (it holds when the program
    /// gives `true`), when the program has one.
    #[cfg(feature = "remap")]
    #[must_use]
    pub fn program(program: &crate::VrlProgram) -> Option<Condition> {
        program.lite().map(|lite| Condition {
            form: Form::Program(lite),
            checked: false,
        })
    }

    /// Whether the records it judges are known to be valid JSON (they
    /// come out of steps that keep only JSON and write JSON), so that
    /// reading them need not check them again. Off by default.
    #[must_use]
    pub fn checked_input(mut self, checked: bool) -> Self {
        self.checked = checked;
        self
    }
}

/// Conditions, each with or without a fast form, judged on one reading
/// of each record.
///
/// ```
/// use etl_json::{CompareOp, Condition, Conditions, JsonOp, JsonStage};
///
/// let below = |limit: i64| {
///     let op = JsonOp::Filter {
///         path: JsonOp::path("amount"),
///         op: CompareOp::Lt,
///         value: limit.into(),
///     };
///     Condition::json(&JsonStage::new("when", vec![op]))
/// };
/// // Records not known to be valid JSON: the reading checks them.
/// let mut conditions = Conditions::new([below(100), None, below(500)]);
/// let mut judging = conditions.read(br#"{"id":7,"amount":250}"#);
/// # if cfg!(feature = "remap") {
/// assert_eq!(judging.holds(0), Some(false));
/// assert_eq!(judging.holds(2), Some(true));
/// # }
/// // No fast form: the condition's own stage judges it.
/// assert_eq!(judging.holds(1), None);
/// drop(judging);
/// // Not JSON: left to the conditions' own stages.
/// assert_eq!(conditions.read(b"{\"amount\":").holds(0), None);
/// ```
#[derive(Debug)]
pub struct Conditions {
    forms: Vec<Option<Form>>,
    checked: bool,
    /// The top-level fields the conditions read, when all of them are
    /// declarative filters: each record is then read for those alone.
    #[cfg(feature = "remap")]
    fields: Option<Fields>,
    #[cfg(feature = "remap")]
    arena: Arena,
}

impl Conditions {
    /// The conditions in order, `None` for one without a fast form. The
    /// one reading checks each record unless every condition with a fast
    /// form was told its input is checked
    /// ([`Condition::checked_input`]).
    #[must_use]
    pub fn new(conditions: impl IntoIterator<Item = Option<Condition>>) -> Self {
        let mut checked = true;
        let forms: Vec<Option<Form>> = conditions
            .into_iter()
            .map(|c| {
                c.map(|c| {
                    checked &= c.checked;
                    c.form
                })
            })
            .collect();
        Conditions {
            #[cfg(feature = "remap")]
            fields: Fields::of(forms.iter().flatten()),
            forms,
            checked,
            #[cfg(feature = "remap")]
            arena: Arena::default(),
        }
    }

    /// A copy for another worker, with its own buffers.
    #[must_use]
    pub fn fork(&self) -> Self {
        Conditions {
            forms: self.forms.clone(),
            checked: self.checked,
            #[cfg(feature = "remap")]
            fields: self.fields.clone(),
            #[cfg(feature = "remap")]
            arena: Arena::default(),
        }
    }

    /// Ask `stage`, the last of the steps whose output these conditions
    /// judge, to judge them on each record it keeps, as it wrote it, and
    /// to hand the verdicts on ([`Verdicts::take_from`]). Whether it
    /// will: only a fused run does (a `FusedRun`, with the `remap` feature),
    /// only the declarative filters among the conditions, and only for
    /// at most [`Verdict::MAX`] conditions naming few top-level fields.
    /// Asked again, it judges these instead.
    ///
    /// Once asked, the stage holds each kept record's bytes (a [`Bytes`]
    /// clone, pinning the buffer it was cut from) with its verdict until
    /// [`Verdicts::take_from`] takes them: take them after each batch.
    /// It holds at most [`Verdicts::MAX_HELD`]; a record kept past that
    /// gets no verdict and is judged by reading it.
    #[cfg_attr(not(feature = "remap"), allow(clippy::unused_self))]
    pub fn judge_in(&self, stage: &mut dyn Transform) -> bool {
        #[cfg(feature = "remap")]
        {
            let Some(run) = crate::fused::as_fused(stage) else {
                return false;
            };
            match crate::remap_fast::judge::Plan::of(&self.forms) {
                Some(plan) => {
                    run.judge(plan);
                    true
                }
                None => false,
            }
        }
        #[cfg(not(feature = "remap"))]
        {
            let _ = stage;
            false
        }
    }

    /// Whether any condition has a fast form.
    #[must_use]
    pub fn any_fast(&self) -> bool {
        self.forms.iter().any(Option::is_some)
    }

    /// Judge the conditions on `value`, read at most once.
    pub fn read<'s>(&'s mut self, value: &'s [u8]) -> Judging<'s> {
        Judging {
            #[cfg(feature = "remap")]
            forms: &self.forms,
            #[cfg(feature = "remap")]
            state: State::Unread {
                value,
                checked: self.checked,
                fields: self.fields.as_ref(),
                arena: &mut self.arena,
            },
            #[cfg(not(feature = "remap"))]
            _value: value,
        }
    }
}

/// Whether each of a record's conditions holds, as its own stage would
/// judge the record, for those judged: what a fused run hands on for a
/// record it kept (see [`Conditions::judge_in`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Bit `i`: condition `i` was judged.
    known: u64,
    /// Bit `i`: condition `i` holds.
    held: u64,
}

impl Verdict {
    /// The most conditions a verdict holds.
    pub const MAX: usize = 64;

    /// Whether condition `i` holds; `None` when it was not judged.
    #[must_use]
    pub fn holds(self, i: usize) -> Option<bool> {
        let bit = u32::try_from(i).ok().and_then(|i| 1u64.checked_shl(i))?;
        (self.known & bit != 0).then_some(self.held & bit != 0)
    }

    /// Whether no condition was judged.
    #[must_use]
    pub fn is_empty(self) -> bool {
        self.known == 0
    }

    /// Condition `i` judged: it holds or not (ignored past [`Verdict::MAX`]).
    #[cfg(feature = "remap")]
    pub(crate) fn set(&mut self, i: usize, held: bool) {
        let Some(bit) = u32::try_from(i).ok().and_then(|i| 1u64.checked_shl(i)) else {
            return;
        };
        self.known |= bit;
        if held {
            self.held |= bit;
        }
    }
}

/// The verdicts a fused run handed on, per record it kept, in order,
/// each with the record's value as the run wrote it.
///
/// A verdict is given to a record only when its value is those very
/// bytes: the same address and length as the value held here. Held, the
/// bytes cannot be freed, so no other value can be at that address, and
/// bytes shared by a [`Bytes`] are never changed: the record's value is
/// the text the verdict was judged on, whatever happened to the record
/// in between. A record without a verdict is judged as if there were
/// none (a record the run left to its stages, or one a later step
/// rewrote).
#[derive(Debug, Default)]
pub struct Verdicts {
    kept: Vec<(Bytes, Verdict)>,
    /// The first verdict not given yet.
    next: usize,
}

impl Verdicts {
    /// The most records a stage asked to judge holds verdicts for until
    /// they are taken ([`Verdicts::take_from`]); it gives none past it.
    pub const MAX_HELD: usize = 1 << 16;

    /// None yet.
    #[must_use]
    pub fn new() -> Self {
        Verdicts::default()
    }

    /// Take the verdicts `stage` gave since it last handed them on
    /// (nothing unless it was asked to judge, see
    /// [`Conditions::judge_in`]), dropping those held here.
    pub fn take_from(&mut self, stage: &mut dyn Transform) {
        self.clear();
        #[cfg(feature = "remap")]
        if let Some(run) = crate::fused::as_fused(stage) {
            run.hand_verdicts(&mut self.kept);
        }
        #[cfg(not(feature = "remap"))]
        let _ = stage;
    }

    /// The verdict on a record whose value is `value`, when it is the
    /// next one given and was judged on exactly these bytes (see
    /// [`Verdicts`]); `None` otherwise, and the next record is tried
    /// against the same verdict.
    pub fn of(&mut self, value: &Bytes) -> Option<Verdict> {
        let (held, verdict) = self.kept.get(self.next)?;
        if held.as_ptr() != value.as_ptr() || held.len() != value.len() {
            return None;
        }
        self.next += 1;
        Some(*verdict)
    }

    /// Drop the verdicts, keeping the allocation.
    pub fn clear(&mut self) {
        self.kept.clear();
        self.next = 0;
    }

    /// How many records have a verdict here.
    #[must_use]
    pub fn len(&self) -> usize {
        self.kept.len()
    }

    /// Whether no record has a verdict here.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }
}

/// One record being judged (see [`Conditions::read`]).
#[derive(Debug)]
pub struct Judging<'s> {
    #[cfg(feature = "remap")]
    forms: &'s [Option<Form>],
    #[cfg(feature = "remap")]
    state: State<'s>,
    #[cfg(not(feature = "remap"))]
    _value: &'s [u8],
}

/// Whether the record was read yet.
#[cfg(feature = "remap")]
#[derive(Debug)]
enum State<'s> {
    Unread {
        value: &'s [u8],
        checked: bool,
        fields: Option<&'s Fields>,
        arena: &'s mut Arena,
    },
    Read(Reading<'s>),
    /// The fast path does not read this record.
    Unreadable,
}

impl Judging<'_> {
    /// Whether condition `i` holds for the record, as its own stage
    /// would judge it; `None` when it is not judged here (no fast form,
    /// a record or a value the fast path leaves to the stage, no
    /// condition `i`): run the condition's stage.
    #[cfg_attr(not(feature = "remap"), allow(clippy::unused_self))]
    pub fn holds(&mut self, i: usize) -> Option<bool> {
        #[cfg(feature = "remap")]
        {
            let form = self.forms.get(i)?.as_ref()?;
            if let State::Unread { .. } = self.state {
                let State::Unread {
                    value,
                    checked,
                    fields,
                    arena,
                } = std::mem::replace(&mut self.state, State::Unreadable)
                else {
                    return None;
                };
                if let Some(reading) = Reading::open(value, checked, fields, arena) {
                    self.state = State::Read(reading);
                }
            }
            match &mut self.state {
                State::Read(reading) => reading.holds(form),
                State::Unread { .. } | State::Unreadable => None,
            }
        }
        #[cfg(not(feature = "remap"))]
        {
            let _ = i;
            None
        }
    }
}

#[cfg(all(test, feature = "remap"))]
mod tests;
