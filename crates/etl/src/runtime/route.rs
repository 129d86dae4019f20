//! Routing: which sinks each record goes to, and the transforms of one
//! sink's branch.
//!
//! A sink's [`Route`] may hold a condition (`when`, a filter: a record it
//! keeps matches) and transforms of its own, run only on that sink's
//! copy after the shared ones. The [`RouteMode`] says how conditions
//! combine: with [`RouteMode::All`] a record goes to every sink whose
//! condition it matches (and to every sink without one); with
//! [`RouteMode::Exclusive`] it goes to the first sink, in the order they
//! were added, whose condition it matches (a sink without one matches
//! every record). The unmatched sink, if one is named, takes the records
//! no condition matched; without one such records are counted
//! (`unrouted`) and go nowhere.
//!
//! A record that goes nowhere, or that a branch filters, counts as
//! filtered for that sink: its batch's handle is not cloned for it, so
//! its offset commits once the sinks it did go to hold it durably.

use std::collections::HashSet;

use bytes::Bytes;
use etl_record::{DeadLetter, Position, Record};

use crate::config::RouteMode;
use crate::transform::{ChainOutput, Transform, TransformChain};

/// Where one sink's records come from: its condition and its own
/// transforms. See [`PipelineBuilder::route`](super::PipelineBuilder::route).
///
/// ```
/// use etl::{Route, filter};
/// use etl_record::Record;
///
/// // Only records whose value starts with `{"level":"error"`, without
/// // their headers.
/// let route = Route::new()
///     .when(filter("errors", |r: &Record| r.value.starts_with(br#"{"level":"error""#)))
///     .transform(etl::map("no headers", |mut r: Record| {
///         r.headers = Default::default();
///         Ok(r)
///     }));
/// # let _ = route;
/// ```
#[derive(Debug, Default)]
pub struct Route {
    pub(crate) when: Option<TransformChain>,
    pub(crate) steps: TransformChain,
}

impl Route {
    /// A route that takes every record, unchanged.
    #[must_use]
    pub fn new() -> Self {
        Route::default()
    }

    /// The condition: a record the filter keeps matches (a condition
    /// should pass what it keeps on unchanged, as the built-in filters
    /// do); a record it rejects goes to the dead-letter path, and one it
    /// halts on halts the run.
    #[must_use]
    pub fn when(self, condition: impl Transform + 'static) -> Self {
        let mut chain = TransformChain::new();
        chain.push(Box::new(condition));
        self.when_chain(chain)
    }

    /// The condition, as a chain of filters: a record all of them keep
    /// matches.
    #[must_use]
    pub fn when_chain(mut self, condition: TransformChain) -> Self {
        self.when = Some(condition);
        self
    }

    /// Append a transform of this sink's own, run after the shared ones
    /// on this sink's copy of each record it takes.
    #[must_use]
    pub fn transform(mut self, transform: impl Transform + 'static) -> Self {
        self.steps.push(Box::new(transform));
        self
    }

    /// Use these transforms of this sink's own (replacing any added so
    /// far).
    #[must_use]
    pub fn transforms(mut self, chain: TransformChain) -> Self {
        self.steps = chain;
        self
    }

    /// Whether the route takes every record unchanged.
    pub(crate) fn is_plain(&self) -> bool {
        self.when.is_none() && self.steps.is_empty()
    }
}

/// What a condition made of one record.
enum Decision {
    Match,
    NoMatch,
    /// The record cannot be judged: to the dead-letter path.
    Reject(DeadLetter),
    /// The run halts on it.
    Halt(DeadLetter),
}

/// What routing made of a batch.
#[derive(Debug, Default)]
pub(crate) struct Routed {
    /// Per sink, in the sinks' order: the records it takes.
    pub(crate) to: Vec<Vec<Record>>,
    /// Records a condition or a branch's transform set aside.
    pub(crate) rejected: Vec<DeadLetter>,
    /// Records a branch's transforms filtered.
    pub(crate) filtered: u64,
    /// Records no route took and no unmatched sink received.
    pub(crate) unrouted: u64,
    /// A record a condition or a branch's transform halted on.
    pub(crate) halted: Option<DeadLetter>,
}

/// The routes of every sink, in the sinks' order.
#[derive(Debug)]
pub(crate) struct Router {
    mode: RouteMode,
    routes: Vec<Route>,
    unmatched: Option<usize>,
    out: ChainOutput,
    /// The one-record batch a condition judges, its allocation reused.
    scratch: Vec<Record>,
}

impl Router {
    /// `routes`: one per sink, in the sinks' order; `unmatched`: the index
    /// of the sink that takes what no condition matched.
    pub(crate) fn new(mode: RouteMode, routes: Vec<Route>, unmatched: Option<usize>) -> Self {
        Router {
            mode,
            routes,
            unmatched,
            out: ChainOutput::default(),
            scratch: Vec::with_capacity(1),
        }
    }

    /// An independent copy for another worker, when every condition and
    /// step can fork.
    pub(crate) fn fork(&self) -> Option<Router> {
        let routes = self
            .routes
            .iter()
            .map(|r| {
                let when = match &r.when {
                    Some(when) => Some(when.fork()?),
                    None => None,
                };
                Some(Route {
                    when,
                    steps: r.steps.fork()?,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Router {
            mode: self.mode,
            routes,
            unmatched: self.unmatched,
            out: ChainOutput::default(),
            scratch: Vec::with_capacity(1),
        })
    }

    /// Whether every record goes to every sink unchanged: then the stage
    /// fans out without routing.
    pub(crate) fn is_trivial(&self) -> bool {
        self.mode == RouteMode::All
            && self.unmatched.is_none()
            && self.routes.iter().all(Route::is_plain)
    }

    /// Decide where each of `records` goes, and run each sink's branch.
    pub(crate) fn route(&mut self, records: Vec<Record>) -> Routed {
        let mut routed = Routed {
            to: (0..self.routes.len()).map(|_| Vec::new()).collect(),
            ..Routed::default()
        };
        let decided = match self.mode {
            RouteMode::All => self.all(records, &mut routed),
            RouteMode::Exclusive => self.exclusive(records, &mut routed),
        };
        if decided.is_err() {
            return routed;
        }
        for (route, to) in self.routes.iter_mut().zip(routed.to.iter_mut()) {
            if route.steps.is_empty() || to.is_empty() {
                continue;
            }
            self.out.clear();
            route.steps.apply(std::mem::take(to), &mut self.out);
            *to = std::mem::take(&mut self.out.kept);
            routed.filtered += self.out.filtered;
            routed.rejected.append(&mut self.out.rejected);
            if let Some(letter) = self.out.halted.take() {
                routed.halted = Some(letter);
                return routed;
            }
        }
        routed
    }

    /// Every sink whose condition a record matches takes it.
    fn all(&mut self, records: Vec<Record>, routed: &mut Routed) -> Result<(), ()> {
        let Some(unmatched) = self.unmatched else {
            // No record needs to know whether any condition took it: each
            // condition runs over the whole batch, on its fast path.
            // A record no condition can judge is set aside once, however
            // many conditions refused it.
            let mut refused: HashSet<(Position, Bytes)> = HashSet::new();
            for (i, route) in self.routes.iter_mut().enumerate() {
                let Some(when) = &mut route.when else {
                    routed.to[i] = records.clone();
                    continue;
                };
                self.out.clear();
                when.apply(records.clone(), &mut self.out);
                routed.to[i] = std::mem::take(&mut self.out.kept);
                for letter in self.out.rejected.drain(..) {
                    let key = (letter.record.position.clone(), letter.record.value.clone());
                    if refused.insert(key) {
                        routed.rejected.push(letter);
                    }
                }
                if let Some(letter) = self.out.halted.take() {
                    routed.halted = Some(letter);
                    return Err(());
                }
            }
            let conditional = self.routes.iter().filter(|r| r.when.is_some()).count();
            if conditional == self.routes.len() {
                // A record no sink took (and no condition refused) went
                // nowhere.
                routed.unrouted += unrouted_of_all(&records, &routed.to, &refused);
            }
            return Ok(());
        };
        for record in records {
            let mut matched = false;
            let mut judged = true;
            for (i, route) in self.routes.iter_mut().enumerate() {
                if i == unmatched {
                    continue;
                }
                let Some(when) = &mut route.when else {
                    routed.to[i].push(record.clone());
                    continue;
                };
                match decide(when, &mut self.out, &mut self.scratch, &record) {
                    Decision::Match => {
                        matched = true;
                        routed.to[i].push(record.clone());
                    }
                    Decision::NoMatch => {}
                    Decision::Reject(letter) => {
                        // Set aside once, whatever the other conditions
                        // say of it.
                        if judged {
                            routed.rejected.push(letter);
                        }
                        judged = false;
                    }
                    Decision::Halt(letter) => {
                        routed.halted = Some(letter);
                        return Err(());
                    }
                }
            }
            if !matched && judged {
                routed.to[unmatched].push(record);
            }
        }
        Ok(())
    }

    /// The first sink whose condition a record matches takes it.
    fn exclusive(&mut self, records: Vec<Record>, routed: &mut Routed) -> Result<(), ()> {
        'records: for record in records {
            for (i, route) in self.routes.iter_mut().enumerate() {
                if Some(i) == self.unmatched {
                    continue;
                }
                let Some(when) = &mut route.when else {
                    routed.to[i].push(record);
                    continue 'records;
                };
                match decide(when, &mut self.out, &mut self.scratch, &record) {
                    Decision::Match => {
                        routed.to[i].push(record);
                        continue 'records;
                    }
                    Decision::NoMatch => {}
                    Decision::Reject(letter) => {
                        routed.rejected.push(letter);
                        continue 'records;
                    }
                    Decision::Halt(letter) => {
                        routed.halted = Some(letter);
                        return Err(());
                    }
                }
            }
            match self.unmatched {
                Some(u) => routed.to[u].push(record),
                None => routed.unrouted += 1,
            }
        }
        Ok(())
    }
}

/// Records of `records` no sink took and no condition refused, when
/// every sink has a condition: found by position and value (a condition
/// keeps the records it takes in order, so a record is taken when some
/// sink's list holds it next).
fn unrouted_of_all(
    records: &[Record],
    to: &[Vec<Record>],
    refused: &HashSet<(Position, Bytes)>,
) -> u64 {
    let mut cursors = vec![0usize; to.len()];
    let mut none = 0u64;
    for record in records {
        let mut hit = false;
        for (list, at) in to.iter().zip(cursors.iter_mut()) {
            if list.get(*at).is_some_and(|r| same(r, record)) {
                *at += 1;
                hit = true;
            }
        }
        if !hit && !refused.contains(&(record.position.clone(), record.value.clone())) {
            none += 1;
        }
    }
    none
}

/// Whether `a` is `b` as it came (a condition passes records on as they
/// came: the same value bytes at the same position).
fn same(a: &Record, b: &Record) -> bool {
    a.position == b.position && a.value == b.value
}

/// Run one record through a condition; `scratch` lends the one-record
/// batch its allocation, taken back after.
fn decide(
    when: &mut TransformChain,
    out: &mut ChainOutput,
    scratch: &mut Vec<Record>,
    record: &Record,
) -> Decision {
    out.clear();
    scratch.clear();
    scratch.push(record.clone());
    when.apply(std::mem::take(scratch), out);
    let decision = if let Some(letter) = out.halted.take() {
        Decision::Halt(letter)
    } else if let Some(letter) = out.rejected.pop() {
        Decision::Reject(letter)
    } else if out.kept.is_empty() {
        Decision::NoMatch
    } else {
        Decision::Match
    };
    *scratch = std::mem::take(&mut out.kept);
    scratch.clear();
    decision
}
