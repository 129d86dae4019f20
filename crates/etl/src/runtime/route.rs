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
//!
//! The conditions with a fast form (see [`etl_json::Conditions`]) are
//! judged on one reading of each record, whatever their number; a
//! condition the fast form cannot judge on a record runs as its own
//! stage on it. When the shared steps end in a fused run, that run
//! judges the declarative conditions while it writes each record and
//! hands the verdicts on ([`etl_json::Verdicts`]): a record whose value
//! is the very bytes judged is not read for them. Each record is first
//! given its sinks, then moved (and, for all of them but the last,
//! cloned: its bytes are shared) into vectors of the size each sink
//! takes.

use etl_json::{Condition, Conditions, Verdicts};
use etl_record::{DeadLetter, Record, reuse};

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
    /// The condition's fast form, judged with the other sinks' on one
    /// reading of each record.
    pub(crate) fast: Option<Condition>,
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
        self.fast = None;
        self
    }

    /// The condition's fast form, when it has one: the condition set by
    /// [`when`](Route::when) or [`when_chain`](Route::when_chain) must
    /// keep exactly the records `fast` holds for where `fast` judges.
    #[must_use]
    pub(crate) fn when_fast(mut self, fast: Option<Condition>) -> Self {
        self.fast = fast;
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
    /// The routes' conditions with a fast form, in the routes' order.
    conditions: Conditions,
    out: ChainOutput,
    /// The one-record batch a condition judges, its allocation reused.
    scratch: Vec<Record>,
    /// Where the records of the batch being routed go: per record, in
    /// order, the indexes of its sinks, then [`END`]; with
    /// [`RouteMode::Exclusive`], one entry per record: its sink, or
    /// [`END`] when it has none.
    targets: Vec<u32>,
    /// The verdicts the shared steps' last stage gave on the batch being
    /// routed, when it judges the conditions (see [`Router::link`]).
    verdicts: Verdicts,
    /// Whether the shared steps' last stage was asked to judge the
    /// conditions.
    linked: bool,
    /// How many records so far had a verdict from the shared steps (the
    /// hand-off at work; see [`Router::by_verdict`]).
    by_verdict: u64,
}

/// Ends a record's sinks in [`Router::targets`].
const END: u32 = u32::MAX;

impl Router {
    /// `routes`: one per sink, in the sinks' order; `unmatched`: the index
    /// of the sink that takes what no condition matched.
    pub(crate) fn new(mode: RouteMode, mut routes: Vec<Route>, unmatched: Option<usize>) -> Self {
        let conditions = Conditions::new(routes.iter_mut().map(|r| r.fast.take()));
        Router {
            mode,
            routes,
            unmatched,
            conditions,
            out: ChainOutput::default(),
            scratch: Vec::with_capacity(1),
            targets: Vec::new(),
            verdicts: Verdicts::new(),
            linked: false,
            by_verdict: 0,
        }
    }

    /// Ask the last stage of `chain`, the shared steps whose output this
    /// router takes, to judge the conditions on each record it keeps and
    /// hand the verdicts on (a fused run does; see
    /// [`Conditions::judge_in`]); once, the first time.
    pub(crate) fn link(&mut self, chain: &mut TransformChain) {
        if std::mem::replace(&mut self.linked, true) {
            return;
        }
        if let Some(last) = chain.last_mut() {
            self.conditions.judge_in(last);
        }
    }

    /// How many records this router has routed with a verdict the
    /// shared steps gave (at least one condition not read again).
    #[cfg(all(test, feature = "remap"))]
    pub(crate) fn by_verdict(&self) -> u64 {
        self.by_verdict
    }

    /// Take the verdicts `chain`'s last stage gave on the batch it just
    /// ran, for [`route`](Router::route) to use on the records that are
    /// the very ones judged.
    pub(crate) fn take_verdicts(&mut self, chain: &mut TransformChain) {
        match chain.last_mut() {
            Some(last) if self.linked => self.verdicts.take_from(last),
            _ => self.verdicts.clear(),
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
                    fast: None,
                    steps: r.steps.fork()?,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Router {
            mode: self.mode,
            routes,
            unmatched: self.unmatched,
            conditions: self.conditions.fork(),
            out: ChainOutput::default(),
            scratch: Vec::with_capacity(1),
            targets: Vec::new(),
            verdicts: Verdicts::new(),
            linked: false,
            by_verdict: 0,
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
        let mut routed = Routed::default();
        let targeted = self.target(&records, &mut routed);
        // The verdicts hold the bytes judged: let them go with the batch.
        self.verdicts.clear();
        if targeted.is_err() {
            return routed;
        }
        routed.to = self.distribute(records);
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

    /// Find each record's sinks (into `targets`); set aside what a
    /// condition refused, count what went nowhere. `Err`: a condition
    /// halted on a record.
    ///
    /// With [`RouteMode::All`] a record goes to every sink whose
    /// condition it matches, and to the unmatched sink when it matched
    /// none; with [`RouteMode::Exclusive`] to the first. A record a
    /// condition cannot judge is set aside once, whatever the other
    /// conditions say of it, and is not unmatched.
    fn target(&mut self, records: &[Record], routed: &mut Routed) -> Result<(), ()> {
        let exclusive = self.mode == RouteMode::Exclusive;
        self.targets.clear();
        self.targets
            .reserve(records.len() * if exclusive { 1 } else { 2 });
        for record in records {
            let start = self.targets.len();
            // The shared steps' verdict on these very bytes, if any; the
            // record is read, once, only for a condition it leaves out.
            let verdict = self.verdicts.of(&record.value).unwrap_or_default();
            self.by_verdict += u64::from(!verdict.is_empty());
            let mut conditions = Some(&mut self.conditions);
            let mut judging = None;
            let mut matched = false;
            let mut judged = true;
            for (i, route) in self.routes.iter_mut().enumerate() {
                if Some(i) == self.unmatched {
                    continue;
                }
                let held = match &mut route.when {
                    None => true,
                    Some(when) => {
                        let mut held = verdict.holds(i);
                        if held.is_none() {
                            if let Some(conditions) = conditions.take() {
                                judging = Some(conditions.read(&record.value));
                            }
                            held = judging.as_mut().and_then(|j| j.holds(i));
                        }
                        match held {
                            Some(held) => held,
                            None => match decide(when, &mut self.out, &mut self.scratch, record) {
                                Decision::Match => true,
                                Decision::NoMatch => false,
                                Decision::Reject(letter) => {
                                    if judged {
                                        routed.rejected.push(letter);
                                    }
                                    judged = false;
                                    if exclusive {
                                        break;
                                    }
                                    continue;
                                }
                                Decision::Halt(letter) => {
                                    routed.halted = Some(letter);
                                    return Err(());
                                }
                            },
                        }
                    }
                };
                if held {
                    // A sink without a condition is no match of one.
                    matched |= route.when.is_some();
                    self.targets.push(sink_index(i));
                    if exclusive {
                        matched = true;
                        break;
                    }
                }
            }
            if !matched && judged {
                match self.unmatched {
                    Some(u) => self.targets.push(sink_index(u)),
                    None if self.targets.len() == start => routed.unrouted += 1,
                    None => {}
                }
            }
            // Exclusive, a record has at most one sink: it stands alone.
            if !exclusive || self.targets.len() == start {
                self.targets.push(END);
            }
        }
        Ok(())
    }

    /// Move each record into the vectors of its sinks (`targets`), each
    /// vector taken once at the size it takes; a record with several sinks
    /// is cloned for all but the last (its bytes are shared, not copied).
    fn distribute(&self, mut records: Vec<Record>) -> Vec<Vec<Record>> {
        let mut sizes = vec![0usize; self.routes.len()];
        for t in &self.targets {
            if let Some(size) = sizes.get_mut(*t as usize) {
                *size += 1;
            }
        }
        // The sinks' vectors come from those written batches gave back,
        // and the batch's own is given back once emptied, as it is when
        // the batch goes to one sink unrouted (see `etl_record::reuse`).
        let mut to: Vec<Vec<Record>> = sizes
            .into_iter()
            .map(|n| {
                if n == 0 {
                    Vec::new()
                } else {
                    reuse::records(n)
                }
            })
            .collect();
        if self.mode == RouteMode::Exclusive {
            // One entry a record: its sink, or [`END`] for none.
            let mut targets = self.targets.iter();
            for record in records.drain(..) {
                let Some(&sink) = targets.next() else { break };
                if let Some(list) = to.get_mut(sink as usize) {
                    list.push(record);
                }
            }
        } else {
            let mut targets = self.targets.iter();
            for record in records.drain(..) {
                let mut record = Some(record);
                let mut next = targets.next();
                while let Some(&sink) = next.filter(|t| **t != END) {
                    next = targets.next();
                    let last = next.is_none_or(|t| *t == END);
                    let copy = if last { record.take() } else { record.clone() };
                    if let (Some(copy), Some(list)) = (copy, to.get_mut(sink as usize)) {
                        list.push(copy);
                    }
                }
            }
        }
        reuse::give_back(records);
        to
    }
}

/// A sink's index in [`Router::targets`] (a pipeline has far fewer than
/// `u32::MAX` sinks).
fn sink_index(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(END)
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
