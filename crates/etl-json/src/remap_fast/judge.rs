//! Several conditions judged on one reading of a record: the fast forms
//! behind [`Conditions`](crate::Conditions).
//!
//! Each condition is judged as its own stage's fast path would judge it
//! (a fused JSON stage of filters as [`Step::Filters`](super::Step), a
//! filter `condition` as [`LiteProgram::run`] without writing), on the
//! record as read: what one condition's program assigns or deletes is
//! forgotten before the next is judged.
//!
//! Declarative filters alone need less than a program: the values of
//! the few top-level fields their paths start with. Such a reading
//! ([`Fields`]) reads the record's top level with the validating reader,
//! which refuses what the checked reading's searches of the whole text
//! refuse (a number past an `f64`, a surrogate escape) at less cost than
//! the scanner and those searches together, and keeps those values
//! only. A field's number is read once for the filters that compare it
//! one after the other, each against its constant as read when the
//! filter was made: several thresholds on one field (routes by amount)
//! cost one reading of its number.

use std::sync::Arc;

use vrl::value::Value;

use super::{Arena, Cx, JsonFilter, LiteProgram, Spare, Stop, Val, last_of};
use crate::conditions::Verdict;
use crate::{check, number, scan};

/// The fast form of one condition.
#[derive(Debug, Clone)]
pub(crate) enum Form {
    /// Declarative filters: the condition holds when every one does.
    Filters(Vec<JsonFilter>),
    /// A filter `condition`: it holds when the program gives `true`.
    Program(Arc<LiteProgram>),
}

/// The most top-level fields a [`Fields`] reading keeps; conditions
/// naming more are read as programs are.
const MAX_FIELDS: usize = 8;

/// The top-level fields that declarative filters read, when every fast
/// form is one and they name at most [`MAX_FIELDS`] fields: a reading
/// then keeps only their values.
#[derive(Debug, Clone)]
pub(crate) struct Fields {
    keys: Vec<String>,
}

impl Fields {
    /// The fields `forms` read, when they are all declarative filters
    /// naming few enough fields.
    pub(crate) fn of<'f>(forms: impl IntoIterator<Item = &'f Form>) -> Option<Fields> {
        let mut keys: Vec<String> = Vec::new();
        for form in forms {
            let Form::Filters(filters) = form else {
                return None;
            };
            for filter in filters {
                let first = filter.path.first()?;
                if !keys.contains(first) {
                    keys.push(first.clone());
                }
            }
        }
        (keys.len() <= MAX_FIELDS).then_some(Fields { keys })
    }
}

/// One record, read once, for judging conditions on it. A program's
/// reading gives its vectors back to the spare ones when it is dropped.
pub(crate) struct Reading<'a> {
    how: How<'a>,
}

/// How the record was read.
enum How<'a> {
    /// As a program reads it: its top level, nested objects as reached.
    Program {
        cx: Option<Cx<'a>>,
        spare: &'a mut Spare,
    },
    /// The values of the top-level fields `keys` (the last of each, as
    /// the stages read duplicates), `None` where the record has none;
    /// and the number of the field a filter last compared (its index in
    /// `keys`), kept for the next filter on that field.
    Fields {
        keys: &'a [String],
        values: [Option<&'a str>; MAX_FIELDS],
        number: (usize, Number),
    },
}

/// A field's value as a number, read once while the filters compare that
/// field: several thresholds on one field (a router's routes by amount)
/// compare one reading.
#[derive(Debug, Clone, Copy)]
enum Number {
    Unread,
    /// Not a number [`number::read`] reads: the filter reads the text.
    Not,
    Is(number::Read),
}

impl std::fmt::Debug for Reading<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.how {
            How::Program { cx, .. } => f
                .debug_struct("Reading")
                .field("doc", &cx.as_ref().map(|cx| cx.doc))
                .finish_non_exhaustive(),
            How::Fields { keys, values, .. } => f
                .debug_struct("Reading")
                .field("keys", keys)
                .field("values", values)
                .finish_non_exhaustive(),
        }
    }
}

impl<'a> Reading<'a> {
    /// Read `input`'s top level (and, unless `checked`, check all of it);
    /// `None` for what the fast path leaves to the conditions' own stages
    /// (see [`LiteProgram::run`]). With `fields` (every condition a
    /// declarative filter), only those fields are kept, checked or not.
    pub(crate) fn open(
        input: &'a [u8],
        checked: bool,
        fields: Option<&'a Fields>,
        arena: &'a mut Arena,
    ) -> Option<Self> {
        let spare = &mut arena.spare;
        if let Some(fields) = fields {
            return Self::fields(input, &fields.keys, spare);
        }
        let cx = Cx::open(input, checked, spare)?;
        Some(Reading {
            how: How::Program {
                cx: Some(cx),
                spare,
            },
        })
    }

    /// The values of the top-level fields `keys` of `input`, refused as
    /// [`Cx::open`] refuses input it checks (and so anything it refuses
    /// on checked input); `spare` lends the entries' vector.
    fn fields(input: &'a [u8], keys: &'a [String], spare: &mut Spare) -> Option<Self> {
        let doc = simdutf8::basic::from_utf8(input).ok()?;
        let top = check::entries_in(doc, std::mem::take(&mut spare.top))?;
        let mut values = [None; MAX_FIELDS];
        for (value, key) in values.iter_mut().zip(keys) {
            *value = last_of(&top, key).ok()?;
        }
        spare.top = scan::recycle(top);
        Some(Reading {
            how: How::Fields {
                keys,
                values,
                number: (0, Number::Unread),
            },
        })
    }

    /// Whether the condition holds for the record as read; `None` when
    /// its fast form cannot say.
    pub(crate) fn holds(&mut self, form: &'a Form) -> Option<bool> {
        let held = match &mut self.how {
            How::Program { cx, .. } => {
                let cx = cx.as_mut()?;
                // Another condition's assignments are not this one's record.
                cx.overlay.0.clear();
                match form {
                    Form::Filters(filters) => filters
                        .iter()
                        .try_fold(true, |all, f| Ok::<_, Stop>(all && cx.json_filter(f)?)),
                    Form::Program(program) => match cx.program(program).and_then(Val::into_value) {
                        Ok(Value::Boolean(b)) => Ok(b),
                        Ok(_) => Ok(false),
                        Err(e) => Err(e),
                    },
                }
            }
            How::Fields {
                keys,
                values,
                number,
            } => {
                let Form::Filters(filters) = form else {
                    return None;
                };
                filters.iter().try_fold(true, |all, f| {
                    let first = f.path.first().ok_or(Stop::Fallback)?;
                    let at = keys.iter().position(|k| k == first).ok_or(Stop::Fallback)?;
                    let top = *values.get(at).ok_or(Stop::Fallback)?;
                    if !all {
                        return Ok(false);
                    }
                    // A top-level field's number, read once for every
                    // filter comparing it; anything else as the stage.
                    if let (Some(text), [_]) = (top, f.path.as_slice()) {
                        if number.0 != at || matches!(number.1, Number::Unread) {
                            let read = number::read(text).map_or(Number::Not, Number::Is);
                            *number = (at, read);
                        }
                        if let Number::Is(n) = number.1 {
                            return Ok(n.passes(f.op, &f.constant));
                        }
                    }
                    super::filter_on(top, f)
                })
            }
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
        if let How::Program { cx, spare } = &mut self.how
            && let Some(cx) = cx.take()
        {
            cx.close(spare);
        }
    }
}

/// The declarative filters among a router's conditions, as a run of
/// steps judges them on the records it keeps (see [`judge_written`]):
/// the top-level fields they name, each read once for all of them.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// The top-level fields the filters start with.
    keys: Vec<String>,
    /// The conditions judged, in order.
    conditions: Vec<Planned>,
}

/// A condition of declarative filters in a [`Plan`].
#[derive(Debug, Clone)]
struct Planned {
    /// Its index among the conditions.
    index: usize,
    /// The fields its filters name: bit `k` for the plan's `keys[k]`.
    fields: u32,
    /// Its filters, each with the index of its field in the plan's keys.
    filters: Vec<(usize, JsonFilter)>,
}

impl Plan {
    /// The plan of `forms`, one per condition; `None` when there is no
    /// declarative filter among them, more than [`Verdict::MAX`]
    /// conditions, or more than [`MAX_FIELDS`] fields.
    pub(crate) fn of(forms: &[Option<Form>]) -> Option<Plan> {
        if forms.len() > Verdict::MAX {
            return None;
        }
        let mut keys: Vec<String> = Vec::new();
        let mut conditions = Vec::new();
        for (index, form) in forms.iter().enumerate() {
            let Some(Form::Filters(filters)) = form else {
                continue;
            };
            let mut planned = Planned {
                index,
                fields: 0,
                filters: Vec::with_capacity(filters.len()),
            };
            for filter in filters {
                let first = filter.path.first()?;
                let at = match keys.iter().position(|k| k == first) {
                    Some(at) => at,
                    None => {
                        keys.push(first.clone());
                        keys.len() - 1
                    }
                };
                if at >= MAX_FIELDS {
                    return None;
                }
                planned.fields |= 1 << at;
                planned.filters.push((at, filter.clone()));
            }
            conditions.push(planned);
        }
        (!conditions.is_empty()).then_some(Plan { keys, conditions })
    }
}

/// The verdicts of `plan`'s conditions on the record a run of steps has
/// just kept, as the conditions' own stages would judge the record it
/// wrote. Only declarative filters on top-level fields the programs
/// left alone are judged: the writer copies such a field's last value
/// as read and writes no other of its name, so the record written has
/// the value read. Each filter is judged as [`Reading::holds`] judges
/// it on a record as read, a top-level number read once for the run's
/// own filters and these ([`Cx::number`]). A condition on a field a
/// program assigned, deleted or changed inside, or a filter the fast
/// path leaves to the stage, is left unjudged.
pub(super) fn judge_written(cx: &Cx<'_>, plan: &Plan) -> Verdict {
    let mut verdict = Verdict::default();
    // Per field: its last value as read (`None`: the record has none),
    // unless a program changed it (its bit in `changed`).
    let mut values: [Option<&str>; MAX_FIELDS] = [None; MAX_FIELDS];
    let mut changed = 0u32;
    for (at, (value, key)) in values.iter_mut().zip(&plan.keys).enumerate() {
        if cx.overlay.get(key).is_some() {
            changed |= 1 << at;
            continue;
        }
        match last_of(&cx.top, key) {
            Ok(last) => *value = last,
            // A key that does not decode: left to the stage too.
            Err(_) => changed |= 1 << at,
        }
    }
    'conditions: for condition in &plan.conditions {
        // A field changed leaves the condition to its stage, whatever
        // the other filters say.
        if condition.fields & changed != 0 {
            continue;
        }
        let mut held = true;
        for (at, f) in &condition.filters {
            let top = values.get(*at).copied().flatten();
            // A top-level number is read once for the run's filters and
            // these (see `Cx::number`).
            let passes = match (top, f.path.as_slice()) {
                (Some(text), [_]) => match cx.number(text) {
                    Some(n) => Ok(n.passes(f.op, &f.constant)),
                    None => super::filter_on(top, f),
                },
                _ => super::filter_on(top, f),
            };
            match passes {
                Ok(true) => {}
                // As the condition's stage: `abort` filters the record.
                Ok(false) | Err(Stop::Abort) => {
                    held = false;
                    break;
                }
                Err(Stop::Fallback) => continue 'conditions,
            }
        }
        verdict.set(condition.index, held);
    }
    verdict
}
