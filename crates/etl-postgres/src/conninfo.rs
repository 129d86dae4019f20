//! Connection strings, read the way libpq reads them: a URL
//! (`postgres://user:password@host:port/db?key=value&...`) or `key=value`
//! pairs (`host=h port=5432 password = 'a b'`), into parameters.
//!
//! The parser never puts a value in an error message, and records where
//! each secret value (`password`, `sslpassword`) sits in the input, so the
//! input can be shown with those values replaced by `***`
//! ([`ConnInfo::redacted`]). The parameters other than the secrets and the
//! TLS options are handed to tokio-postgres as a `key=value` string without
//! the password, so its own messages cannot show it either.

use std::fmt::Write;
use std::ops::Range;

/// Keys whose values are secrets.
pub(crate) const SECRET_KEYS: [&str; 2] = ["password", "sslpassword"];

/// A parsed connection string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ConnInfo {
    /// Parameters in the order given; a later one of a key wins.
    pub(crate) params: Vec<(String, String)>,
    /// The input with every secret value replaced by `***`.
    pub(crate) redacted: String,
}

impl ConnInfo {
    /// The last value of `key`.
    #[cfg(test)]
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.params
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Remove every parameter named `key`, returning the last value.
    pub(crate) fn take(&mut self, key: &str) -> Option<String> {
        let mut last = None;
        self.params.retain(|(k, v)| {
            if k == key {
                last = Some(v.clone());
                false
            } else {
                true
            }
        });
        last
    }

    /// The parameters as a libpq `key='value'` string.
    pub(crate) fn to_key_value(&self) -> String {
        let mut out = String::new();
        for (key, value) in &self.params {
            if !out.is_empty() {
                out.push(' ');
            }
            let _ = write!(out, "{key}='");
            for c in value.chars() {
                if c == '\'' || c == '\\' {
                    out.push('\\');
                }
                out.push(c);
            }
            out.push('\'');
        }
        out
    }
}

/// `input` with every secret replaced by `***`, or a placeholder when it
/// cannot be parsed (the secret's place is then unknown).
pub(crate) fn redact(input: &str) -> String {
    parse(input).map_or_else(
        |_| "<a connection string that cannot be parsed>".to_owned(),
        |info| info.redacted,
    )
}

/// Parse a URL or a `key=value` string.
///
/// # Errors
///
/// Why it cannot be read; never quotes a value.
pub(crate) fn parse(input: &str) -> Result<ConnInfo, String> {
    let mut secrets: Vec<Range<usize>> = Vec::new();
    let params = if let Some(rest) = ["postgresql://", "postgres://"]
        .iter()
        .find_map(|scheme| input.strip_prefix(scheme))
    {
        parse_url(input, input.len() - rest.len(), &mut secrets)?
    } else if input.contains("://") {
        return Err("the URL's scheme is neither postgres:// nor postgresql://".to_owned());
    } else {
        parse_key_value(input, &mut secrets)?
    };
    secrets.sort_by_key(|r| r.start);
    let mut redacted = String::with_capacity(input.len());
    let mut at = 0;
    for range in secrets {
        redacted.push_str(&input[at..range.start]);
        redacted.push_str("***");
        at = range.end;
    }
    redacted.push_str(&input[at..]);
    Ok(ConnInfo { params, redacted })
}

fn parse_url(
    input: &str,
    start: usize,
    secrets: &mut Vec<Range<usize>>,
) -> Result<Vec<(String, String)>, String> {
    let rest = &input[start..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let mut params = Vec::new();
    let hosts = match authority.rfind('@') {
        Some(at) => {
            let userinfo = &authority[..at];
            let (user, password) = match userinfo.find(':') {
                Some(colon) => {
                    let from = start + colon + 1;
                    secrets.push(from..start + at);
                    (&userinfo[..colon], Some(&userinfo[colon + 1..]))
                }
                None => (userinfo, None),
            };
            if !user.is_empty() {
                params.push(("user".to_owned(), decode(user, "user")?));
            }
            if let Some(password) = password {
                params.push(("password".to_owned(), decode(password, "password")?));
            }
            &authority[at + 1..]
        }
        None => authority,
    };
    if !hosts.is_empty() {
        let mut names = Vec::new();
        let mut ports = Vec::new();
        for spec in hosts.split(',') {
            let (host, port) = split_host_port(spec)?;
            names.push(decode(host, "host")?);
            ports.push(port.to_owned());
        }
        if names.iter().any(|h| !h.is_empty()) {
            params.push(("host".to_owned(), names.join(",")));
        }
        if ports.iter().any(|p| !p.is_empty()) {
            params.push(("port".to_owned(), ports.join(",")));
        }
    }
    let rest = &rest[authority_end..];
    let (path, query) = match rest.find('?') {
        Some(q) => (
            &rest[..q],
            Some((start + authority_end + q + 1, &rest[q + 1..])),
        ),
        None => (rest, None),
    };
    if let Some(db) = path.strip_prefix('/').filter(|db| !db.is_empty()) {
        params.push(("dbname".to_owned(), decode(db, "dbname")?));
    }
    if let Some((mut offset, query)) = query {
        for pair in query.split('&') {
            if !pair.is_empty() {
                let Some((key, value)) = pair.split_once('=') else {
                    // Not quoted: it may be a misplaced secret.
                    return Err(format!(
                        "the URL parameter at character {} is not key=value",
                        offset + 1
                    ));
                };
                let key = decode(key, "a parameter name")?;
                if SECRET_KEYS.contains(&key.as_str()) {
                    let from = offset + pair.len() - value.len();
                    secrets.push(from..offset + pair.len());
                }
                let value = decode(value, &key)?;
                params.push((key, value));
            }
            offset += pair.len() + 1;
        }
    }
    Ok(params)
}

/// `host[:port]`, with `[v6 address]` brackets.
fn split_host_port(spec: &str) -> Result<(&str, &str), String> {
    if let Some(inner) = spec.strip_prefix('[') {
        let close = inner
            .find(']')
            .ok_or_else(|| "an IPv6 host in the URL has no closing `]`".to_owned())?;
        let after = &inner[close + 1..];
        let port = match after.strip_prefix(':') {
            Some(port) => port,
            None if after.is_empty() => "",
            None => return Err("unexpected text after an IPv6 host in the URL".to_owned()),
        };
        return Ok((&inner[..close], port));
    }
    Ok(match spec.rfind(':') {
        Some(colon) => (&spec[..colon], &spec[colon + 1..]),
        None => (spec, ""),
    })
}

/// Percent-decode `text`, the value of `what`.
fn decode(text: &str, what: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("the URL's {what} has an invalid %-escape"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("the URL's {what} is not UTF-8 once decoded"))
}

fn parse_key_value(
    input: &str,
    secrets: &mut Vec<Range<usize>>,
) -> Result<Vec<(String, String)>, String> {
    let bytes = input.as_bytes();
    let mut params = Vec::new();
    let mut i = 0;
    let skip_space = |mut i: usize| {
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    loop {
        i = skip_space(i);
        if i >= bytes.len() {
            return Ok(params);
        }
        let key_start = i;
        while i < bytes.len() && bytes[i] != b'=' && !bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let key = &input[key_start..i];
        i = skip_space(i);
        if bytes.get(i) != Some(&b'=') {
            // Not quoted: a word without `=` may be a misplaced secret.
            return Err(format!(
                "the word at character {} of the connection string is not followed by `=`",
                key_start + 1
            ));
        }
        i = skip_space(i + 1);
        let value_start = i;
        let mut value = Vec::new();
        if bytes.get(i) == Some(&b'\'') {
            i += 1;
            loop {
                match bytes.get(i) {
                    None => {
                        return Err(format!(
                            "the quoted value of `{key}` in the connection string has no closing quote"
                        ));
                    }
                    Some(b'\'') => {
                        i += 1;
                        break;
                    }
                    Some(b'\\') if i + 1 < bytes.len() => {
                        value.push(bytes[i + 1]);
                        i += 2;
                    }
                    Some(&b) => {
                        value.push(b);
                        i += 1;
                    }
                }
            }
        } else {
            while i < bytes.len() && !bytes[i].is_ascii_whitespace() {
                if bytes[i] == b'\\' && i + 1 < bytes.len() {
                    i += 1;
                }
                value.push(bytes[i]);
                i += 1;
            }
        }
        if SECRET_KEYS.contains(&key) {
            secrets.push(value_start..i);
        }
        let value = String::from_utf8(value)
            .map_err(|_| format!("the value of `{key}` in the connection string is not UTF-8"))?;
        params.push((key.to_owned(), value));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const PW: &str = "Zq9SecretPw";

    #[test]
    fn urls_give_their_parts_and_hide_every_password() {
        let info =
            parse("postgres://etl:Zq9SecretPw@127.0.0.1:1/db?password=Zq9SecretPw&bogus_opt=1")
                .unwrap();
        assert_eq!(info.get("user"), Some("etl"));
        assert_eq!(info.get("password"), Some(PW));
        assert_eq!(info.get("host"), Some("127.0.0.1"));
        assert_eq!(info.get("port"), Some("1"));
        assert_eq!(info.get("dbname"), Some("db"));
        assert_eq!(info.get("bogus_opt"), Some("1"));
        assert_eq!(
            info.redacted,
            "postgres://etl:***@127.0.0.1:1/db?password=***&bogus_opt=1"
        );
        let info =
            parse("postgresql://u%40x:p%3Aw@[::1]:5433,h2/d%20b?sslmode=verify-full").unwrap();
        assert_eq!(info.get("user"), Some("u@x"));
        assert_eq!(info.get("password"), Some("p:w"));
        assert_eq!(info.get("host"), Some("::1,h2"));
        assert_eq!(info.get("port"), Some("5433,"));
        assert_eq!(info.get("dbname"), Some("d b"));
        assert_eq!(info.get("sslmode"), Some("verify-full"));
        assert_eq!(
            info.redacted,
            "postgresql://u%40x:***@[::1]:5433,h2/d%20b?sslmode=verify-full"
        );
    }

    #[test]
    fn key_value_strings_take_spaces_and_quotes() {
        for (input, password, redacted) in [
            (
                "host=h port=notaport user=etl password = Zq9SecretPw",
                PW,
                "host=h port=notaport user=etl password = ***",
            ),
            (
                "host=h password='Zq9 SecretPw' user=etl",
                "Zq9 SecretPw",
                "host=h password=*** user=etl",
            ),
            (
                r"password='it\'s Zq9SecretPw'",
                "it's Zq9SecretPw",
                "password=***",
            ),
        ] {
            let info = parse(input).unwrap();
            assert_eq!(info.get("password"), Some(password), "{input}");
            assert_eq!(info.redacted, redacted);
        }
        let info = parse("host=h  dbname = 'a b'").unwrap();
        assert_eq!(info.get("dbname"), Some("a b"));
        assert_eq!(info.to_key_value(), "host='h' dbname='a b'");
    }

    #[test]
    fn errors_never_quote_a_value() {
        for input in [
            "host=h password='Zq9SecretPw",
            "host=h Zq9SecretPw",
            "postgres://u:Zq9SecretPw@h/db?password=Zq9SecretPw%zz",
            "postgres://u:Zq9Secret%ZZPw@h/db",
            "mysql://u:Zq9SecretPw@h/db",
        ] {
            let err = parse(input).unwrap_err();
            assert!(!err.contains("Zq9"), "{input}: {err}");
            assert!(!redact(input).contains("Zq9"), "{input}");
        }
    }
}
