//! The fast path of VRL programs: programs that only read fields, compare,
//! do arithmetic, assign and delete run on the record's JSON text without
//! building a document tree.
//!
//! A program is taken apart with VRL's own parser after VRL compiled it
//! (so diagnostics and type checks are VRL's). When every expression is in
//! the subset below, each record is run here: the top-level object is read
//! once as (key, original text) entries, and a field is parsed only when
//! the program reads it (nested objects and arrays on the way are scanned,
//! never built). Values are VRL's own [`Value`]s and operators are VRL's
//! own (`VrlValueArithmetic`), so results are the runtime's.
//!
//! The subset: literals (not regexes or timestamps), event paths (`.a.b[0]`,
//! no metadata `%`), local variables and their paths, `=` to an event path
//! of fields or to a variable, `del(.path)`, `if`/`else`, `abort`, `!`,
//! the operators `+ - * / == != < <= > >= && ||`, blocks, groups, and the
//! functions `to_float`, `to_int`, `round`, `floor`, `ceil` (one argument),
//! the type assertions `float`, `int`, `string`, `bool`, `array`, `object`,
//! and `for_each` over an array.
//!
//! Invariant: the fast path never decides anything it is not sure of. Any
//! error, any value or place it does not handle (assigning below a field
//! that is not an object, an invalid or non-object record, ...) gives
//! [`Lite::Fallback`], and the record runs on VRL's runtime from the
//! start; the fast path has no effect until it returns, so nothing runs
//! twice. What it writes is what [`faithful::write`] writes for the same
//! change: unchanged values from their original text in their original
//! order, new keys after, sorted.

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use vrl::compiler::prelude::VrlValueArithmetic;
use vrl::parser::ast::{self, Opcode};
use vrl::path::{OwnedSegment, PathPrefix};
use vrl::value::Value;

use crate::check;
use crate::conditions::Verdict;
use crate::faithful::{self, Verbatim};
use crate::number;
use crate::ops::CompareOp;
use crate::scan::{self, Entries, Entry};

pub(crate) mod judge;

/// A program in the fast subset.
#[derive(Debug, Clone)]
pub(crate) struct LiteProgram {
    body: Vec<Expr>,
    vars: usize,
}

/// What running a program on one record gave.
#[derive(Debug, PartialEq)]
pub(crate) enum Lite {
    /// The program ran: the record's new value (`None`: unchanged) and
    /// what the program resolved to.
    Done(Option<Bytes>, Value),
    /// `abort`.
    Aborted,
    /// Not decided here: run the record on VRL's runtime.
    Fallback,
}

type Path = Vec<OwnedSegment>;

#[derive(Debug, Clone)]
enum Expr {
    Lit(Value),
    Event(Path),
    Var(usize, Path),
    Op(Box<Expr>, Opcode, Box<Expr>),
    Not(Box<Expr>),
    Call(Func, Box<Expr>),
    Del(Path),
    SetField(Path, Box<Expr>),
    SetVar(usize, Box<Expr>),
    If(Box<Expr>, Vec<Expr>, Option<Vec<Expr>>),
    Block(Vec<Expr>),
    Abort,
    ForEach {
        array: Box<Expr>,
        index: usize,
        item: usize,
        body: Vec<Expr>,
    },
    /// Arithmetic and number functions over numbers read from the record
    /// or the variables, worked out on unboxed numbers (see [`NumExpr`]);
    /// when an operand read is not a number, the expression as written
    /// (the second field) decides instead.
    Num(NumExpr, Box<Expr>),
}

/// An expression of numbers only: literals, reads, `+`, `-`, `*` and the
/// number functions, evaluated without a [`Value`] per node. It reads
/// only (its leaves are field and variable reads), so giving up halfway
/// and evaluating the expression as written has the same effects.
#[derive(Debug, Clone)]
enum NumExpr {
    Lit(Num),
    /// A read (`Expr::Event` or `Expr::Var`), which must give a number.
    Read(Box<Expr>),
    Op(Box<NumExpr>, Opcode, Box<NumExpr>),
    Call(Func, Box<NumExpr>),
}

/// A number as VRL holds it: an integer, or a float that is not NaN.
#[derive(Debug, Clone, Copy)]
enum Num {
    Int(i64),
    Float(f64),
}

impl Num {
    fn into_value(self) -> Value {
        match self {
            Num::Int(i) => Value::Integer(i),
            Num::Float(f) => Value::from_f64_or_zero(f),
        }
    }

    /// `+`, `-` or `*`, as [`arithmetic`] gives it for two numbers.
    #[allow(clippy::cast_precision_loss)]
    fn arithmetic(self, op: Opcode, other: Num) -> Run<Num> {
        let (a, b) = match (self, other) {
            (Num::Int(a), Num::Int(b)) => {
                return Ok(Num::Int(match op {
                    Opcode::Add => a.wrapping_add(b),
                    Opcode::Sub => a.wrapping_sub(b),
                    Opcode::Mul => a.wrapping_mul(b),
                    _ => return Err(Stop::Fallback),
                }));
            }
            (Num::Int(a), Num::Float(b)) => (a as f64, b),
            (Num::Float(a), Num::Int(b)) => (a, b as f64),
            (Num::Float(a), Num::Float(b)) => (a, b),
        };
        let x = match op {
            Opcode::Add => a + b,
            Opcode::Sub => a - b,
            Opcode::Mul => a * b,
            _ => return Err(Stop::Fallback),
        };
        if x.is_nan() {
            return Err(Stop::Fallback);
        }
        Ok(Num::Float(x))
    }

    /// A number function, as [`call`] gives it for a number.
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
    fn call(self, func: Func) -> Run<Num> {
        let or_zero = |x: f64| if x.is_nan() { 0.0 } else { x };
        Ok(match (func, self) {
            (Func::ToFloat, Num::Int(i)) => Num::Float(i as f64),
            (Func::ToFloat | Func::Float, n @ Num::Float(_))
            | (Func::ToInt | Func::Int | Func::Round | Func::Floor | Func::Ceil, n @ Num::Int(_)) => {
                n
            }
            (Func::ToInt, Num::Float(f)) => Num::Int(f as i64),
            (Func::Round, Num::Float(x)) => Num::Float(or_zero(x.round())),
            (Func::Floor, Num::Float(x)) => Num::Float(or_zero(x.floor())),
            (Func::Ceil, Num::Float(x)) => Num::Float(or_zero(x.ceil())),
            _ => return Err(Stop::Fallback),
        })
    }
}

impl NumExpr {
    /// The numeric form of `e`, when it is arithmetic (`+`, `-`, `*`) or
    /// number functions over number literals and reads.
    fn of(e: &Expr) -> Option<NumExpr> {
        Some(match e {
            Expr::Lit(Value::Integer(i)) => NumExpr::Lit(Num::Int(*i)),
            Expr::Lit(Value::Float(f)) => NumExpr::Lit(Num::Float(f.into_inner())),
            Expr::Event(_) | Expr::Var(..) => NumExpr::Read(Box::new(e.clone())),
            Expr::Op(l, op @ (Opcode::Add | Opcode::Sub | Opcode::Mul), r) => {
                NumExpr::Op(Box::new(Self::of(l)?), *op, Box::new(Self::of(r)?))
            }
            Expr::Call(
                func @ (Func::ToFloat
                | Func::ToInt
                | Func::Round
                | Func::Floor
                | Func::Ceil
                | Func::Float
                | Func::Int),
                arg,
            ) => NumExpr::Call(*func, Box::new(Self::of(arg)?)),
            _ => return None,
        })
    }
}

/// Give the largest numeric expressions in `e` their numeric form
/// (see [`NumExpr`]), from the top down: an operation or a call, not a
/// lone literal or read, and none inside another (the expression as
/// written, beside it, stays generic: one numeric try, then one generic
/// evaluation at most).
fn numeric(e: &mut Expr) {
    if matches!(e, Expr::Op(..) | Expr::Call(..))
        && let Some(num) = NumExpr::of(e)
    {
        let written = std::mem::replace(e, Expr::Abort);
        *e = Expr::Num(num, Box::new(written));
        return;
    }
    match e {
        Expr::Lit(_)
        | Expr::Event(_)
        | Expr::Var(..)
        | Expr::Del(_)
        | Expr::Abort
        | Expr::Num(..) => {}
        Expr::Op(l, _, r) => {
            numeric(l);
            numeric(r);
        }
        Expr::Not(inner)
        | Expr::Call(_, inner)
        | Expr::SetField(_, inner)
        | Expr::SetVar(_, inner) => {
            numeric(inner);
        }
        Expr::If(predicate, then, otherwise) => {
            numeric(predicate);
            then.iter_mut().for_each(numeric);
            if let Some(otherwise) = otherwise {
                otherwise.iter_mut().for_each(numeric);
            }
        }
        Expr::Block(exprs) => exprs.iter_mut().for_each(numeric),
        Expr::ForEach { array, body, .. } => {
            numeric(array);
            body.iter_mut().for_each(numeric);
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Func {
    ToFloat,
    ToInt,
    Round,
    Floor,
    Ceil,
    Float,
    Int,
    String,
    Bool,
    Array,
    Object,
}

/// Why evaluation stopped early.
enum Stop {
    Abort,
    Fallback,
}

type Run<T> = Result<T, Stop>;

impl<E> From<E> for Stop
where
    E: std::error::Error,
{
    fn from(_: E) -> Self {
        Stop::Fallback
    }
}

/// Taking the parsed program apart.
#[derive(Default)]
struct Translate {
    vars: Vec<String>,
}

impl Translate {
    fn slot(&mut self, name: &str) -> usize {
        match self.vars.iter().position(|v| v == name) {
            Some(i) => i,
            None => {
                self.vars.push(name.to_owned());
                self.vars.len() - 1
            }
        }
    }

    fn block(&mut self, exprs: &[ast::Node<ast::Expr>]) -> Option<Vec<Expr>> {
        exprs.iter().map(|e| self.expr(e)).collect()
    }

    fn expr(&mut self, e: &ast::Expr) -> Option<Expr> {
        use ast::Expr as E;
        Some(match e {
            E::Literal(l) => Expr::Lit(match l.inner() {
                // `""` is a template of no segments, not one literal.
                ast::Literal::String(t) if t.0.is_empty() => Value::from(""),
                ast::Literal::String(t) => Value::from(t.as_literal_string()?),
                ast::Literal::RawString(s) => Value::from(s.as_str()),
                ast::Literal::Integer(i) => Value::Integer(*i),
                ast::Literal::Float(f) => Value::Float(*f),
                ast::Literal::Boolean(b) => Value::Boolean(*b),
                ast::Literal::Null => Value::Null,
                ast::Literal::Regex(_) | ast::Literal::Timestamp(_) => return None,
            }),
            E::Container(c) => match c.inner() {
                ast::Container::Group(g) => self.expr(&g.inner().0)?,
                ast::Container::Block(b) => Expr::Block(self.block(&b.inner().0)?),
                ast::Container::Array(_) | ast::Container::Object(_) => return None,
            },
            E::IfStatement(s) => {
                let ast::Predicate::One(predicate) = s.predicate.inner() else {
                    return None;
                };
                Expr::If(
                    Box::new(self.expr(predicate)?),
                    self.block(&s.if_node.inner().0)?,
                    match &s.else_node {
                        Some(b) => Some(self.block(&b.inner().0)?),
                        None => None,
                    },
                )
            }
            E::Op(op) => {
                let ast::Op(lhs, opcode, rhs) = op.inner();
                if matches!(opcode.inner(), Opcode::Merge | Opcode::Err) {
                    return None;
                }
                Expr::Op(
                    Box::new(self.expr(lhs)?),
                    *opcode.inner(),
                    Box::new(self.expr(rhs)?),
                )
            }
            E::Assignment(a) => {
                let ast::Assignment::Single {
                    target,
                    op: ast::AssignmentOp::Assign,
                    expr,
                } = a.inner()
                else {
                    return None;
                };
                let value = Box::new(self.expr(expr)?);
                match target.inner() {
                    ast::AssignmentTarget::Query(q) => {
                        Expr::SetField(event_fields(q.target.inner(), &q.path.segments)?, value)
                    }
                    ast::AssignmentTarget::External(Some(p)) if p.prefix == PathPrefix::Event => {
                        Expr::SetField(fields_only(&p.path.segments)?, value)
                    }
                    ast::AssignmentTarget::Internal(ident, None) => {
                        Expr::SetVar(self.slot(ident), value)
                    }
                    _ => return None,
                }
            }
            E::Query(q) => match q.target.inner() {
                ast::QueryTarget::External(PathPrefix::Event) if !q.path.is_root() => {
                    Expr::Event(q.path.segments.clone())
                }
                ast::QueryTarget::Internal(ident) => {
                    Expr::Var(self.slot(ident), q.path.segments.clone())
                }
                _ => return None,
            },
            E::FunctionCall(f) => self.call(f)?,
            E::Variable(ident) => Expr::Var(self.slot(ident), Vec::new()),
            E::Unary(u) => {
                let ast::Unary::Not(not) = u.inner();
                let (_, inner) = not.inner().clone().take();
                Expr::Not(Box::new(self.expr(&inner)?))
            }
            E::Abort(_) => Expr::Abort,
            E::Return(_) | E::Break(_) => return None,
        })
    }

    fn call(&mut self, f: &ast::FunctionCall) -> Option<Expr> {
        let [arg] = &f.arguments[..] else {
            return None;
        };
        let arg = arg.inner();
        if arg.ident.is_some() {
            return None;
        }
        let name: &str = f.ident.inner();
        if name == "for_each" {
            let closure = f.closure.as_ref()?.inner();
            let [index, item] = &closure.variables[..] else {
                return None;
            };
            return Some(Expr::ForEach {
                array: Box::new(self.expr(&arg.expr)?),
                index: self.slot(index),
                item: self.slot(item),
                body: self.block(&closure.block.inner().0)?,
            });
        }
        if f.closure.is_some() {
            return None;
        }
        if name == "del" {
            let ast::Expr::Query(q) = arg.expr.inner() else {
                return None;
            };
            return Some(Expr::Del(event_fields(q.target.inner(), &q.path.segments)?));
        }
        let func = match name {
            "to_float" => Func::ToFloat,
            "to_int" => Func::ToInt,
            "round" => Func::Round,
            "floor" => Func::Floor,
            "ceil" => Func::Ceil,
            "float" => Func::Float,
            "int" => Func::Int,
            "string" => Func::String,
            "bool" => Func::Bool,
            "array" => Func::Array,
            "object" => Func::Object,
            _ => return None,
        };
        Some(Expr::Call(func, Box::new(self.expr(&arg.expr)?)))
    }
}

/// The path of a query on the event made of field names only, not empty.
fn event_fields(target: &ast::QueryTarget, segments: &[OwnedSegment]) -> Option<Path> {
    match target {
        ast::QueryTarget::External(PathPrefix::Event) => fields_only(segments),
        _ => None,
    }
}

fn fields_only(segments: &[OwnedSegment]) -> Option<Path> {
    (!segments.is_empty() && segments.iter().all(|s| matches!(s, OwnedSegment::Field(_))))
        .then(|| segments.to_vec())
}

impl LiteProgram {
    /// The program's fast form, when all of it is in the subset.
    pub(crate) fn new(source: &str) -> Option<Self> {
        let program = vrl::parser::parse(source).ok()?;
        let mut translate = Translate::default();
        let mut body = Vec::with_capacity(program.0.len());
        for root in &program.0 {
            match root.inner() {
                ast::RootExpr::Expr(e) => body.push(translate.expr(e)?),
                ast::RootExpr::Error(_) => return None,
            }
        }
        body.iter_mut().for_each(numeric);
        Some(LiteProgram {
            body,
            vars: translate.vars.len(),
        })
    }

    /// Run the program on one record's value, reading it into `arena`'s
    /// vectors; with `write`, the changed record is written into `arena`
    /// (a condition only needs the result). `checked`:
    /// the value is known to be valid JSON (see [`Remap::checked_input`]),
    /// so it is not checked again.
    ///
    /// [`Remap::checked_input`]: crate::Remap::checked_input
    pub(crate) fn run<'a>(
        &'a self,
        input: &'a [u8],
        arena: &mut Arena,
        write: bool,
        checked: bool,
    ) -> Lite {
        let Some(mut cx) = Cx::open(input, checked, &mut arena.spare) else {
            return Lite::Fallback;
        };
        let outcome = self.run_on(&mut cx, arena, write);
        cx.close(&mut arena.spare);
        outcome
    }

    fn run_on<'a>(&'a self, cx: &mut Cx<'a>, arena: &mut Arena, write: bool) -> Lite {
        let result = match cx.program(self) {
            Ok(v) => v,
            Err(Stop::Abort) => return Lite::Aborted,
            Err(Stop::Fallback) => return Lite::Fallback,
        };
        let Ok(result) = result.into_value() else {
            return Lite::Fallback;
        };
        if !write {
            return Lite::Done(None, result);
        }
        match cx.write(arena) {
            Ok(value) => Lite::Done(value, result),
            Err(_) => Lite::Fallback,
        }
    }
}

/// One step of a run of steps that reads each record once (see
/// [`run_steps`]).
#[derive(Debug, Clone)]
pub(crate) enum Step {
    /// Declarative filters (a fused JSON stage of filters only, on the
    /// record as read): keep the record when every one holds.
    Filters(Vec<JsonFilter>),
    /// A filter `condition`: keep the record when it is `true`.
    Condition(Arc<LiteProgram>),
    /// A `remap` program.
    Remap(Arc<LiteProgram>),
}

/// A declarative filter: the field at `path` compared with a constant, as
/// [`JsonStage`](crate::JsonStage) compares it.
#[derive(Debug, Clone)]
pub(crate) struct JsonFilter {
    /// The dotted path, split.
    pub(crate) path: Vec<String>,
    /// The comparison.
    pub(crate) op: CompareOp,
    /// The constant.
    pub(crate) value: serde_json::Value,
    /// The constant, read for comparing numbers with it.
    pub(crate) constant: number::Constant,
}

/// What a run of steps made of a record.
#[derive(Debug, PartialEq)]
pub(crate) enum Steps {
    /// Every step kept it: its new value (`None`: unchanged).
    Keep(Option<Bytes>),
    /// A step dropped it (a filter, a condition not `true`, `abort`).
    Filtered,
    /// Not decided here: run the steps one by one.
    Fallback,
}

/// Run `steps` in order on one record, read once: each program sees the
/// changes of the programs before it, as it would see them in the record
/// they wrote. Like [`LiteProgram::run`], nothing has an effect unless
/// every step is decided here. On a record kept, the verdicts of the
/// conditions of `plan` on the record as written (see
/// [`judge::judge_written`]; none without a plan).
pub(crate) fn run_steps<'a>(
    steps: &'a [Step],
    input: &'a [u8],
    arena: &mut Arena,
    checked: bool,
    plan: Option<&judge::Plan>,
) -> (Steps, Verdict) {
    let Some(mut cx) = Cx::open(input, checked, &mut arena.spare) else {
        return (Steps::Fallback, Verdict::default());
    };
    let outcome = run_on(&mut cx, steps, arena);
    let verdict = match (&outcome, plan) {
        (Steps::Keep(_), Some(plan)) => judge::judge_written(&cx, plan),
        _ => Verdict::default(),
    };
    cx.close(&mut arena.spare);
    (outcome, verdict)
}

fn run_on<'a>(cx: &mut Cx<'a>, steps: &'a [Step], arena: &mut Arena) -> Steps {
    for step in steps {
        let kept = match step {
            Step::Filters(filters) => filters
                .iter()
                .try_fold(true, |all, f| Ok::<_, Stop>(all && cx.json_filter(f)?)),
            Step::Condition(program) => match cx.program(program).map(Val::into_value) {
                Ok(Ok(Value::Boolean(b))) => Ok(b),
                Ok(Ok(_)) => Ok(false),
                Ok(Err(e)) | Err(e) => Err(e),
            },
            Step::Remap(program) => match cx.program(program).map(Val::into_value) {
                Ok(Ok(_)) => Ok(true),
                Ok(Err(e)) | Err(e) => Err(e),
            },
        };
        match kept {
            Ok(true) => {}
            Ok(false) | Err(Stop::Abort) => return Steps::Filtered,
            Err(Stop::Fallback) => return Steps::Fallback,
        }
    }
    match cx.write(arena) {
        Ok(value) => Steps::Keep(value),
        Err(_) => Steps::Fallback,
    }
}

/// Size of a block rewritten values are cut from; a block is freed once
/// its records are gone.
const ARENA_BLOCK: usize = 64 * 1024;

/// Where a step writes rewritten values: one buffer reused for every
/// record, and shared blocks the values are cut from, so a record costs
/// no allocation of its own.
#[derive(Debug, Default)]
pub(crate) struct Arena {
    out: Vec<u8>,
    block: BytesMut,
    spare: Spare,
}

/// The vectors one record's evaluation reads into, kept empty between
/// records so that reading a record allocates nothing of its own.
#[derive(Debug, Default)]
pub(crate) struct Spare {
    top: Entries<'static>,
    objects: Vec<check::Object>,
    entries: Vec<Entries<'static>>,
    vars: Vec<Val<'static>>,
    overlay: Vec<(&'static str, Node<'static>)>,
}

impl Arena {
    /// The value just written, cut from the current block.
    fn keep(&mut self) -> Bytes {
        if self.block.capacity() - self.block.len() < self.out.len() {
            self.block.reserve(self.out.len().max(ARENA_BLOCK));
        }
        self.block.extend_from_slice(&self.out);
        self.block.split().freeze()
    }
}

/// Whether the text may hold a number past the range of an `f64`. Reading
/// the record for VRL rejects those (serde_json parses every number); the
/// fast path's reading skips the numbers it does not use, so it leaves
/// such records to VRL: an exponent of 3 digits or more, 10^308 or more
/// (integer digits plus a positive exponent past 308, as the checking
/// pass counts), or 309 digits in a row.
fn past_f64(text: &[u8]) -> bool {
    let big_exponent = memchr::memchr2_iter(b'e', b'E', text).any(|i| {
        i > 0 && (text[i - 1].is_ascii_digit() || text[i - 1] == b'.') && {
            // The digits before the point, leading zero aside.
            let mantissa = text[..i]
                .iter()
                .rev()
                .take_while(|b| b.is_ascii_digit() || **b == b'.')
                .count();
            let mantissa = &text[i - mantissa..i];
            let magnitude = match mantissa.first() {
                Some(b'0') => 0,
                _ => mantissa.iter().take_while(|b| b.is_ascii_digit()).count(),
            };
            let rest = &text[i + 1..];
            let (negative, rest) = match rest.first() {
                Some(b'-') => (true, &rest[1..]),
                Some(b'+') => (false, &rest[1..]),
                _ => (false, rest),
            };
            let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
            let exponent = rest[..digits.min(2)]
                .iter()
                .fold(0, |e, d| e * 10 + usize::from(d - b'0'));
            digits >= 3 || !negative && magnitude + exponent > 308
        }
    });
    if big_exponent {
        return true;
    }
    // A run of 309 digits covers one of every 300 bytes: look around those.
    (0..text.len()).step_by(300).any(|i| {
        text[i].is_ascii_digit() && {
            let before = text[..i].iter().rev().take_while(|b| b.is_ascii_digit());
            let after = text[i..].iter().take_while(|b| b.is_ascii_digit());
            before.count() + after.count() >= 309
        }
    })
}

/// Whether the text may hold a `\u` escape of a UTF-16 surrogate. Reading
/// the record for VRL rejects a lone one, which the check of valid JSON
/// does not look at; such records are left to VRL.
fn surrogate_escape(text: &[u8]) -> bool {
    memchr::memchr_iter(b'\\', text).any(|i| {
        text.get(i + 1) == Some(&b'u')
            && matches!(text.get(i + 2), Some(b'd' | b'D'))
            && matches!(
                text.get(i + 3),
                Some(b'8'..=b'9' | b'a'..=b'f' | b'A'..=b'F')
            )
    })
}

/// A value during evaluation: parsed, or an object or array still as its
/// text in the record.
#[derive(Debug, Clone)]
enum Val<'a> {
    V(Value),
    Raw(&'a str),
}

impl Val<'_> {
    fn into_value(self) -> Run<Value> {
        match self {
            Val::V(v) => Ok(v),
            Val::Raw(text) => Ok(serde_json::from_str(text)?),
        }
    }
}

/// A value read from its text: objects and arrays stay text.
fn val(text: &str) -> Run<Val<'_>> {
    match text.as_bytes().first() {
        Some(b'{' | b'[') => Ok(Val::Raw(text)),
        Some(b'"') => match text.get(1..text.len() - 1) {
            // Without escapes, the string is its text (the reading
            // checked it).
            Some(inner) if text.len() >= 2 && !inner.contains('\\') => Ok(Val::V(Value::Bytes(
                Bytes::copy_from_slice(inner.as_bytes()),
            ))),
            _ => Ok(Val::V(serde_json::from_str(text)?)),
        },
        _ => match plain_number(text) {
            Some(v) => Ok(Val::V(v)),
            None => Ok(Val::V(serde_json::from_str(text)?)),
        },
    }
}

/// A number whose value serde_json's reading gives without rounding
/// choices: an integer of at most 18 digits (not `-0`, which serde_json
/// reads as a float), or a decimal without exponent of at most 15 digits,
/// which one correctly rounded division gives in serde_json as in the
/// standard library. `None` for anything else (read by serde_json).
fn plain_number(text: &str) -> Option<Value> {
    let b = text.as_bytes();
    let unsigned = b.strip_prefix(b"-").unwrap_or(b);
    let negative = unsigned.len() != b.len();
    // One pass: the digits' value (wrapping at 20 digits or more, which are
    // refused below), how many, and how many follow the point.
    let mut mantissa = 0u64;
    let mut digits = 0usize;
    let mut point = None;
    for &c in unsigned {
        match c {
            b'0'..=b'9' => {
                mantissa = mantissa.wrapping_mul(10).wrapping_add(u64::from(c - b'0'));
                digits += 1;
            }
            b'.' if point.is_none() => point = Some(digits),
            _ => return None,
        }
    }
    match point {
        // Below 10^18: an `i64`. `-0` is left to serde_json (a float).
        None if (1..=18).contains(&digits) => match i64::try_from(mantissa).ok()? {
            0 if negative => None,
            n if negative => Some(Value::Integer(-n)),
            n => Some(Value::Integer(n)),
        },
        // Digits on both sides of the point, at most 15 in all: the
        // mantissa and 10^fraction are exact `f64`s, so their quotient,
        // rounded once, is the closest `f64` to the text, as the standard
        // library's and serde_json's readings give it.
        Some(whole) if whole >= 1 && whole < digits && digits <= 15 => {
            let fraction = digits - whole;
            #[allow(clippy::cast_precision_loss)]
            let value = mantissa as f64 / POWERS_OF_TEN[fraction];
            Some(Value::from_f64_or_zero(if negative {
                -value
            } else {
                value
            }))
        }
        _ => None,
    }
}

/// 10^0 to 10^15, each exact as an `f64`.
const POWERS_OF_TEN: [f64; 16] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
];

/// What the program did to an object: its changed fields, each key
/// borrowed from the program's paths (no key is copied for a record).
#[derive(Debug, Default)]
struct Obj<'a>(Vec<(&'a str, Node<'a>)>);

#[derive(Debug)]
enum Node<'a> {
    Set(Value),
    Deleted,
    /// An object of the record with changes inside.
    Children(Obj<'a>),
}

impl<'a> Obj<'a> {
    fn get(&self, key: &str) -> Option<&Node<'a>> {
        self.0.iter().find(|(k, _)| *k == key).map(|(_, n)| n)
    }

    fn slot(&mut self, key: &str) -> Option<&mut Node<'a>> {
        self.0.iter_mut().find(|(k, _)| *k == key).map(|(_, n)| n)
    }

    fn put(&mut self, key: &'a str, node: Node<'a>) -> &mut Node<'a> {
        let i = match self.0.iter().position(|(k, _)| *k == key) {
            Some(i) => {
                self.0[i].1 = node;
                i
            }
            None => {
                self.0.push((key, node));
                self.0.len() - 1
            }
        };
        &mut self.0[i].1
    }
}

/// One record's evaluation.
struct Cx<'a> {
    doc: &'a str,
    top: Entries<'a>,
    vars: Vec<Val<'a>>,
    overlay: Obj<'a>,
    /// The entries of the record's nested objects read so far, by where
    /// the object starts in `doc`: an object a program reads twice
    /// (`.order.status`, then `.order.items`) is scanned once.
    objects: RefCell<Objects<'a>>,
    /// The text whose number was read last (where it starts and its
    /// length), and what it read as (see [`Cx::number`]).
    number: Cell<Option<(TextAt, Option<number::Read>)>>,
}

/// Where a text of the record starts, and its length.
type TextAt = (usize, usize);

/// The entries of a record's nested objects read so far.
#[derive(Debug)]
struct Objects<'a> {
    /// The objects, and where their entries are in `entries`.
    at: Vec<check::Object>,
    /// Vectors of entries: the checking pass's, one per depth from
    /// [`Objects::SCANNED`] + 1 on, and in [`Objects::SCANNED`] those
    /// of the objects read later, when the program reached them.
    entries: Vec<Entries<'a>>,
}

impl<'a> Objects<'a> {
    /// The slot of the objects read after the checking pass: the depth
    /// of no nested object (the top level is at depth 1).
    const SCANNED: usize = 0;

    /// The entries of the object whose text is `text`, a slice of `doc`,
    /// when read.
    fn get(&self, doc: &'a str, text: &str) -> Option<&[Entry<'a>]> {
        let kept = check::Kept {
            doc,
            objects: &self.at,
            entries: &self.entries,
        };
        kept.get(text)
    }
}

fn field(segment: &OwnedSegment) -> Option<&str> {
    match segment {
        OwnedSegment::Field(k) => Some(k.as_str()),
        OwnedSegment::Index(_) => None,
    }
}

impl<'a> Cx<'a> {
    /// The evaluation of one record, its top level read; `None` for what
    /// the fast path leaves to VRL (see [`LiteProgram::run`]).
    fn open(input: &'a [u8], checked: bool, spare: &mut Spare) -> Option<Self> {
        let doc = simdutf8::basic::from_utf8(input).ok()?;
        // The spare vectors are empty ([`Cx::close`] empties them), and
        // taken as they are: a vector of values borrowed for `'static`
        // is one of values borrowed for less.
        let top: Entries<'a> = std::mem::take(&mut spare.top);
        let mut objects = Objects {
            at: std::mem::take(&mut spare.objects),
            entries: std::mem::take(&mut spare.entries),
        };
        objects.at.clear();
        // Unchecked, the reading checks the whole value on the way (and
        // leaves what VRL's reading refuses), keeping the entries of the
        // nested objects it walks; checked, the scanner reads the top
        // level, and nested objects when the program reaches them.
        let top = if checked {
            if past_f64(input) || surrogate_escape(input) {
                return None;
            }
            scan::entries_in(doc, top)?
        } else {
            let nested = check::Nested {
                max_depth: usize::MAX,
                objects: &mut objects.at,
                entries: &mut objects.entries,
            };
            check::entries_keeping(doc, top, nested)?
        };
        Some(Cx {
            doc,
            top,
            vars: std::mem::take(&mut spare.vars),
            overlay: Obj(std::mem::take(&mut spare.overlay)),
            objects: RefCell::new(objects),
            number: Cell::new(None),
        })
    }

    /// Give the evaluation's vectors back, emptied, for the next record.
    fn close(self, spare: &mut Spare) {
        let objects = self.objects.into_inner();
        spare.objects = objects.at;
        spare.entries = scan::recycle_each(objects.entries);
        spare.top = scan::recycle(self.top);
        spare.vars = scan::recycle(self.vars);
        spare.overlay = scan::recycle(self.overlay.0);
    }

    /// Run a program on the record, with its own variables.
    fn program(&mut self, program: &'a LiteProgram) -> Run<Val<'a>> {
        self.vars.clear();
        self.vars.resize(program.vars, Val::V(Value::Null));
        self.block(&program.body)
    }

    /// The record with the programs' changes, when there are any.
    fn write(&self, arena: &mut Arena) -> serde_json::Result<Option<Bytes>> {
        if self.overlay.0.is_empty() {
            return Ok(None);
        }
        arena.out.clear();
        Ok(write_object(
            &Known {
                doc: self.doc,
                objects: &self.objects.borrow(),
            },
            self.doc,
            Some(&self.top),
            &self.overlay,
            1,
            &mut arena.out,
        )?
        .then(|| arena.keep()))
    }

    /// Whether a declarative filter holds on the record as read, as
    /// [`JsonStage`](crate::JsonStage)'s fast path decides it.
    fn json_filter(&self, filter: &JsonFilter) -> Run<bool> {
        if !self.overlay.0.is_empty() {
            return Err(Stop::Fallback);
        }
        let first = filter.path.first().ok_or(Stop::Fallback)?;
        let top = last_of(&self.top, first)?;
        // A top-level number, read once for every filter comparing it
        // (as `filter_on` compares it: `number::compare` is this).
        if let (Some(text), [_]) = (top, filter.path.as_slice())
            && let Some(n) = self.number(text)
        {
            return Ok(n.passes(filter.op, &filter.constant));
        }
        filter_on(top, filter)
    }

    /// The number `text` reads as ([`number::read`]), read once while
    /// the filters of the run and a router's conditions compare the same
    /// value: the last text read is kept, by its place and length (a
    /// slice of the record, which does not change while it is read).
    fn number(&self, text: &'a str) -> Option<number::Read> {
        let at = (text.as_ptr().addr(), text.len());
        if let Some((was, read)) = self.number.get()
            && was == at
        {
            return read;
        }
        let read = number::read(text);
        self.number.set(Some((at, read)));
        read
    }

    fn block(&mut self, exprs: &'a [Expr]) -> Run<Val<'a>> {
        let mut last = Val::V(Value::Null);
        for e in exprs {
            last = self.eval(e)?;
        }
        Ok(last)
    }

    fn value(&mut self, e: &'a Expr) -> Run<Value> {
        self.eval(e)?.into_value()
    }

    fn eval(&mut self, e: &'a Expr) -> Run<Val<'a>> {
        Ok(match e {
            Expr::Lit(v) => Val::V(v.clone()),
            Expr::Event(path) => self.read(path)?.unwrap_or_else(|| Val::V(Value::Null)),
            Expr::Var(slot, path) => {
                let v = self.vars[*slot].clone();
                self.at(v, path)?.unwrap_or_else(|| Val::V(Value::Null))
            }
            Expr::Op(lhs, op, rhs) => Val::V(self.op(lhs, *op, rhs)?),
            Expr::Not(inner) => match self.value(inner)? {
                Value::Boolean(b) => Val::V(Value::Boolean(!b)),
                _ => return Err(Stop::Fallback),
            },
            Expr::Call(func, arg) => {
                let arg = self.eval(arg)?;
                call(*func, arg)?
            }
            Expr::Del(path) => Val::V(self.delete(path)?.unwrap_or(Value::Null)),
            Expr::SetField(path, value) => {
                let value = self.value(value)?;
                self.set(path, value.clone())?;
                Val::V(value)
            }
            Expr::SetVar(slot, value) => {
                let value = self.eval(value)?;
                self.vars[*slot] = value.clone();
                value
            }
            Expr::If(predicate, then, otherwise) => match self.value(predicate)? {
                Value::Boolean(true) => self.block(then)?,
                Value::Boolean(false) => match otherwise {
                    Some(b) => self.block(b)?,
                    None => Val::V(Value::Null),
                },
                _ => return Err(Stop::Fallback),
            },
            Expr::Block(exprs) => self.block(exprs)?,
            Expr::Num(num, written) => match self.num(num)? {
                Some(n) => Val::V(n.into_value()),
                None => self.eval(written)?,
            },
            Expr::Abort => return Err(Stop::Abort),
            Expr::ForEach {
                array,
                index,
                item,
                body,
            } => {
                let Val::Raw(text) = self.eval(array)? else {
                    return Err(Stop::Fallback);
                };
                if !text.starts_with('[') {
                    return Err(Stop::Fallback);
                }
                // The closure's names shadow the program's while it runs.
                let saved = (self.vars[*index].clone(), self.vars[*item].clone());
                let elements = self.items(text).ok_or(Stop::Fallback)?;
                for (i, element) in elements.into_iter().enumerate() {
                    self.vars[*index] = Val::V(Value::Integer(i64::try_from(i)?));
                    self.vars[*item] = val(element)?;
                    self.block(body)?;
                }
                (self.vars[*index], self.vars[*item]) = saved;
                Val::V(Value::Null)
            }
        })
    }

    /// The number `e` gives; `None` when a read in it is not a number
    /// (the expression as written decides then).
    fn num(&mut self, e: &'a NumExpr) -> Run<Option<Num>> {
        Ok(Some(match e {
            NumExpr::Lit(n) => *n,
            NumExpr::Read(read) => match self.eval(read)? {
                Val::V(Value::Integer(i)) => Num::Int(i),
                Val::V(Value::Float(f)) => Num::Float(f.into_inner()),
                _ => return Ok(None),
            },
            NumExpr::Op(lhs, op, rhs) => {
                let Some(a) = self.num(lhs)? else {
                    return Ok(None);
                };
                let Some(b) = self.num(rhs)? else {
                    return Ok(None);
                };
                a.arithmetic(*op, b)?
            }
            NumExpr::Call(func, arg) => match self.num(arg)? {
                Some(n) => n.call(*func)?,
                None => return Ok(None),
            },
        }))
    }

    fn op(&mut self, lhs: &'a Expr, op: Opcode, rhs: &'a Expr) -> Run<Value> {
        // A field compared with a string: its text, when it is a plain
        // string, is compared as it stands, without copying it out.
        if let (Opcode::Eq | Opcode::Ne, Expr::Event(path), Expr::Lit(literal)) = (op, lhs, rhs)
            && let Some(literal) = string_bytes(literal)
            && let Some(inner) = self.plain_string(path)?
        {
            let equal = inner.as_bytes() == literal;
            return Ok(Value::Boolean(equal == matches!(op, Opcode::Eq)));
        }
        let l = self.value(lhs)?;
        match op {
            Opcode::Or => {
                return match l {
                    Value::Null | Value::Boolean(false) => self.value(rhs),
                    v => Ok(v),
                };
            }
            Opcode::And => {
                return match l {
                    Value::Null | Value::Boolean(false) => Ok(Value::Boolean(false)),
                    v => Ok(v.try_and(self.value(rhs)?)?),
                };
            }
            _ => {}
        }
        let r = self.value(rhs)?;
        if let Some(value) = arithmetic(&l, op, &r)? {
            // Two numbers: nothing to drop.
            std::mem::forget((l, r));
            return Ok(value);
        }
        Ok(match op {
            Opcode::Mul => l.try_mul(r)?,
            Opcode::Div => l.try_div(r)?,
            Opcode::Add => l.try_add(r)?,
            Opcode::Sub => l.try_sub(r)?,
            Opcode::Eq => Value::Boolean(l.eq_lossy(&r)),
            Opcode::Ne => Value::Boolean(!l.eq_lossy(&r)),
            Opcode::Gt => l.try_gt(r)?,
            Opcode::Ge => l.try_ge(r)?,
            Opcode::Lt => l.try_lt(r)?,
            Opcode::Le => l.try_le(r)?,
            Opcode::Or | Opcode::And | Opcode::Merge | Opcode::Err => return Err(Stop::Fallback),
        })
    }

    /// The value at an event path, with the program's changes: `None`
    /// when there is none.
    fn read(&self, path: &[OwnedSegment]) -> Run<Option<Val<'a>>> {
        let mut node = Some(&self.overlay);
        for (i, segment) in path.iter().enumerate() {
            let Some(obj) = node else { break };
            let Some(key) = field(segment) else {
                // An index into an object: nothing.
                return Ok(None);
            };
            match obj.get(key) {
                Some(Node::Set(v)) => return Ok(v.get(&path[i + 1..]).cloned().map(Val::V)),
                Some(Node::Deleted) => return Ok(None),
                Some(Node::Children(o)) => node = Some(o),
                None => node = None,
            }
        }
        if let Some(changes) = node {
            // An object of the record with changes inside: built.
            let Some(text) = self.original(path)? else {
                return Err(Stop::Fallback);
            };
            let mut value: Value = serde_json::from_str(text)?;
            changed(&mut value, changes);
            return Ok(Some(Val::V(value)));
        }
        self.original(path)?.map(val).transpose()
    }

    /// The text between the quotes of the string at an event path, when
    /// the program changed nothing under the path's first field and the
    /// string has no escapes (its text is then its value).
    fn plain_string(&self, path: &[OwnedSegment]) -> Run<Option<&'a str>> {
        let Some(first) = path.first().and_then(field) else {
            return Ok(None);
        };
        if self.overlay.get(first).is_some() {
            return Ok(None);
        }
        Ok(self.original(path)?.and_then(|text| {
            let inner = text.strip_prefix('"')?.strip_suffix('"')?;
            (!inner.contains('\\')).then_some(inner)
        }))
    }

    /// The text at a path in the record as read.
    #[inline(always)]
    fn original(&self, path: &[OwnedSegment]) -> Run<Option<&'a str>> {
        let Some((first, rest)) = path.split_first() else {
            return Ok(Some(self.doc));
        };
        let Some(key) = field(first) else {
            return Ok(None);
        };
        let Some(mut text) = last_of(&self.top, key)? else {
            return Ok(None);
        };
        for segment in rest {
            match self.child(text, segment)? {
                Some(t) => text = t,
                None => return Ok(None),
            }
        }
        Ok(Some(text))
    }

    /// The value at `path` inside `v`.
    fn at(&self, v: Val<'a>, path: &[OwnedSegment]) -> Run<Option<Val<'a>>> {
        if path.is_empty() {
            return Ok(Some(v));
        }
        match v {
            Val::V(v) => Ok(v.get(path).cloned().map(Val::V)),
            Val::Raw(mut text) => {
                for segment in path {
                    match self.child(text, segment)? {
                        Some(t) => text = t,
                        None => return Ok(None),
                    }
                }
                Ok(Some(val(text)?))
            }
        }
    }

    /// The items of the text of an array of the record: an object among
    /// them that the reading kept is not walked again.
    fn items(&self, text: &'a str) -> Option<Vec<&'a str>> {
        let base = text.as_ptr().addr().wrapping_sub(self.doc.as_ptr().addr());
        if base.saturating_add(text.len()) > self.doc.len() {
            return scan::items(text);
        }
        let objects = self.objects.borrow();
        let kept = check::Kept {
            doc: self.doc,
            objects: &objects.at,
            entries: &objects.entries,
        };
        let b = text.as_bytes();
        scan::items_with(text, |i| {
            (b.get(i) == Some(&b'{'))
                .then(|| kept.end(base + i).map(|end| end - base))
                .flatten()
        })
    }

    /// The value one segment down from the text of an object or array of
    /// the record: an object's entries are read once per record.
    fn child(&self, text: &'a str, segment: &OwnedSegment) -> Run<Option<&'a str>> {
        let (OwnedSegment::Field(key), Some(b'{')) = (segment, text.as_bytes().first()) else {
            return child(text, segment);
        };
        let doc = self.doc.as_ptr().addr();
        let start = text.as_ptr().addr().wrapping_sub(doc);
        if start.saturating_add(text.len()) > self.doc.len() {
            return child(text, segment);
        }
        let mut objects = self.objects.borrow_mut();
        if let Some(entries) = objects.get(self.doc, text) {
            return last_of(entries, key.as_str());
        }
        let slot = Objects::SCANNED;
        if objects.entries.len() <= slot {
            objects.entries.resize_with(slot + 1, Vec::new);
        }
        let scanned = &mut objects.entries[slot];
        let from = scanned.len();
        scan::append_entries(text, scanned).ok_or(Stop::Fallback)?;
        let range = from..scanned.len();
        let found = last_of(&scanned[range.clone()], key.as_str())?;
        objects.at.push(check::Object {
            at: start,
            end: 0,
            slot,
            entries: range,
        });
        Ok(found)
    }

    /// The overlay object for the fields at `path` (an object of the
    /// record, or one the program made), creating the entries on the way.
    /// `Err(value)` when a value the program set is on the way: the rest
    /// of the path is in it.
    fn parent(
        &mut self,
        path: &'a [OwnedSegment],
    ) -> Run<Result<&mut Obj<'a>, (&mut Value, usize)>> {
        // Check the record's objects on the way first (the borrow below
        // cannot read the record).
        let mut known = 0;
        {
            let mut node = Some(&self.overlay);
            for segment in path {
                let key = field(segment).ok_or(Stop::Fallback)?;
                match node.and_then(|o| o.get(key)) {
                    Some(Node::Children(o)) => node = Some(o),
                    Some(_) => break,
                    None => node = None,
                }
                known += 1;
            }
        }
        for i in 0..known {
            let text = self.original(&path[..=i])?;
            let is_object = text.is_some_and(|t| t.starts_with('{'));
            let in_overlay = self.overlay_at(&path[..=i]);
            if !in_overlay && !is_object {
                return Err(Stop::Fallback);
            }
        }
        let mut obj = &mut self.overlay;
        for (i, segment) in path.iter().enumerate() {
            let key = field(segment).ok_or(Stop::Fallback)?;
            if obj.get(key).is_none() {
                obj.put(key, Node::Children(Obj::default()));
            }
            match obj.slot(key) {
                Some(Node::Children(o)) => obj = o,
                Some(Node::Set(v)) => return Ok(Err((v, i + 1))),
                Some(Node::Deleted) | None => return Err(Stop::Fallback),
            }
        }
        Ok(Ok(obj))
    }

    /// Whether the overlay has an entry for exactly this path.
    fn overlay_at(&self, path: &[OwnedSegment]) -> bool {
        let mut obj = &self.overlay;
        for (i, segment) in path.iter().enumerate() {
            let Some(key) = field(segment) else {
                return false;
            };
            match obj.get(key) {
                Some(Node::Children(o)) => obj = o,
                Some(_) => return i + 1 == path.len(),
                None => return false,
            }
        }
        true
    }

    fn set(&mut self, path: &'a [OwnedSegment], value: Value) -> Run<()> {
        let (last, parents) = path.split_last().ok_or(Stop::Fallback)?;
        let key = field(last).ok_or(Stop::Fallback)?;
        match self.parent(parents)? {
            Ok(obj) => {
                obj.put(key, Node::Set(value));
            }
            Err((v, from)) => {
                v.insert(&path[from..], value);
            }
        }
        Ok(())
    }

    fn delete(&mut self, path: &'a [OwnedSegment]) -> Run<Option<Value>> {
        let (last, parents) = path.split_last().ok_or(Stop::Fallback)?;
        let key = field(last).ok_or(Stop::Fallback)?;
        let Some(old) = self.read(path)? else {
            return Ok(None);
        };
        let old = old.into_value()?;
        match self.parent(parents)? {
            Ok(obj) => {
                obj.put(key, Node::Deleted);
            }
            Err((v, from)) => {
                v.remove(&path[from..], false);
            }
        }
        Ok(Some(old))
    }
}

/// The bytes of a string value (VRL compares strings by their bytes,
/// whichever of its two string forms holds them).
fn string_bytes(value: &Value) -> Option<&[u8]> {
    match value {
        Value::Bytes(b) => Some(b),
        Value::String(s) => Some(s.as_bytes()),
        _ => None,
    }
}

/// `+`, `-` or `*` of two numbers, as VRL's operators give it (integers
/// wrap, a float result that is NaN is an error); `None` for anything
/// else (VRL's own operators decide it).
#[inline]
fn arithmetic(l: &Value, op: Opcode, r: &Value) -> Run<Option<Value>> {
    #[allow(clippy::cast_precision_loss)]
    let (a, b) = match (l, r) {
        (Value::Integer(a), Value::Integer(b)) => {
            return Ok(match op {
                Opcode::Add => Some(Value::Integer(a.wrapping_add(*b))),
                Opcode::Sub => Some(Value::Integer(a.wrapping_sub(*b))),
                Opcode::Mul => Some(Value::Integer(a.wrapping_mul(*b))),
                _ => None,
            });
        }
        (Value::Integer(a), Value::Float(b)) => (*a as f64, b.into_inner()),
        (Value::Float(a), Value::Integer(b)) => (a.into_inner(), *b as f64),
        (Value::Float(a), Value::Float(b)) => (a.into_inner(), b.into_inner()),
        _ => return Ok(None),
    };
    let x = match op {
        Opcode::Add => a + b,
        Opcode::Sub => a - b,
        Opcode::Mul => a * b,
        _ => return Ok(None),
    };
    if x.is_nan() {
        return Err(Stop::Fallback);
    }
    Ok(Some(Value::from_f64_or_zero(x)))
}

/// Apply the changes in `obj` to the object `value`.
fn changed(value: &mut Value, obj: &Obj<'_>) {
    let Value::Object(map) = value else { return };
    for (key, node) in &obj.0 {
        match node {
            Node::Set(v) => {
                map.insert((*key).into(), v.clone());
            }
            Node::Deleted => {
                map.remove(*key);
            }
            Node::Children(inner) => {
                if let Some(child) = map.get_mut(*key) {
                    changed(child, inner);
                }
            }
        }
    }
}

fn call<'a>(func: Func, arg: Val<'a>) -> Run<Val<'a>> {
    let rounded = |f: fn(f64) -> f64, v: Value| match v {
        Value::Float(x) => Ok(Value::from_f64_or_zero(f(x.into_inner()))),
        v @ Value::Integer(_) => Ok(v),
        _ => Err(Stop::Fallback),
    };
    let is = |ok: bool, v: Val<'a>| if ok { Ok(v) } else { Err(Stop::Fallback) };
    let raw = |v: &Val<'_>, open: char| matches!(v, Val::Raw(t) if t.starts_with(open));
    Ok(Val::V(match func {
        Func::Array => {
            let ok = raw(&arg, '[') || matches!(arg, Val::V(Value::Array(_)));
            return is(ok, arg);
        }
        Func::Object => {
            let ok = raw(&arg, '{') || matches!(arg, Val::V(Value::Object(_)));
            return is(ok, arg);
        }
        Func::Float => return is(matches!(arg, Val::V(Value::Float(_))), arg),
        Func::Int => return is(matches!(arg, Val::V(Value::Integer(_))), arg),
        Func::String => {
            let ok = matches!(arg, Val::V(Value::Bytes(_) | Value::String(_)));
            return is(ok, arg);
        }
        Func::Bool => return is(matches!(arg, Val::V(Value::Boolean(_))), arg),
        Func::ToFloat => match arg {
            Val::V(v @ Value::Float(_)) => v,
            Val::V(Value::Integer(i)) => Value::from_f64_or_zero(i as f64),
            _ => return Err(Stop::Fallback),
        },
        Func::ToInt => match arg {
            Val::V(v @ Value::Integer(_)) => v,
            #[allow(clippy::cast_possible_truncation)]
            Val::V(Value::Float(f)) => Value::Integer(f.into_inner() as i64),
            _ => return Err(Stop::Fallback),
        },
        Func::Round => rounded(f64::round, arg.into_value()?)?,
        Func::Floor => rounded(f64::floor, arg.into_value()?)?,
        Func::Ceil => rounded(f64::ceil, arg.into_value()?)?,
    }))
}

/// Whether a declarative filter holds on a record whose top-level field
/// named by the filter's first segment has the text `top` (`None`: no
/// such field), as [`JsonStage`](crate::JsonStage)'s fast path decides
/// it.
fn filter_on(top: Option<&str>, filter: &JsonFilter) -> Run<bool> {
    let rest = filter.path.get(1..).ok_or(Stop::Fallback)?;
    let mut text = top;
    for segment in rest {
        let Some(t) = text else { break };
        text = match t.as_bytes().first() {
            Some(b'{') => scan::find(t, segment).ok_or(Stop::Fallback)?,
            Some(b'[') => match crate::ops::index(segment) {
                Some(i) => scan::items(t).ok_or(Stop::Fallback)?.get(i).copied(),
                None => None,
            },
            _ => None,
        };
    }
    // A number's text is compared without parsing it, when read exactly
    // (the same number serde_json reads).
    if let Some(held) = text.and_then(|t| number::compare(t, filter.op, &filter.constant)) {
        return Ok(held);
    }
    // As the JSON stage reads it: a top-level value that does not parse
    // is null, a nested one missing.
    let found: Option<serde_json::Value> = match text {
        Some(t) if rest.is_empty() => {
            Some(serde_json::from_str(t).unwrap_or(serde_json::Value::Null))
        }
        Some(t) => serde_json::from_str(t).ok(),
        None => None,
    };
    Ok(crate::ops::compare(
        found.as_ref(),
        filter.op,
        &filter.value,
    ))
}

/// The last value of `key` among an object's entries; not decided here
/// when a key after it does not decode.
#[inline(always)]
fn last_of<'a>(entries: &[Entry<'a>], key: &str) -> Run<Option<&'a str>> {
    scan::last(entries, key).ok_or(Stop::Fallback)
}

/// The value one segment down from an object's or array's text.
fn child<'a>(text: &'a str, segment: &OwnedSegment) -> Run<Option<&'a str>> {
    match (segment, text.as_bytes().first()) {
        (OwnedSegment::Field(key), Some(b'{')) => {
            scan::find(text, key.as_str()).ok_or(Stop::Fallback)
        }
        (OwnedSegment::Index(i), Some(b'[')) => {
            let items = scan::items(text).ok_or(Stop::Fallback)?;
            let i = if *i < 0 {
                items.len().checked_sub(i.unsigned_abs())
            } else {
                Some(i.unsigned_abs())
            };
            Ok(i.and_then(|i| items.get(i).copied()))
        }
        _ => Ok(None),
    }
}

fn comma(out: &mut Vec<u8>, first: &mut bool) {
    if !std::mem::take(first) {
        out.push(b',');
    }
}

/// A key as serde_json writes it.
fn write_key(out: &mut Vec<u8>, key: &str) -> serde_json::Result<()> {
    if key.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
        serde_json::to_writer(&mut *out, key)?;
    } else {
        out.push(b'"');
        out.extend_from_slice(key.as_bytes());
        out.push(b'"');
    }
    out.push(b':');
    Ok(())
}

/// A value as serde_json writes it; an integer (what `to_int` and
/// counters make) without going through serde.
fn write_value(out: &mut Vec<u8>, value: &Value) -> serde_json::Result<()> {
    match value {
        Value::Integer(i) => {
            out.extend_from_slice(itoa::Buffer::new().format(*i).as_bytes());
            Ok(())
        }
        _ => serde_json::to_writer(&mut *out, value),
    }
}

/// The record being written and its nested objects read so far.
struct Known<'k, 'a> {
    doc: &'k str,
    objects: &'k Objects<'a>,
}

/// Write the object `text` (its entries `read`, when already read) with
/// the changes in `obj`, as [`faithful::write`] writes it. Whether it
/// changed; when it did not, its original text is what was written.
///
/// `depth`: the object's nesting, the record's own counting as 1. A value
/// written that would nest the record deeper than [`scan::MAX_DEPTH`] is
/// an error (the record is left to the stages): a value read from the
/// record and written inside an object it was not in (`.a.b = .d`) can
/// make the record one level deeper than it was read, past what a later
/// stage, or a router's condition, reads.
fn write_object(
    known: &Known<'_, '_>,
    text: &str,
    read: Option<&[Entry<'_>]>,
    obj: &Obj<'_>,
    depth: usize,
    out: &mut Vec<u8>,
) -> serde_json::Result<bool> {
    let owned;
    let entries = match read {
        Some(e) => e,
        None => {
            owned = scan::entries(text)
                .ok_or_else(|| serde::de::Error::custom("an object the fast path cannot read"))?;
            &owned
        }
    };
    // Keys without escapes are one key when written alike, and each is
    // its text: an object without a key with escapes (nearly every one)
    // is written by a copy of the writer that never decodes.
    if entries.iter().any(|(k, _)| k.escaped()) {
        write_entries::<true>(known, text, entries, obj, depth, out)
    } else {
        write_entries::<false>(known, text, entries, obj, depth, out)
    }
}

/// [`write_object`] once the object's entries are read; `ESCAPES`: some
/// key has escapes (else each key is compared and written as it stands).
fn write_entries<'o, 'k, const ESCAPES: bool>(
    known: &Known<'_, '_>,
    text: &str,
    entries: &[Entry<'_>],
    obj: &'o Obj<'k>,
    depth: usize,
    out: &mut Vec<u8>,
) -> serde_json::Result<bool> {
    let start = out.len();
    let mut changed = false;
    let mut first = true;
    let mut run = Verbatim::new(text);
    // Only the last of duplicate keys is live. With keys with escapes,
    // each key is decoded once for the object rather than at every
    // comparison with a later one.
    let shadowed = if ESCAPES {
        scan::shadowed(entries).ok_or_else(undecoded)?
    } else {
        Vec::new()
    };
    out.push(b'{');
    for (i, &(key, raw)) in entries.iter().enumerate() {
        let duplicate = if ESCAPES {
            shadowed.get(i).copied().unwrap_or(false)
        } else {
            entries[i + 1..].iter().any(|(k, _)| k.alike(key))
        };
        if duplicate {
            continue;
        }
        // A key with escapes is decoded here, where its value is needed,
        // and written as serde_json writes it.
        let plain = if ESCAPES {
            key.plain()
        } else {
            Some(key.held())
        };
        let decoded: String;
        let name = match plain {
            Some(name) => name,
            None => {
                decoded = decode(key)?;
                &decoded
            }
        };
        let node = obj.get(name);
        if node.is_none()
            && let Some(name) = plain
            && let Some(from) = Verbatim::start(text, name, raw)
        {
            let end = raw.as_ptr().addr() - text.as_ptr().addr() + raw.len();
            run.take(from, end, out, &mut first);
            continue;
        }
        run.flush(out, &mut first);
        match node {
            None => {
                comma(out, &mut first);
                write_key(out, name)?;
                out.extend_from_slice(raw.trim().as_bytes());
            }
            Some(Node::Deleted) => changed = true,
            Some(Node::Set(new)) => {
                within(new, depth)?;
                comma(out, &mut first);
                write_key(out, name)?;
                let old: Value = serde_json::from_str(raw)?;
                changed |= old != *new;
                faithful::write(raw, &old, new, out)?;
            }
            Some(Node::Children(inner)) => {
                comma(out, &mut first);
                write_key(out, name)?;
                let read = known.objects.get(known.doc, raw);
                changed |= write_object(known, raw, read, inner, depth + 1, out)?;
            }
        }
    }
    run.flush(out, &mut first);
    // The fields the object did not have, in key order. Changes inside an
    // object the record does not have cannot be made (see `Cx::parent`);
    // deleting a missing key is none.
    let mut write_added = |key: &str, value: &Value| -> serde_json::Result<()> {
        within(value, depth)?;
        changed = true;
        comma(out, &mut first);
        write_key(out, key)?;
        write_value(out, value)
    };
    // A program's one new field, the common case, needs no vector; more
    // are sorted (the overlay has each key once).
    let mut one: Option<(&str, &Value)> = None;
    let mut more: Vec<(&str, &Value)> = Vec::new();
    for (key, node) in &obj.0 {
        let Node::Set(value) = node else { continue };
        let last = if ESCAPES {
            scan::last(entries, key)
        } else {
            Some(
                entries
                    .iter()
                    .rev()
                    .find(|(k, _)| k.held() == *key)
                    .map(|e| e.1),
            )
        };
        match last {
            Some(None) if one.is_none() => one = Some((key, value)),
            Some(None) => more.push((key, value)),
            Some(Some(_)) => {}
            None => return Err(undecoded()),
        }
    }
    if let Some((key, value)) = one {
        if more.is_empty() {
            write_added(key, value)?;
        } else {
            more.push((key, value));
            more.sort_by(|a, b| a.0.cmp(b.0));
            for (key, value) in more {
                write_added(key, value)?;
            }
        }
    }
    out.push(b'}');
    if !changed {
        out.truncate(start);
        out.extend_from_slice(text.trim().as_bytes());
    }
    Ok(changed)
}

/// The error of a key the fast path cannot decode: the record is left to
/// VRL. (The readers refuse such keys before: not met.)
#[cold]
fn undecoded() -> serde_json::Error {
    serde::de::Error::custom("a key the fast path cannot decode")
}

/// The value of a key with escapes.
#[cold]
#[inline(never)]
fn decode(key: scan::RawKey<'_>) -> serde_json::Result<String> {
    key.decoded().map(Cow::into_owned).ok_or_else(undecoded)
}

/// An error unless `value`, written in an object nested `depth` deep,
/// leaves the record within [`scan::MAX_DEPTH`] levels.
fn within(value: &Value, depth: usize) -> serde_json::Result<()> {
    if deeper_than(value, scan::MAX_DEPTH.saturating_sub(depth)) {
        return Err(serde::de::Error::custom(
            "a value written past the nesting the fast path reads",
        ));
    }
    Ok(())
}

/// Whether `value` nests more than `levels` containers deep (a scalar
/// none, `[]` one); it looks no deeper than `levels`.
fn deeper_than(value: &Value, levels: usize) -> bool {
    match value {
        Value::Object(map) => levels == 0 || map.values().any(|v| deeper_than(v, levels - 1)),
        Value::Array(items) => levels == 0 || items.iter().any(|v| deeper_than(v, levels - 1)),
        _ => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    mod grammar;

    fn run(program: &str, input: &str) -> Lite {
        LiteProgram::new(program).expect("in the fast subset").run(
            input.as_bytes(),
            &mut Arena::default(),
            true,
            false,
        )
    }

    fn written(program: &str, input: &str) -> String {
        match run(program, input) {
            Lite::Done(Some(b), _) => String::from_utf8(b.to_vec()).unwrap(),
            Lite::Done(None, _) => input.to_owned(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_subset_is_recognised() {
        for inside in [
            ".a = 1",
            "del(.a.b)",
            "if .a > 1 { abort } else { .b = true }",
            "x = 0.0\nfor_each(array!(.items)) -> |_i, it| { x = x + to_float!(it.q) }\n.t = to_int(round(x * 100))",
            ".n = .a.b[0].c + .d[-1]",
            "!(.a == \"x\") && .b != null || .c",
        ] {
            assert!(LiteProgram::new(inside).is_some(), "{inside}");
        }
        for outside in [
            ".a = upcase(string!(.b))",
            ". = {\"a\": 1}",
            ".k = %key",
            ".a = [1, 2]",
            ".a[0] = 1",
            "x, err = to_int(.a)",
            ".a |= {}",
            "for_each(object!(.o)) -> |k, v| { .x = v }; .m = .a ?? 1",
        ] {
            assert!(LiteProgram::new(outside).is_none(), "{outside}");
        }
    }

    /// The numeric forms of a program: how many, and how many nodes they
    /// hold in all.
    fn numeric_forms(program: &LiteProgram) -> (usize, usize) {
        fn nodes(n: &NumExpr) -> usize {
            match n {
                NumExpr::Lit(_) | NumExpr::Read(_) => 1,
                NumExpr::Op(l, _, r) => 1 + nodes(l) + nodes(r),
                NumExpr::Call(_, a) => 1 + nodes(a),
            }
        }
        fn walk(e: &Expr, found: &mut (usize, usize)) {
            match e {
                Expr::Num(n, written) => {
                    found.0 += 1;
                    found.1 += nodes(n);
                    walk(written, found);
                }
                Expr::Op(l, _, r) => {
                    walk(l, found);
                    walk(r, found);
                }
                Expr::Not(i) | Expr::Call(_, i) | Expr::SetField(_, i) | Expr::SetVar(_, i) => {
                    walk(i, found);
                }
                Expr::If(p, t, o) => {
                    walk(p, found);
                    t.iter()
                        .chain(o.iter().flatten())
                        .for_each(|e| walk(e, found));
                }
                Expr::Block(b) => b.iter().for_each(|e| walk(e, found)),
                Expr::ForEach { array, body, .. } => {
                    walk(array, found);
                    body.iter().for_each(|e| walk(e, found));
                }
                _ => {}
            }
        }
        let mut found = (0, 0);
        program.body.iter().for_each(|e| walk(e, &mut found));
        found
    }

    /// Each largest numeric expression gets one numeric form, none inside
    /// another: a sum of a hundred fields is one form of 199 nodes (built
    /// level by level, each level's form copied its children's, 5,000
    /// nodes in all), and a read that is not a number makes the
    /// expression as written run once, not once a level.
    #[test]
    fn a_numeric_expression_has_one_numeric_form_however_long() {
        let sum = (0..100)
            .map(|i| format!(".a{i}"))
            .collect::<Vec<_>>()
            .join(" + ");
        let program = LiteProgram::new(&format!(".t = {sum}")).unwrap();
        assert_eq!(numeric_forms(&program), (1, 199));
        let program =
            LiteProgram::new(".t = to_int(round(to_float!(.a) * 100))\nif .b > 1 { .c = .b * 2 }")
                .unwrap();
        // The comparison is no number: its operand `.b * 2`'s is.
        assert_eq!(numeric_forms(&program), (2, 6 + 3));
        // Numbers read: what VRL writes. A read that is not a number: the
        // expression as written decides (here: leaves it to VRL, as
        // `to_float!` of a string is not decided on the fast path).
        let program = ".t = to_int(round(to_float!(.n) * 2)) + 1";
        for record in [r#"{"n":2.5}"#, r#"{"n":-7}"#, r#"{"n":123456789.125}"#] {
            assert_eq!(
                written(program, record),
                by_vrl(program, record),
                "{record}"
            );
        }
        assert_eq!(run(program, r#"{"n":"2.5"}"#), Lite::Fallback);
    }

    #[test]
    fn a_value_written_past_the_nesting_limit_is_left_to_vrl() {
        let deep = |n: usize| format!(r#"{{"a":{{}},"d":{}{}}}"#, "[".repeat(n), "]".repeat(n));
        // 126 levels read, 127 written: as deep as the readers go.
        assert!(written(".a.b = .d", &deep(125)).starts_with(r#"{"a":{"b":[["#));
        // 127 read, 128 written: past it, VRL writes the record.
        assert!(matches!(run(".a.b = .d", &deep(126)), Lite::Fallback));
        assert!(matches!(run(".e = .d", &deep(126)), Lite::Done(Some(_), _)));
    }

    #[test]
    fn rewrites_keep_what_the_program_did_not_change() {
        assert_eq!(
            written(
                "del(.c.email)\n.t = to_int(round(to_float!(.c.n) * 100))",
                r#"{"z":1.50,"c":{"email":"x@y","n":2.5, "s":"caf\u00e9"},"a":[1, 2]}"#
            ),
            r#"{"z":1.50,"c":{"n":2.5,"s":"caf\u00e9"},"a":[1, 2],"t":250}"#
        );
        let input = r#"{ "a" : 1 , "b":2.0 }"#;
        assert_eq!(written(".a = 1\ndel(.x.y)", input), input);
        assert_eq!(written(".a = 2\n.a = 1", input), input);
    }

    #[test]
    fn for_each_walks_the_items_the_reading_kept() {
        let program = "t = 0.0\nfor_each(array!(.items)) -> |_i, it| { t = t + to_float!(it.qty) * to_float!(it.price) }\n.total_cents = to_int(round(t * 100))";
        // Objects the reading kept (one with an object inside, one with
        // space before its brace), between spaces and commas.
        let items = r#"[ {"qty":2,"price":1 } , {"qty":3,"price":0.25} ,{"o":{"qty":0}, "qty":1,"price":0.5}]"#;
        assert_eq!(
            written(program, &format!(r#"{{"items":{items}}}"#)),
            format!(r#"{{"items":{items},"total_cents":325}}"#)
        );
    }

    /// What VRL's runtime writes for `program` on `input`.
    fn by_vrl(program: &str, input: &str) -> String {
        use crate::{Remap, VrlProgram};
        use etl_record::{Position, Record};
        use etl_transform::{Outcome, Transform};
        let compiled = VrlProgram::remap(program).unwrap().runtime_only();
        match Remap::new("r", compiled).apply(Record::new(Position::default(), input.to_owned())) {
            Outcome::Keep(r) => String::from_utf8(r.value.to_vec()).unwrap(),
            _ => panic!("VRL keeps {input}"),
        }
    }

    #[test]
    fn keys_with_escapes_are_the_keys_they_decode_to() {
        for (program, input, expected) in [
            // `"a\u0062"` is `"ab"`: of duplicates, however written, the
            // last is live, and is written once, where it stands.
            (
                ".c = .ab",
                r#"{"a\u0062":1,"ab":2,"c":0}"#,
                r#"{"ab":2,"c":2}"#,
            ),
            (
                ".c = .ab",
                r#"{"ab":2,"a\u0062":1,"c":0}"#,
                r#"{"ab":1,"c":1}"#,
            ),
            ("del(.ab)", r#"{"a\u0062":1,"c":0}"#, r#"{"c":0}"#),
            (".ab = 5", r#"{"c":0,"a\u0062":1}"#, r#"{"c":0,"ab":5}"#),
            // A key with escapes in an object the program changes is
            // written as serde_json writes its value (as VRL's writer
            // does), whether the program touched it or not.
            (
                ".a = 1",
                r#"{"k\"q":1,"caf\u00e9":2,"x\/y":3,"a":0}"#,
                r#"{"k\"q":1,"café":2,"x/y":3,"a":1}"#,
            ),
            // Nested: read and changed by the decoded key; keys a plain
            // key is only a part of are not it.
            (
                ".o.c = .o.b",
                r#"{"o":{"\u0062":1,"c":2}}"#,
                r#"{"o":{"b":1,"c":1}}"#,
            ),
            (
                ".o.d = .o.b",
                r#"{"o":{"\u0062\\":1,"b":7,"\\":3}}"#,
                r#"{"o":{"b\\":1,"b":7,"\\":3,"d":7}}"#,
            ),
        ] {
            for checked in [false, true] {
                let lite = LiteProgram::new(program).expect("in the fast subset");
                let got = lite.run(input.as_bytes(), &mut Arena::default(), true, checked);
                let Lite::Done(Some(bytes), _) = got else {
                    panic!("{program} on {input} (checked: {checked}): {got:?}");
                };
                assert_eq!(
                    std::str::from_utf8(&bytes).unwrap(),
                    expected,
                    "{program} on {input}"
                );
            }
            assert_eq!(
                by_vrl(program, input),
                expected,
                "{program} on {input}: VRL"
            );
        }
    }

    #[test]
    fn an_object_of_many_keys_with_escapes_decodes_each_key_a_bounded_number_of_times() {
        // Each key is read for the duplicate look-ahead of the writer: a
        // key with escapes compared with every later one was decoded at
        // each comparison, quadratic in the object's keys. (Keys with
        // `\u00fc`, not `\u00e9`: a digit before an `e` followed by
        // five digits reads as an exponent past an `f64` to the checked
        // path's quick test, which leaves such records to VRL.)
        let keys = 300;
        let fields: Vec<String> = (0..keys)
            .map(|i| format!("\"k\\u00fc{i:04}\":{i}"))
            .collect();
        let input = format!("{{{}}}", fields.join(","));
        for checked in [false, true] {
            let lite = LiteProgram::new(".x = 1").expect("in the fast subset");
            scan::DECODED.with(|n| n.set(0));
            let got = lite.run(input.as_bytes(), &mut Arena::default(), true, checked);
            let decoded = scan::DECODED.with(std::cell::Cell::get);
            let Lite::Done(Some(bytes), _) = got else {
                panic!("checked: {checked}: {got:?}");
            };
            assert_eq!(
                std::str::from_utf8(&bytes).unwrap(),
                by_vrl(".x = 1", &input),
                "checked: {checked}"
            );
            assert!(
                decoded <= 4 * keys,
                "{decoded} decodes for {keys} keys (checked: {checked})"
            );
        }
    }

    #[test]
    fn reads_see_the_programs_own_changes() {
        // A string compared after the program changed it, or deleted it.
        assert_eq!(
            written(
                ".a = \"x\"\n.s = .a == \"x\"\ndel(.b)\n.t = .b == \"y\"",
                r#"{"a":"w","b":"y"}"#
            ),
            r#"{"a":"x","s":true,"t":false}"#
        );
        assert_eq!(
            written(".s = .a.b == \"x\"", r#"{"a":{"b":"x"}}"#),
            r#"{"a":{"b":"x"},"s":true}"#
        );
        assert_eq!(
            written(".s = .a != \"x\"", r#"{"a":"x\u0041"}"#),
            r#"{"a":"x\u0041","s":true}"#
        );
        // An escaped string is compared by its value, not its text.
        assert_eq!(
            written(".s = .a == \"xA\"", r#"{"a":"x\u0041"}"#),
            r#"{"a":"x\u0041","s":true}"#
        );
        assert_eq!(
            written(
                ".x = .o\n.x.z = .x.y + 1\n.w = del(.a)",
                r#"{"a":5,"o":{"y":1}}"#
            ),
            r#"{"o":{"y":1},"w":5,"x":{"y":1,"z":2}}"#
        );
    }

    /// Values as users write them: spacing, escapes, exponents, `-0`,
    /// duplicate keys, nested objects and arrays.
    fn raw_value() -> impl Strategy<Value = String> {
        let leaf = prop::sample::select(vec![
            "1",
            "-0",
            "2.50",
            "1e2",
            "-3e-7",
            "9223372036854775807",
            "18446744073709551616",
            "0.1",
            "true",
            "false",
            "null",
            r#""x""#,
            r#""caf\u00e9 \/ \"q\"""#,
            r#""山田""#,
            r#""""#,
            "{}",
            "[]",
            r#"{"b":1,"b":2}"#,
        ])
        .prop_map(str::to_owned);
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4)
                    .prop_map(|v| format!("[{}]", v.join(", "))),
                prop::collection::vec(("[a-d]", inner, 0..4u8), 0..4).prop_map(|v| {
                    let body: Vec<String> =
                        v.iter().map(|(k, v, style)| entry(k, v, *style)).collect();
                    format!("{{{}}}", body.join(","))
                }),
            ]
        })
    }

    /// An entry spelled one of four ways: compact, spaced, with its key
    /// escaped, with space after the value.
    fn entry(key: &str, value: &str, style: u8) -> String {
        match style {
            0 => format!("\"{key}\" : {value}"),
            1 => format!("\"{key}\":{value}"),
            2 => {
                let escaped: String = key.bytes().map(|b| format!("\\u{b:04x}")).collect();
                format!("\"{escaped}\":{value}")
            }
            _ => format!("\"{key}\": {value} "),
        }
    }

    fn record_text() -> impl Strategy<Value = String> {
        prop::collection::vec(("[a-d]", raw_value(), 0..4u8), 0..5).prop_map(|v| {
            let body: Vec<String> = v.iter().map(|(k, v, style)| entry(k, v, *style)).collect();
            format!("{{{}}}", body.join(","))
        })
    }

    const PROGRAMS: &[&str] = &[
        "del(.a.b)",
        ".c = .a",
        ".a.c = 1\n.d = .a",
        "if .b == 1 { abort }\n.d = del(.c)",
        ".e = .a.b == .c\n.f = .d[0]\n.g = .d[-1].a",
        // New fields set out of key order: written sorted.
        ".z = 1\n.m = .b\n.k = 2",
        "del(.a.b.c)\n.a.b.d = true",
        ".x = .a\n.x.y = .b\ndel(.a)",
        ".n = to_int(round(to_float!(.a) * 100))",
        "t = 0\nfor_each(array!(.b)) -> |_i, it| { t = t + int!(it) }\n.t = t",
        ".a.b = .a\n.c = .a.b.b\n.d = .a",
        "del(.a)\n.a.x = 1",
        ".b = del(.a.b)\n.c = .a\n.a.b = .c",
        "x = .a\n.a.z = 0\n.y = x\n.w = .a.z != .a.b || .c",
        ".s = .a == \"x\"\n.t = .a.b != \"山田\"\n.v = .d == \"café\"",
        ".a = \"x\"\n.s = .a == \"x\"\ndel(.b)\n.t = .b == \"x\"",
    ];

    proptest! {
        #[test]
        fn prop_fast_path_writes_what_vrl_writes(
            program in prop::sample::select(PROGRAMS),
            input in record_text(),
        ) {
            use etl_record::{Position, Record};
            use crate::{Remap, VrlProgram};
            use etl_transform::{Outcome, Transform};
            let compiled = VrlProgram::remap(program).unwrap();
            prop_assert!(compiled.is_fast());
            let show = |o: Outcome| match o {
                Outcome::Keep(r) => format!("keep {}", String::from_utf8_lossy(&r.value)),
                Outcome::Filtered => "filtered".to_owned(),
                Outcome::Many(rs) => format!("many {}", rs.len()),
                Outcome::Reject(r, why) | Outcome::Halt(r, why) => {
                    format!("reject {} {why}", String::from_utf8_lossy(&r.value))
                }
            };
            let record = || Record::new(Position::default(), input.clone());
            let fast = show(Remap::new("r", compiled.clone()).apply(record()));
            let checked = show(Remap::new("r", compiled.clone()).checked_input(true).apply(record()));
            let vrl = show(Remap::new("r", compiled.runtime_only()).apply(record()));
            prop_assert_eq!(&fast, &vrl, "{} on {}", program, input);
            prop_assert_eq!(&checked, &vrl, "{} on {} (input checked)", program, input);
        }
    }

    proptest! {
        #[test]
        fn prop_values_are_written_as_serde_json_writes_them(
            int in any::<i64>(),
            float in any::<f64>(),
            text in ".{0,8}",
        ) {
            let values = [
                Value::Integer(int),
                Value::from_f64_or_zero(float),
                Value::from(text.as_str()),
                Value::Null,
                Value::Boolean(int < 0),
            ];
            for value in values {
                let mut ours = Vec::new();
                write_value(&mut ours, &value).unwrap();
                prop_assert_eq!(ours, serde_json::to_vec(&value).unwrap(), "{:?}", value);
            }
        }
    }

    proptest! {
        #[test]
        fn prop_plain_numbers_read_as_serde_json_reads_them(
            int in -999_999_999_999_999_999i64..=999_999_999_999_999_999,
            whole in 0u64..10_000_000,
            frac in "[0-9]{1,14}",
            negative in any::<bool>(),
        ) {
            let sign = if negative { "-" } else { "" };
            for text in [int.to_string(), format!("{sign}{whole}.{frac}"), format!("{sign}0.{frac}")] {
                let theirs: Value = serde_json::from_str(&text).unwrap();
                // Read here, not left to serde_json: an integer of at most
                // 18 digits, a decimal of at most 15.
                let digits = text.bytes().filter(u8::is_ascii_digit).count();
                let decimal = text.contains('.');
                if (!decimal && digits <= 18) || (decimal && digits <= 15) {
                    prop_assert!(plain_number(&text).is_some(), "{}", text);
                }
                if let Some(ours) = plain_number(&text) {
                    prop_assert_eq!(&ours, &theirs, "{}", text);
                    let same_bits = match (&ours, &theirs) {
                        (Value::Float(a), Value::Float(b)) => a.to_bits() == b.to_bits(),
                        (a, b) => a == b,
                    };
                    prop_assert!(same_bits, "{}", text);
                }
            }
        }
    }

    fn number() -> impl Strategy<Value = Value> {
        prop_oneof![
            any::<i64>().prop_map(Value::Integer),
            (-1000i64..1000).prop_map(Value::Integer),
            any::<f64>()
                .prop_filter("not NaN", |f| !f.is_nan())
                .prop_map(Value::from_f64_or_zero),
            prop::sample::select(vec![
                f64::INFINITY,
                f64::NEG_INFINITY,
                f64::MAX,
                -0.0,
                0.0,
                0.1
            ])
            .prop_map(Value::from_f64_or_zero),
        ]
    }

    proptest! {
        #[test]
        fn prop_arithmetic_on_numbers_is_vrls(
            l in number(),
            r in number(),
            op in prop::sample::select(vec![Opcode::Add, Opcode::Sub, Opcode::Mul, Opcode::Div]),
        ) {
            let theirs = match op {
                Opcode::Add => l.clone().try_add(r.clone()),
                Opcode::Sub => l.clone().try_sub(r.clone()),
                Opcode::Mul => l.clone().try_mul(r.clone()),
                _ => l.clone().try_div(r.clone()),
            };
            match (arithmetic(&l, op, &r), theirs) {
                (Ok(Some(ours)), Ok(theirs)) => {
                    let same_bits = match (&ours, &theirs) {
                        (Value::Float(a), Value::Float(b)) => a.to_bits() == b.to_bits(),
                        (a, b) => a == b,
                    };
                    prop_assert!(same_bits, "{:?} {:?} {:?}: {:?} against {:?}", l, op, r, ours, theirs);
                }
                // Not decided here: VRL's operators decide it.
                (Ok(None), _) => prop_assert!(matches!(op, Opcode::Div)),
                // An error here is VRL's error there (a NaN result).
                (Err(_), theirs) => prop_assert!(theirs.is_err(), "{:?} {:?} {:?}", l, op, r),
                (Ok(Some(ours)), Err(e)) => prop_assert!(false, "{:?} where VRL fails: {}", ours, e),
            }
        }
    }

    /// A record `levels` containers deep, itself the first: objects
    /// `{"a":{"a":...}}`, or an object around arrays `{"a":[[...]]}`.
    fn nested(levels: usize, arrays: bool) -> String {
        if arrays {
            let inner = levels - 1;
            format!(
                "{{\"b\":1,\"a\":{}1{}}}",
                "[".repeat(inner),
                "]".repeat(inner)
            )
        } else {
            format!(
                "{}1{}",
                "{\"b\":1,\"a\":".repeat(levels),
                "}".repeat(levels)
            )
        }
    }

    /// An outcome as text, to compare the fast path's with the runtime's.
    fn shown(outcome: etl_transform::Outcome) -> String {
        use etl_transform::Outcome;
        match outcome {
            Outcome::Keep(r) => format!("keep {}", String::from_utf8_lossy(&r.value)),
            Outcome::Filtered => "filtered".to_owned(),
            Outcome::Many(rs) => format!("many {}", rs.len()),
            Outcome::Reject(r, why) | Outcome::Halt(r, why) => {
                format!("reject {} {why}", String::from_utf8_lossy(&r.value))
            }
        }
    }

    #[test]
    fn a_record_nested_128_deep_is_refused_as_vrl_refuses_it() {
        use etl_record::{Position, Record};

        use crate::{Remap, VrlFilter, VrlProgram};
        use etl_transform::Transform;
        let remap = VrlProgram::remap(".t = int!(.b) + 1").unwrap();
        let condition = VrlProgram::condition(".b == 1").unwrap();
        assert!(remap.is_fast() && condition.is_fast());
        for levels in [127, 128, 129] {
            for arrays in [false, true] {
                let input = nested(levels, arrays);
                let record = || Record::new(Position::default(), input.clone());
                let vrl = shown(Remap::new("r", remap.clone().runtime_only()).apply(record()));
                // VRL reads the record with serde_json, which refuses the
                // 128th container.
                assert_eq!(
                    vrl.contains("recursion limit exceeded"),
                    levels >= 128,
                    "{levels} levels: {vrl}"
                );
                let kept =
                    shown(VrlFilter::new("f", condition.clone().runtime_only()).apply(record()));
                for checked in [false, true] {
                    let fast = shown(
                        Remap::new("r", remap.clone())
                            .checked_input(checked)
                            .apply(record()),
                    );
                    assert_eq!(
                        fast, vrl,
                        "{levels} levels, arrays {arrays}, checked {checked}"
                    );
                    let mut filter = VrlFilter::new("f", condition.clone()).checked_input(checked);
                    let fast = shown(filter.apply(record()));
                    assert_eq!(
                        fast, kept,
                        "{levels} levels, arrays {arrays}, checked {checked}"
                    );
                    // A run of steps read once decides nothing of it
                    // either.
                    let steps = [
                        Step::Condition(condition.lite().unwrap()),
                        Step::Remap(remap.lite().unwrap()),
                    ];
                    let (ran, _) = run_steps(
                        &steps,
                        input.as_bytes(),
                        &mut Arena::default(),
                        checked,
                        None,
                    );
                    assert_eq!(
                        ran == Steps::Fallback,
                        levels >= 128,
                        "{levels} levels, arrays {arrays}, checked {checked}: {ran:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn plain_numbers_leave_what_serde_json_reads_its_own_way() {
        for text in [
            "-0",
            "1e3",
            "1.5E-2",
            "12345678901234567890",
            "1.2345678901234567",
            "true",
            "\"1\"",
            "1.",
            ".5",
            "1.2.3",
            "-",
            "",
        ] {
            assert_eq!(plain_number(text), None, "{text}");
        }
        assert_eq!(plain_number("-12"), Some(Value::Integer(-12)));
        assert_eq!(plain_number("0"), Some(Value::Integer(0)));
        assert_eq!(plain_number("-0.0"), Some(Value::from_f64_or_zero(-0.0)));
    }

    #[test]
    fn what_it_cannot_decide_falls_back() {
        for (program, input) in [
            (".a.b = 1", r#"{"a":5}"#),
            (".a.b = 1", r#"{}"#),
            (".t = to_float!(.a)", r#"{"a":"1.5"}"#),
            (".t = .a / 0", r#"{"a":1}"#),
            (".t = 1", r#"[1]"#),
            (".t = 1", r#"{"a":1"#),
            (".t = 1", r#"{"a":1e400}"#),
            (
                ".t = 1",
                format!(r#"{{"a":1{}e99}}"#, "0".repeat(210)).as_str(),
            ),
            (
                ".t = 1",
                format!(r#"{{"a":[{}]}}"#, "9".repeat(309)).as_str(),
            ),
        ] {
            assert_eq!(run(program, input), Lite::Fallback, "{program} on {input}");
        }
        assert_eq!(run("abort", "{}"), Lite::Aborted);
        // The check of an input read as valid JSON elsewhere sees the
        // same numbers.
        for past in [
            format!("1{}e99", "0".repeat(210)),
            format!("1{}.25E+10", "0".repeat(300)),
            "1e400".to_owned(),
            "9".repeat(309),
        ] {
            let text = format!(r#"{{"a":{past}}}"#);
            assert!(
                serde_json::from_str::<serde_json::Value>(&text).is_err(),
                "{past}"
            );
            assert!(past_f64(text.as_bytes()), "{past}");
        }
        for near in [
            format!("1{}e99", "0".repeat(200)),
            "1.5e99".to_owned(),
            "12345".to_owned(),
        ] {
            assert!(!past_f64(format!(r#"{{"a":{near}}}"#).as_bytes()), "{near}");
        }
        // Digits in a string are not a number past an `f64`.
        let digits = format!(r#"{{"a":"{}"}}"#, "9".repeat(600));
        assert!(matches!(run(".t = 1", &digits), Lite::Done(Some(_), _)));
    }
}
