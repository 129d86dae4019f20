//! The request URI as a template over record fields.

use std::fmt::Write as _;

use serde_json::Value;

/// A request URI with `{field}` placeholders, each a dotted path into a
/// record's JSON value (`{tenant}`, `{labels.app}`). A record's values
/// are percent-encoded into the URI, so a value never changes its
/// structure (a `/` or `?` in a value stays inside its segment). `{{` and
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
    parts: Vec<Part>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Text(String),
    Field(Vec<String>),
}

impl UriTemplate {
    /// Parse `text`.
    ///
    /// # Errors
    ///
    /// Why it is not a template: an unclosed or empty `{...}`, a stray
    /// `}`.
    pub fn parse(text: &str) -> Result<Self, String> {
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
                            None => return Err(format!("`{{{field}` is not closed")),
                        }
                    }
                    let path: Vec<String> = field.trim().split('.').map(str::to_owned).collect();
                    if path.iter().any(String::is_empty) {
                        return Err(format!("`{{{field}}}` does not name a field"));
                    }
                    if !literal.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut literal)));
                    }
                    parts.push(Part::Field(path));
                }
                '}' => return Err("a `}` closes nothing (write `}}` for a brace)".to_owned()),
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Text(literal));
        }
        Ok(UriTemplate { parts })
    }

    /// Whether the URI depends on the records.
    #[must_use]
    pub fn has_fields(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Field(_)))
    }

    /// The URI for a record whose value is `value` (`None`: not JSON).
    ///
    /// # Errors
    ///
    /// Why the record gives no URI: a field it lacks, or whose value is
    /// not a string, a number or a boolean.
    pub fn render(&self, value: Option<&Value>) -> Result<String, String> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(text) => out.push_str(text),
                Part::Field(path) => {
                    let found = value.and_then(|v| lookup(v, path));
                    let text = match found {
                        Some(Value::String(s)) => s.clone(),
                        Some(Value::Number(n)) => n.to_string(),
                        Some(Value::Bool(b)) => b.to_string(),
                        _ => {
                            return Err(format!(
                                "the request URI needs field `{}`, a string, a number or a boolean",
                                path.join(".")
                            ));
                        }
                    };
                    percent_encode(&text, &mut out);
                }
            }
        }
        Ok(out)
    }

    /// The URI with a sample value in each placeholder, to check its form.
    pub(crate) fn sample(&self) -> String {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(text) => out.push_str(text),
                Part::Field(_) => out.push('x'),
            }
        }
        out
    }
}

fn lookup<'v>(value: &'v Value, path: &[String]) -> Option<&'v Value> {
    path.iter().try_fold(value, |v, key| v.get(key))
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
        assert!(t.render(None).unwrap_err().contains("`a.b`"));
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
    fn a_shown_uri_has_no_query_and_no_credentials() {
        let uri = reqwest::Url::parse("https://u:pw@h:8443/p?api_key=secret#f").unwrap();
        assert_eq!(shown(&uri), "https://h:8443/p?...");
    }
}
