//! Checking the VRL programs of `remap` steps and filter `condition`s:
//! `etl validate` compiles them and reports VRL's diagnostic at the
//! place of the error in the configuration file, and VRL's warnings as
//! the configuration's warnings.

use std::ops::Range;
use std::path::Path;

use super::checker::Checker;
use super::schema::TransformConfig;

/// Check the program of `t`, if it has one; a `remap` step's `file` is
/// read here, and its text kept in `source`.
pub(super) fn check(
    ck: &mut Checker<'_>,
    t: &mut TransformConfig,
    keys: &[String],
    span: Range<usize>,
    section: &str,
    base: &Path,
) {
    let has = |k: &str| keys.iter().any(|key| key == k);
    match t {
        TransformConfig::Filter {
            condition: None, ..
        } => {
            for key in ["field", "op"] {
                if !has(key) {
                    ck.problem(
                        span.clone(),
                        section,
                        format!("missing field `{key}` (or a `condition`)"),
                    );
                }
            }
        }
        TransformConfig::Filter {
            condition: Some(condition),
            ..
        } => {
            if has("field") || has("op") || has("value") {
                ck.problem_at(
                    span.clone(),
                    "condition",
                    section,
                    "a filter takes either a `condition` or `field`, `op` and `value`, not both",
                );
            }
            let condition = condition.clone();
            compile(ck, &condition, Kind::Condition, span, section, "condition");
        }
        TransformConfig::Remap { source, file, .. } => match (&*source, &*file) {
            (Some(text), None) => {
                let text = text.clone();
                compile(ck, &text, Kind::Remap, span, section, "source");
            }
            (None, Some(file)) => {
                let path = base.join(file);
                match std::fs::read_to_string(&path) {
                    Ok(text) => {
                        compile_file(ck, &text, &path, span, section);
                        *source = Some(text);
                    }
                    Err(e) => ck.problem_at(
                        span,
                        "file",
                        section,
                        format!("cannot read the program {}: {e}", path.display()),
                    ),
                }
            }
            _ => ck.problem(
                span,
                section,
                "a remap step needs its program in `source` or in `file` (one of them)",
            ),
        },
        _ => {}
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Remap,
    Condition,
}

/// Check a sink's `when` condition (VRL) at `key` of the sink's table.
pub(super) fn condition(
    ck: &mut Checker<'_>,
    text: &str,
    span: Range<usize>,
    section: &str,
    key: &str,
) {
    compile(ck, text, Kind::Condition, span, section, key);
}

/// Compile a program written in the configuration file under `key`, and
/// report an error at its line and column there (at the key when the
/// program's text is not written verbatim, e.g. with escapes).
#[cfg(feature = "remap")]
fn compile(
    ck: &mut Checker<'_>,
    text: &str,
    kind: Kind,
    span: Range<usize>,
    section: &str,
    key: &str,
) {
    use super::checker::{find_key, find_text};

    let at_key = find_key(ck.text, &span, key).unwrap_or(span.start);
    let e = match build(text, kind) {
        Ok(program) => {
            for warning in program.warnings() {
                ck.warning(
                    at_key..at_key,
                    section,
                    format!("the VRL program in `{key}`: {warning}"),
                );
            }
            return;
        }
        Err(e) => e,
    };
    let start = find_text(ck.text, &(at_key..span.end), text).unwrap_or(at_key);
    let at = match e.offset {
        Some(offset) if start != at_key => start + offset,
        _ => at_key,
    };
    ck.problem(
        at..at,
        section,
        format!(
            "the VRL program in `{key}` does not compile:\n{}",
            e.message
        ),
    );
}

#[cfg(feature = "remap")]
fn compile_file(ck: &mut Checker<'_>, text: &str, path: &Path, span: Range<usize>, section: &str) {
    match build(text, Kind::Remap) {
        Ok(program) => {
            let at = super::checker::find_key(ck.text, &span, "file").unwrap_or(span.start);
            for warning in program.warnings() {
                ck.warning(
                    at..at,
                    section,
                    format!("the VRL program in {}: {warning}", path.display()),
                );
            }
        }
        Err(e) => ck.problem_at(
            span,
            "file",
            section,
            format!(
                "the VRL program in {} does not compile:\n{}",
                path.display(),
                e.message
            ),
        ),
    }
}

#[cfg(feature = "remap")]
fn build(text: &str, kind: Kind) -> Result<crate::VrlProgram, crate::VrlError> {
    match kind {
        Kind::Remap => crate::VrlProgram::remap(text),
        Kind::Condition => crate::VrlProgram::condition(text),
    }
}

#[cfg(not(feature = "remap"))]
fn compile(
    ck: &mut Checker<'_>,
    _text: &str,
    _kind: Kind,
    span: Range<usize>,
    section: &str,
    key: &str,
) {
    ck.problem_at(span, key, section, NO_REMAP);
}

#[cfg(not(feature = "remap"))]
fn compile_file(
    ck: &mut Checker<'_>,
    _text: &str,
    _path: &Path,
    span: Range<usize>,
    section: &str,
) {
    ck.problem_at(span, "file", section, NO_REMAP);
}

#[cfg(not(feature = "remap"))]
const NO_REMAP: &str =
    "this build of etl has no VRL support (it was built without the `remap` feature)";
