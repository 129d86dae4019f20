//! Conditions judged on one reading of each record.
//!
//! A router asks every record several questions: which sinks' conditions
//! it matches. Run as stages of their own, the conditions would read the
//! record once each (check it, find its top-level entries, parse the
//! field). [`Conditions`] holds the fast forms of such conditions, and
//! judges them on one reading of the record: read lazily, at the first
//! condition with a fast form, and kept for the others.
//!
//! Invariant: a condition is judged here only when its own stage's fast
//! path would have judged the record, with the same result;
//! [`Judging::holds`] says `None` for anything else (a condition without
//! a fast form, a record the fast path does not read, a value it does not
//! handle), and the caller runs that condition's own stage on the record,
//! as if there were no one reading.

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
