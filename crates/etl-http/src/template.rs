//! The request URI as a template over record fields.

use std::fmt::Write as _;

use etl_record::{FieldPath, Template, TemplateError, TemplatePart};
use serde_json::Value;

/// A request URI with `{field}` placeholders, each a
/// [`FieldPath`](etl_record::FieldPath) into a record's JSON value
/// (`{tenant}`, `{labels.app}`, `{hosts.0}`), as an
/// [`etl_record::Template`]. A record's values
/// are percent-encoded into the URI, so a value never changes its
/// structure (a `/` or `?` in a value stays inside its segment); a value
/// that would be a whole path segment of `.`, `..` or nothing is refused. `{{` and
/// `}}` are literal braces.
///
/// ```
/// let template = etl_http::UriTemplate::parse("http://es:9200/{index}/_bulk").unwrap();
/// let record = serde_json::json!({ "index": "logs 2026", "n": 1 });
/// assert_eq!(template.render(Some(&record)).unwrap(), "http://es:9200/logs%202026/_bulk");
/// assert!(template.render(Some(&serde_json::json!({ "n": 1 }))).is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UriTemplate {
    template: Template,
}

impl UriTemplate {
    /// Parse `text`.
    ///
    /// # Errors
    ///
    /// Why it is not a template: an unclosed `{...}`, a stray `}`, a
    /// placeholder that is not a field path.
    pub fn parse(text: &str) -> Result<Self, TemplateError> {
        Template::parse(text).map(|template| UriTemplate { template })
    }

    /// Whether the URI depends on the records.
    #[must_use]
    pub fn has_fields(&self) -> bool {
        self.template.has_fields()
    }

    /// The URI for a record whose value is `value` (`None`: not JSON).
    ///
    /// # Errors
    ///
    /// Why the record gives no URI ([`UriError`]): a field it lacks, or
    /// whose value is not a string, a number or a boolean, or that would
    /// change the path's levels.
    pub fn render(&self, value: Option<&Value>) -> Result<String, UriError> {
        let mut placed = Vec::new();
        let uri = self.template.render(|path, out| {
            let text = value
                .and_then(|v| path.get(v))
                .and_then(etl_record::scalar_text)
                .ok_or_else(|| UriError::Field {
                    field: path.clone(),
                })?;
            let start = out.len();
            percent_encode(&text, out);
            placed.push((start..out.len(), path.clone()));
            Ok::<(), UriError>(())
        })?;
        // A value is percent-encoded, so a `?` or `#` is the template's
        // own. In the path, a segment a value made `.`, `..` (even as
        // `%2E`) or empty would change the path's levels.
        let path_end = uri.find(['?', '#']).unwrap_or(uri.len());
        for (range, path) in placed {
            if range.start > path_end {
                break;
            }
            let from = uri[..range.start].rfind('/').map_or(0, |at| at + 1);
            let to = uri[range.end..path_end]
                .find('/')
                .map_or(path_end, |at| range.end + at);
            let segment = uri[from..to].replace("%2E", ".").replace("%2e", ".");
            if matches!(segment.as_str(), "" | "." | "..") {
                return Err(UriError::PathLevel {
                    field: path,
                    segment: uri[from..to].to_owned(),
                });
            }
        }
        Ok(uri)
    }

    /// Whether the template's own text holds a `%` that is not followed
    /// by two hex digits (with a value after it, it could spell `%2E`).
    #[must_use]
    pub fn has_stray_percent(&self) -> bool {
        self.template.parts().iter().any(|part| match part {
            TemplatePart::Text(text) => text.match_indices('%').any(|(at, _)| {
                let hex = text.as_bytes().get(at + 1..at + 3);
                !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
            }),
            TemplatePart::Field(_) => false,
        })
    }

    /// The URI with a sample value in each placeholder, to check its form.
    pub(crate) fn sample(&self) -> String {
        let sampled: Result<String, std::convert::Infallible> = self.template.render(|_, out| {
            out.push('x');
            Ok(())
        });
        match sampled {
            Ok(uri) => uri,
            Err(never) => match never {},
        }
    }
}

/// Why a record gives no request URI ([`UriTemplate::render`]); the sink
/// sends the record to the dead-letter path with this reason. It names
/// the field, never the URI's own text (which may hold a key).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UriError {
    /// The record lacks the field, or its value is not a string, a number
    /// or a boolean (or the record is not JSON).
    #[error("the request URI needs field `{field}`, a string, a number or a boolean")]
    Field {
        /// The placeholder's field.
        field: FieldPath,
    },
    /// The field's value would make a path segment `.`, `..` or nothing.
    #[error(
        "field `{field}` makes the path segment {segment:?} of the request URI, which would \
         change the path's levels"
    )]
    PathLevel {
        /// The placeholder's field.
        field: FieldPath,
        /// The segment it would make, percent-encoded.
        segment: String,
    },
}

/// Everything but RFC 3986's unreserved characters, as `%XX`.
fn percent_encode(text: &str, out: &mut String) {
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
}

/// `uri` as messages show it: without its query, which may carry a key
/// (`?api_key=...`), and without any user or password.
pub(crate) fn shown(uri: &reqwest::Url) -> String {
    let mut shown = uri.clone();
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    let had_query = shown.query().is_some();
    shown.set_query(None);
    shown.set_fragment(None);
    if had_query {
        format!("{shown}?...")
    } else {
        shown.to_string()
    }
}

/// `uri`, text that is no URL, as messages show it: cut before its query
/// or fragment, and without what could be a user or password.
pub(crate) fn shown_text(uri: &str) -> String {
    let (base, cut) = match uri.find(['?', '#']) {
        Some(at) => (&uri[..at], true),
        None => (uri, false),
    };
    let (scheme, rest) = base.split_once("://").unwrap_or(("", base));
    let host_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(host_end);
    let authority = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let mut shown = if scheme.is_empty() {
        format!("{authority}{path}")
    } else {
        format!("{scheme}://{authority}{path}")
    };
    if cut {
        shown.push_str("?...");
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fields_are_percent_encoded_and_braces_escape() {
        let t = UriTemplate::parse("http://h/{a.b}/x{{y}}?q={n}").unwrap();
        assert!(t.has_fields());
        let v = json!({"a": {"b": "p/q?r"}, "n": 7});
        assert_eq!(t.render(Some(&v)).unwrap(), "http://h/p%2Fq%3Fr/x{y}?q=7");
        assert!(t.render(None).unwrap_err().to_string().contains("`a.b`"));
        assert!(t.render(Some(&json!({"a": {"b": [1]}, "n": 1}))).is_err());
        for bad in [
            "http://h/{a",
            "http://h/{}",
            "http://h/}",
            "http://h/{a..b}",
        ] {
            assert!(UriTemplate::parse(bad).is_err(), "{bad}");
        }
        assert!(!UriTemplate::parse("http://h/x").unwrap().has_fields());
    }

    #[test]
    fn a_uri_placeholder_reads_array_indexes_as_every_field_path_does() {
        let t = UriTemplate::parse("http://h/{items.1}/{items.+1}").unwrap();
        let v = json!({"items": ["a", "b"]});
        assert!(t.render(Some(&v)).is_err(), "`+1` is a name, not an index");
        let t = UriTemplate::parse("http://h/{items.1}").unwrap();
        assert_eq!(t.render(Some(&v)).unwrap(), "http://h/b");
        assert!(UriTemplate::parse("http://h/{items[0]}").is_err());
    }

    #[test]
    fn a_value_that_would_be_a_dot_segment_or_an_empty_one_in_the_path_is_refused() {
        let t = UriTemplate::parse("http://h/t/{a}/x?q={a}#{a}").unwrap();
        for bad in ["..", ".", ""] {
            let error = t.render(Some(&json!({ "a": bad }))).unwrap_err();
            assert!(
                matches!(error, UriError::PathLevel { .. }),
                "{bad:?}: {error:?}"
            );
            assert!(error.to_string().contains("`a`"), "{bad:?}: {error}");
        }
        assert_eq!(
            t.render(Some(&json!({"a": "..."}))).unwrap(),
            "http://h/t/.../x?q=...#..."
        );
        // In the query, a dot is only a value.
        let t = UriTemplate::parse("http://h/t?q={a}").unwrap();
        assert_eq!(
            t.render(Some(&json!({"a": ".."}))).unwrap(),
            "http://h/t?q=.."
        );
        // A value that is only part of its segment changes no level.
        let t = UriTemplate::parse("http://h/logs/{env}-{day}/{name}.json").unwrap();
        let v = json!({"env": "", "day": "2026-01-01", "name": "."});
        assert_eq!(
            t.render(Some(&v)).unwrap(),
            "http://h/logs/-2026-01-01/..json"
        );
        // Two values that make `..` together do.
        let t = UriTemplate::parse("http://h/a/{x}{y}/b").unwrap();
        assert!(t.render(Some(&json!({"x": ".", "y": "."}))).is_err());
    }

    #[test]
    fn a_percent_in_the_template_that_escapes_nothing_is_found() {
        for (uri, stray) in [
            ("http://h/api/%{v}/items", true),
            ("http://h/api/%2{v}", true),
            ("http://h/api/%25{v}?q=%2Fx", false),
            ("http://h/{v}", false),
        ] {
            assert_eq!(
                UriTemplate::parse(uri).unwrap().has_stray_percent(),
                stray,
                "{uri}"
            );
        }
    }

    #[test]
    fn text_that_is_no_uri_is_shown_without_query_or_credentials() {
        assert_eq!(
            shown_text("http://u:pw@bad host:1/x?api_key=s#f"),
            "http://bad host:1/x?..."
        );
        assert_eq!(shown_text("no uri at all"), "no uri at all");
        assert_eq!(shown_text("h/p#frag"), "h/p?...");
    }

    #[test]
    fn a_shown_uri_has_no_query_and_no_credentials() {
        let uri = reqwest::Url::parse("https://u:pw@h:8443/p?api_key=secret#f").unwrap();
        assert_eq!(shown(&uri), "https://h:8443/p?...");
    }
}
