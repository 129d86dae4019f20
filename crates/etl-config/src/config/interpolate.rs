//! `${VAR}` and `${VAR:-default}` in the configuration's string values,
//! taken from the environment, so secrets need not be written in the file.
//!
//! Only string values are interpolated, after the file is parsed: not
//! comments (a commented-out line naming an unset variable is no error),
//! not keys, not numbers. A value is interpolated once, so a variable's
//! value is never read as TOML (a `"` or a newline in it cannot change the
//! file's structure) and is never interpolated again.
//!
//! * `${NAME}`: the variable's value; an unset variable is a problem at the
//!   line of the string that names it.
//! * `${NAME:-default}`: `default` when the variable is unset or empty.
//! * `${NAME-default}`: `default` when the variable is unset.
//! * `$$`: a literal `$`. Any other `$` is kept as it is.
//!
//! Each interpolated string is written back into the text as a TOML basic
//! string on the same lines, so every later line and column of a problem
//! still points into the file as written.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use secrecy::zeroize::Zeroizing;
use secrecy::{ExposeSecret, SecretString};
use toml_edit::{ImDocument, Item, Table, Value};

/// A string value that cannot be interpolated.
#[derive(Debug)]
pub(super) struct Unresolved {
    /// The string, as written in the file (quotes included).
    pub(super) span: Range<usize>,
    /// The section holding it, e.g. `[source]` or `[[sinks]] #2`.
    pub(super) section: String,
    /// What is wrong.
    pub(super) message: String,
}

/// What interpolation did to a file.
#[derive(Debug, Default)]
pub(super) struct Interpolated {
    /// The text to parse: the file with every interpolated string
    /// rewritten (zeroed when dropped: it may hold secrets).
    pub(super) text: Zeroizing<String>,
    /// Values that must not appear in any message: what a variable put
    /// into a value whose key or variable name says it is secret.
    pub(super) secrets: Vec<SecretString>,
}

/// Interpolate every string value of `text`, reading variables through
/// `lookup` (`None`: unset; `Some(Err(()))`: set but not UTF-8).
///
/// Text that does not parse is returned as it is, for the parser to
/// report.
///
/// # Errors
///
/// Every string naming an unset variable without default, or holding a
/// malformed `${...}`.
pub(super) fn interpolate(
    text: &str,
    lookup: &dyn Fn(&str) -> Option<Result<String, ()>>,
) -> Result<Interpolated, Vec<Unresolved>> {
    let unchanged = || Interpolated {
        text: Zeroizing::new(text.to_owned()),
        secrets: Vec::new(),
    };
    if !text.contains('$') {
        return Ok(unchanged());
    }
    let Ok(doc) = ImDocument::parse(text) else {
        return Ok(unchanged());
    };
    let mut walk = Walk {
        lookup,
        edits: Vec::new(),
        secrets: Vec::new(),
        problems: Vec::new(),
        text,
    };
    walk.top(doc.as_table());
    if !walk.problems.is_empty() {
        return Err(walk.problems);
    }
    // Sized once, so no copy of a secret is left behind by a reallocation.
    walk.edits.sort_by_key(|(span, _)| span.start);
    let size = text.len() + walk.edits.iter().map(|(_, l)| l.len()).sum::<usize>();
    let mut out = Zeroizing::new(String::with_capacity(size));
    let mut at = 0;
    for (span, literal) in &walk.edits {
        out.push_str(&text[at..span.start]);
        out.push_str(literal);
        at = span.end;
    }
    out.push_str(&text[at..]);
    Ok(Interpolated {
        text: out,
        secrets: walk.secrets,
    })
}

struct Walk<'a> {
    lookup: &'a dyn Fn(&str) -> Option<Result<String, ()>>,
    edits: Vec<(Range<usize>, Zeroizing<String>)>,
    secrets: Vec<SecretString>,
    problems: Vec<Unresolved>,
    text: &'a str,
}

impl Walk<'_> {
    fn top(&mut self, doc: &Table) {
        for (key, item) in doc.iter() {
            match item {
                Item::ArrayOfTables(tables) => {
                    for (i, t) in tables.iter().enumerate() {
                        self.table(t, &format!("[[{key}]] #{}", i + 1));
                    }
                }
                Item::Table(t) => self.table(t, &format!("[{key}]")),
                Item::Value(v) => self.value(v, key, "file"),
                Item::None => {}
            }
        }
    }

    fn table(&mut self, table: &Table, section: &str) {
        for (key, item) in table.iter() {
            self.item(item, key, section);
        }
    }

    fn item(&mut self, item: &Item, key: &str, section: &str) {
        match item {
            Item::Value(v) => self.value(v, key, section),
            Item::Table(t) => self.table(t, section),
            Item::ArrayOfTables(tables) => {
                for t in tables.iter() {
                    self.table(t, section);
                }
            }
            Item::None => {}
        }
    }

    fn value(&mut self, value: &Value, key: &str, section: &str) {
        match value {
            Value::String(s) => {
                let Some(span) = value.span() else { return };
                let raw = s.value();
                if !raw.contains('$') {
                    return;
                }
                match expand(raw, self.lookup) {
                    Ok((expanded, substituted)) => {
                        if is_secret_key(key)
                            || substituted.iter().any(|(name, _)| is_secret_key(name))
                        {
                            self.secrets.extend(
                                substituted
                                    .into_iter()
                                    .map(|(_, v)| v)
                                    .filter(|v| !v.is_empty())
                                    .map(SecretString::from),
                            );
                        }
                        if expanded != *raw {
                            let lines = self.text[span.clone()].matches('\n').count();
                            self.edits
                                .push((span, Zeroizing::new(basic_string(&expanded, lines))));
                        }
                    }
                    Err(message) => self.problems.push(Unresolved {
                        span,
                        section: section.to_owned(),
                        message: format!("{key}: {message}"),
                    }),
                }
            }
            Value::Array(a) => {
                for v in a.iter() {
                    self.value(v, key, section);
                }
            }
            Value::InlineTable(t) => {
                for (k, v) in t.iter() {
                    self.value(v, k, section);
                }
            }
            _ => {}
        }
    }
}

/// Every value that must appear in no output of a configuration: what
/// its keys name as secret, at any depth and in any table, and what a
/// variable gave to a secret. Shared by every component of the
/// configuration, so a secret written in one table is also kept out of
/// what another prints. `Debug` shows how many there are.
#[derive(Clone, Default)]
pub(crate) struct Secrets(Arc<Vec<SecretString>>);

impl Secrets {
    /// The values under secret-named keys anywhere in `doc` (every string
    /// and number below such a key, in nested tables and arrays too),
    /// with `also` (what variables gave to secrets).
    pub(crate) fn of_document(doc: &toml::Table, also: &[SecretString]) -> Self {
        let mut values: Vec<String> = also.iter().map(|s| s.expose_secret().to_owned()).collect();
        collect_table(doc, false, &mut values);
        values.retain(|v| !v.is_empty());
        // The longest first, so a secret holding another is replaced whole.
        values.sort_by_key(|v| std::cmp::Reverse(v.len()));
        values.dedup();
        Secrets(Arc::new(
            values.into_iter().map(SecretString::from).collect(),
        ))
    }

    /// `text` with every secret replaced by `***`.
    pub(crate) fn redact(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for secret in self.0.iter() {
            let secret = secret.expose_secret();
            if out.contains(secret) {
                out = out.replace(secret, "***");
            }
        }
        out
    }
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secrets({})", self.0.len())
    }
}

/// Built-in options whose names hold a secret's mark (`key`) but whose
/// values name columns and fields: redacting those would garble messages
/// (`id` in `invalid`), and they are never secrets.
const NOT_SECRET: &[&str] = &["key_column", "key_field"];

fn collect_table(table: &toml::Table, secret: bool, out: &mut Vec<String>) {
    for (key, value) in table {
        let secret = secret || (is_secret_key(key) && !NOT_SECRET.contains(&key.as_str()));
        collect_value(value, secret, out);
    }
}

fn collect_value(value: &toml::Value, secret: bool, out: &mut Vec<String>) {
    match value {
        toml::Value::Table(t) => collect_table(t, secret, out),
        toml::Value::Array(a) => {
            for v in a {
                collect_value(v, secret, out);
            }
        }
        toml::Value::String(s) if secret => out.push(s.clone()),
        toml::Value::Integer(_) | toml::Value::Float(_) if secret => out.push(value.to_string()),
        _ => {}
    }
}

/// Whether a key or variable name says its value may be a secret.
pub(super) fn is_secret_key(name: &str) -> bool {
    const MARKS: &[&str] = &[
        "pass",
        "pwd",
        "pw",
        "secret",
        "key",
        "pem",
        "token",
        "credential",
        "jaas",
        "oauthbearer",
        "private",
        "url",
        "dsn",
    ];
    let lower = name.to_ascii_lowercase();
    MARKS.iter().any(|m| lower.contains(m))
}

/// `raw` with its variables replaced, and which variables gave which
/// values.
#[allow(clippy::type_complexity, reason = "a private helper's plain result")]
fn expand(
    raw: &str,
    lookup: &dyn Fn(&str) -> Option<Result<String, ()>>,
) -> Result<(String, Vec<(String, String)>), String> {
    let mut out = String::with_capacity(raw.len());
    let mut substituted = Vec::new();
    let mut rest = raw;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('{') {
            let Some(end) = body.find('}') else {
                return Err(format!(
                    "unterminated ${{ in {:?} (write $$ for a literal $)",
                    shorten(&rest[at..])
                ));
            };
            let reference = &body[..end];
            let (name, default) = split_reference(reference)?;
            let value = match (lookup(name), default) {
                (Some(Err(())), _) => {
                    return Err(format!(
                        "environment variable {name} is set but is not valid UTF-8"
                    ));
                }
                (Some(Ok(v)), Some((true, d))) if v.is_empty() => d.to_owned(),
                (Some(Ok(v)), _) => v,
                (None, Some((_, d))) => d.to_owned(),
                (None, None) => {
                    return Err(format!(
                        "environment variable {name} is not set (write ${{{name}:-default}} \
                         to give a default, or $$ for a literal $)"
                    ));
                }
            };
            out.push_str(&value);
            substituted.push((name.to_owned(), value));
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok((out, substituted))
}

/// `NAME`, `NAME:-default` or `NAME-default`: the name, and the default
/// with whether it also stands for an empty value.
#[allow(clippy::type_complexity, reason = "a private helper's plain result")]
fn split_reference(reference: &str) -> Result<(&str, Option<(bool, &str)>), String> {
    let end = reference
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(reference.len());
    let (name, rest) = reference.split_at(end);
    let valid = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let default = if rest.is_empty() {
        None
    } else if let Some(d) = rest.strip_prefix(":-") {
        Some((true, d))
    } else {
        rest.strip_prefix('-').map(|d| (false, d))
    };
    if !valid || (!rest.is_empty() && default.is_none()) {
        return Err(format!(
            "invalid variable reference ${{{}}}: write ${{NAME}}, ${{NAME:-default}} or \
             ${{NAME-default}} (NAME of letters, digits and _), or $$ for a literal $",
            shorten(reference)
        ));
    }
    Ok((name, default))
}

/// At most 40 characters of `s`, for a message.
fn shorten(s: &str) -> String {
    match s.char_indices().nth(40) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_owned(),
    }
}

/// `value` as a TOML basic string spanning `lines` line breaks, as the
/// string it replaces did: the breaks are line-ending backslashes, which
/// the parser drops.
fn basic_string(value: &str, lines: usize) -> String {
    let mut escaped = String::with_capacity(value.len() + 2);
    for c in value.chars() {
        match c {
            '"' => escaped.push_str("\\\""),
            '\\' => escaped.push_str("\\\\"),
            '\n' => escaped.push_str("\\n"),
            '\r' => escaped.push_str("\\r"),
            '\t' => escaped.push_str("\\t"),
            c if c.is_control() => escaped.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => escaped.push(c),
        }
    }
    if lines == 0 {
        format!("\"{escaped}\"")
    } else {
        format!("\"\"\"{escaped}\\{}\"\"\"", "\n".repeat(lines))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn env(name: &str) -> Option<Result<String, ()>> {
        match name {
            "PW" => Some(Ok("Zq9SecretPw".to_owned())),
            "EMPTY" => Some(Ok(String::new())),
            "QUOTES" => Some(Ok("a\"b\\c\nd = 1".to_owned())),
            "BAD" => Some(Err(())),
            _ => None,
        }
    }

    fn run(text: &str) -> Result<Interpolated, Vec<Unresolved>> {
        interpolate(text, &env)
    }

    fn value(text: &str) -> toml::Value {
        let parsed: toml::Table = toml::from_str(&run(text).unwrap().text).unwrap();
        parsed["a"]["v"].clone()
    }

    #[test]
    fn variables_and_defaults() {
        assert_eq!(value("[a]\nv = \"x${PW}y\""), "xZq9SecretPwy".into());
        assert_eq!(value("[a]\nv = \"${UNSET:-d}\""), "d".into());
        assert_eq!(value("[a]\nv = \"${EMPTY:-d}\""), "d".into());
        assert_eq!(value("[a]\nv = \"${EMPTY-d}\""), "".into());
        assert_eq!(value("[a]\nv = \"${UNSET-d}\""), "d".into());
        assert_eq!(value("[a]\nv = \"${UNSET:-}\""), "".into());
        assert_eq!(
            value("[a]\nv = ['${PW}', 1]"),
            toml::Value::Array(vec!["Zq9SecretPw".into(), 1.into()])
        );
        assert_eq!(
            value("[a]\nv = { w = \"${PW}\" }")["w"],
            "Zq9SecretPw".into()
        );
    }

    #[test]
    fn dollars_escape_and_lone_dollars_stay() {
        assert_eq!(
            value("[a]\nv = \"$${PW} $$ a$b ^x$\""),
            "${PW} $ a$b ^x$".into()
        );
    }

    #[test]
    fn a_value_is_never_read_as_toml_nor_interpolated_again() {
        assert_eq!(value("[a]\nv = \"${QUOTES}\""), "a\"b\\c\nd = 1".into());
        let nested = |name: &str| (name == "X").then(|| Ok("${PW}".to_owned()));
        let out = interpolate("v = \"${X}\"", &nested).unwrap();
        assert!(out.text.contains("${PW}"), "{}", *out.text);
    }

    #[test]
    fn comments_and_keys_are_left_alone() {
        let text = "# v = \"${UNSET}\"\n[a]\n\"${UNSET}\" = 1\nv = 2 # ${UNSET}\n";
        assert_eq!(*run(text).unwrap().text, text);
    }

    #[test]
    fn lines_stay_where_they_were() {
        let text = "[a]\nv = \"\"\"\n${PW}\nx\"\"\"\nw = 1\n";
        let out = run(text).unwrap().text;
        assert_eq!(out.lines().count(), text.lines().count(), "{}", *out);
        assert_eq!(out.lines().nth(4), Some("w = 1"));
        let parsed: toml::Table = toml::from_str(&out).unwrap();
        assert_eq!(parsed["a"]["v"], "Zq9SecretPw\nx".into());
    }

    #[test]
    fn unset_and_malformed_references_are_problems_at_their_string() {
        let text =
            "[a]\nv = \"${UNSET}\"\n[[s]]\nw = \"${1X}\"\n[[s]]\nu = 'x${OPEN'\nb = \"${BAD}\"\n";
        let problems = run(text).unwrap_err();
        let shown: Vec<(usize, &str, &str)> = problems
            .iter()
            .map(|p| (p.span.start, p.section.as_str(), p.message.as_str()))
            .collect();
        assert_eq!(shown.len(), 4, "{shown:?}");
        assert_eq!(&text[shown[0].0..][..11], "\"${UNSET}\"\n");
        assert_eq!(shown[0].1, "[a]");
        assert!(
            shown[0]
                .2
                .contains("v: environment variable UNSET is not set"),
            "{shown:?}"
        );
        assert_eq!(shown[1].1, "[[s]] #1");
        assert!(
            shown[1].2.contains("invalid variable reference ${1X}"),
            "{shown:?}"
        );
        assert_eq!(shown[2].1, "[[s]] #2");
        assert!(shown[2].2.contains("unterminated"), "{shown:?}");
        assert!(
            shown[3].2.contains("BAD is set but is not valid UTF-8"),
            "{shown:?}"
        );
    }

    proptest::proptest! {
        /// Whatever a variable holds (quotes, backslashes, line breaks,
        /// control characters, any Unicode), the value arrives unchanged,
        /// in a one-line or a multi-line string, and the lines after it
        /// stay where they were.
        #[test]
        fn prop_a_variable_arrives_byte_for_byte(
            value in "\\PC*|[\"\\\\\n\r\t\u{0}-\u{1f}\u{7f}$'{} a]*",
            before in "[a-z $]{0,4}",
            multi_line in proptest::bool::ANY,
        ) {
            let before = before.replace('$', "$$");
            let text = if multi_line {
                format!("[a]\nv = \"\"\"\n{before}${{X}}\nz\"\"\"\nw = 1\n")
            } else {
                format!("[a]\nv = \"{before}${{X}}\"\nw = 1\n")
            };
            let lookup = |name: &str| (name == "X").then(|| Ok(value.clone()));
            let out = interpolate(&text, &lookup).expect("interpolates").text;
            let parsed: toml::Table = toml::from_str(&out).expect("still TOML");
            let before = before.replace("$$", "$");
            let expected = if multi_line {
                format!("{before}{value}\nz")
            } else {
                format!("{before}{value}")
            };
            proptest::prop_assert_eq!(parsed["a"]["v"].as_str(), Some(expected.as_str()));
            proptest::prop_assert_eq!(out.lines().count(), text.lines().count());
            proptest::prop_assert_eq!(out.lines().last(), Some("w = 1"));
        }
    }

    #[test]
    fn values_given_to_secrets_are_remembered() {
        let out = run("[a]\npassword = \"${X:-hunter2}\"\nv = \"${PW}\"\nname = \"${Y:-plain}\"")
            .unwrap();
        let secrets: Vec<&str> = out.secrets.iter().map(|s| s.expose_secret()).collect();
        assert_eq!(secrets, ["hunter2", "Zq9SecretPw"]);
    }

    #[test]
    fn secrets_are_found_at_any_depth_and_in_every_table() {
        let doc: toml::Table = toml::from_str(
            "[a]\nauth = { user = \"u\", password = \"nested\" }\n\
             [b]\nv = \"plain\"\n[b.credentials]\nname = \"under-a-secret-table\"\n\
             [[c]]\nlist = [{ token = \"in-array\" }, { token = 1234567 }]\n\
             key_column = \"id\"\n",
        )
        .unwrap();
        let secrets = Secrets::of_document(&doc, &[SecretString::from("from-var")]);
        assert_eq!(
            secrets
                .redact("nested under-a-secret-table in-array 1234567 from-var plain u invalid id"),
            "*** *** *** *** *** plain u invalid id"
        );
    }
}
