//! Text with `{field}` placeholders, read the same way by every component
//! that builds a name from a record: the file sink's output paths, the
//! HTTP sink's request URI, the object store's keys.

use std::fmt;

use crate::{FieldPath, FieldPathError};

/// Text with `{field}` placeholders, each a [`FieldPath`] into a record's
/// JSON value (`{level}`, `{user.region}`, `{items.0.sku}`); `{{` and `}}`
/// are literal braces.
///
/// The template only splits the text: what a value becomes in its place
/// (percent-encoded in a URI, one file-name part in a path) is the
/// component's rule, applied in [`Template::render`]'s callback.
///
/// ```
/// use etl_record::{Template, TemplatePart};
///
/// let template = Template::parse("out/{level}/{{raw}}.ndjson").unwrap();
/// assert!(template.has_fields());
/// assert_eq!(
///     template.parts(),
///     [
///         TemplatePart::Text("out/".to_owned()),
///         TemplatePart::Field("level".parse().unwrap()),
///         TemplatePart::Text("/{raw}.ndjson".to_owned()),
///     ]
/// );
/// assert!(Template::parse("out/{level").is_err());
/// assert!(Template::parse("out/{items[0]}").is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    parts: Vec<TemplatePart>,
}

/// A piece of a [`Template`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TemplatePart {
    /// Text taken as it is (braces unescaped); never empty.
    Text(String),
    /// A placeholder: the value at this path of the record.
    Field(FieldPath),
}

/// Why a text is not a [`Template`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// A `{` without its `}`.
    #[error("`{{{field}` is not closed (write `{{{{` for a brace)")]
    Unclosed {
        /// What follows the `{`.
        field: String,
    },
    /// A `}` that closes nothing.
    #[error("a `}}` closes nothing (write `}}}}` for a brace)")]
    StrayClose,
    /// A placeholder that is not a field path.
    #[error("`{{{field}}}`: {source}")]
    NotAFieldPath {
        /// The placeholder's text.
        field: String,
        /// Why it is no path.
        source: FieldPathError,
    },
}

impl Template {
    /// The template `text` stands for.
    ///
    /// # Errors
    ///
    /// An unclosed placeholder, a stray `}`, or a placeholder that is not
    /// a [`FieldPath`] (empty, `a..b`, `items[0]`).
    pub fn parse(text: &str) -> Result<Template, TemplateError> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    literal.push('}');
                }
                '{' => {
                    let mut field = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some(c) => field.push(c),
                            None => return Err(TemplateError::Unclosed { field }),
                        }
                    }
                    let path = FieldPath::parse(field.trim())
                        .map_err(|source| TemplateError::NotAFieldPath { field, source })?;
                    if !literal.is_empty() {
                        parts.push(TemplatePart::Text(std::mem::take(&mut literal)));
                    }
                    parts.push(TemplatePart::Field(path));
                }
                '}' => return Err(TemplateError::StrayClose),
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            parts.push(TemplatePart::Text(literal));
        }
        Ok(Template { parts })
    }

    /// The pieces, in order.
    #[must_use]
    pub fn parts(&self) -> &[TemplatePart] {
        &self.parts
    }

    /// Whether any placeholder is in it.
    #[must_use]
    pub fn has_fields(&self) -> bool {
        self.fields().next().is_some()
    }

    /// The placeholders' paths, in order.
    pub fn fields(&self) -> impl Iterator<Item = &FieldPath> {
        self.parts.iter().filter_map(|part| match part {
            TemplatePart::Field(path) => Some(path),
            TemplatePart::Text(_) => None,
        })
    }

    /// Put `text` before the template, as literal text (braces in it are
    /// no placeholders).
    pub fn prepend(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        match self.parts.first_mut() {
            Some(TemplatePart::Text(first)) => first.insert_str(0, text),
            _ => self.parts.insert(0, TemplatePart::Text(text.to_owned())),
        }
    }

    /// The text for one record: each placeholder's path is given to
    /// `field`, which appends what stands in its place to the text so far
    /// (or says why the record gives none).
    ///
    /// # Errors
    ///
    /// The first error `field` returns.
    pub fn render<E>(
        &self,
        mut field: impl FnMut(&FieldPath, &mut String) -> Result<(), E>,
    ) -> Result<String, E> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                TemplatePart::Text(text) => out.push_str(text),
                TemplatePart::Field(path) => field(path, &mut out)?,
            }
        }
        Ok(out)
    }
}

impl fmt::Display for Template {
    /// The template as it would be written (braces escaped).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for part in &self.parts {
            match part {
                TemplatePart::Text(text) => {
                    f.write_str(&text.replace('{', "{{").replace('}', "}}"))?;
                }
                TemplatePart::Field(path) => write!(f, "{{{path}}}")?,
            }
        }
        Ok(())
    }
}

/// The text a scalar JSON value stands for in a name: a string as it is,
/// a number or a boolean as JSON writes it; `None` for null, an object or
/// an array.
///
/// ```
/// # #[cfg(feature = "json")] {
/// use etl_record::scalar_text;
/// use serde_json::json;
///
/// assert_eq!(scalar_text(&json!("eu")).as_deref(), Some("eu"));
/// assert_eq!(scalar_text(&json!(7)).as_deref(), Some("7"));
/// assert_eq!(scalar_text(&json!([7])), None);
/// # }
/// ```
#[cfg(feature = "json")]
#[must_use]
pub fn scalar_text(value: &serde_json::Value) -> Option<std::borrow::Cow<'_, str>> {
    match value {
        serde_json::Value::String(s) => Some(std::borrow::Cow::Borrowed(s)),
        serde_json::Value::Number(n) => Some(std::borrow::Cow::Owned(n.to_string())),
        serde_json::Value::Bool(b) => Some(std::borrow::Cow::Borrowed(if *b {
            "true"
        } else {
            "false"
        })),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn braces_escape_and_placeholders_are_field_paths() {
        let t = Template::parse("a{{b}}{x.0}c").unwrap();
        assert_eq!(
            t.parts(),
            [
                TemplatePart::Text("a{b}".to_owned()),
                TemplatePart::Field("x.0".parse().unwrap()),
                TemplatePart::Text("c".to_owned()),
            ]
        );
        assert_eq!(t.to_string(), "a{{b}}{x.0}c");
        assert_eq!(Template::parse(&t.to_string()).unwrap(), t);
        assert!(!Template::parse("plain").unwrap().has_fields());
        assert_eq!(Template::parse("").unwrap().parts(), []);
    }

    #[test]
    fn malformed_templates_say_why() {
        for (bad, says) in [
            ("{a", "not closed"),
            ("a}", "closes nothing"),
            ("{}", "empty"),
            ("{a..b}", "empty"),
            ("{items[0]}", "brackets"),
        ] {
            let error = Template::parse(bad).unwrap_err().to_string();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }

    #[test]
    fn render_hands_each_path_to_the_callback() {
        let t = Template::parse("/{a}/{b.c}").unwrap();
        let out: Result<String, ()> = t.render(|path, out| {
            out.push_str(&path.to_string().to_uppercase());
            Ok(())
        });
        assert_eq!(out.unwrap(), "/A/B.C");
        let failed = t.render(|path, _| Err(path.to_string()));
        assert_eq!(failed.unwrap_err(), "a");
    }

    #[test]
    fn prepended_text_is_literal() {
        let mut t = Template::parse("{a}.x").unwrap();
        t.prepend("dir{1}/");
        assert_eq!(t.parts()[0], TemplatePart::Text("dir{1}/".to_owned()));
        let mut t = Template::parse("x/{a}").unwrap();
        t.prepend("base/");
        assert_eq!(t.parts()[0], TemplatePart::Text("base/x/".to_owned()));
    }
}
