//! Connection strings, read the way libpq reads them: a URL
//! (`postgres://user:password@host:port/db?key=value&...`) or `key=value`
//! pairs (`host=h port=5432 password = 'a b'`), into parameters.
//!
//! Any part of the input may be a secret, whatever its key is called: a
//! password under a misspelled key (`passwd=`, `Password=`) is as secret
//! as one under `password=`. So nothing this parser returns shows the
//! input: a [`ConnInfoError`] holds positions and option names only (an
//! [`OptionName`] keeps a name's text only when it is spelled like an
//! option, lower-case letters and `_`), and [`ConnInfo`]'s `Debug` shows
//! the names of its parameters, not their values. Unknown options are
//! refused here ([`ConnInfo::check_options`]), so the parameters handed to
//! tokio-postgres (as a `key=value` string without the password) are all
//! options it knows, and its messages name an option at most.

use std::fmt::{self, Write};

/// The options the sink reads itself (TLS files, the password) or passes
/// to tokio-postgres, which refuses any other.
const KNOWN: [&str; 23] = [
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "options",
    "application_name",
    "connect_timeout",
    "tcp_user_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_retries",
    "target_session_attrs",
    "channel_binding",
    "load_balance_hosts",
    "sslmode",
    "sslnegotiation",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "sslpassword",
];

/// The longest option name shown in a message.
const MAX_SHOWN: usize = 40;

/// An option's name as a message may show it: its text when it is a known
/// option or is spelled like one (lower-case ASCII letters and `_`, as
/// every libpq option is), otherwise only that it is an option: a word
/// spelled otherwise (`Zq9SecretPw=...`, a value in the wrong place) may
/// be a secret. A near miss of a known option is kept as a suggestion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OptionName {
    shown: Option<String>,
    suggestion: Option<&'static str>,
}

impl OptionName {
    /// The name `key`, as a message may show it.
    pub(crate) fn of(key: &str) -> Self {
        let option_like = !key.is_empty()
            && key.len() <= MAX_SHOWN
            && key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
        let known = KNOWN.iter().find(|k| **k == key);
        let suggestion = match known {
            Some(_) => None,
            None => suggest(key),
        };
        OptionName {
            shown: (known.is_some() || option_like).then(|| key.to_owned()),
            suggestion,
        }
    }
}

impl fmt::Display for OptionName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.shown {
            Some(name) => write!(f, "option `{name}`")?,
            None => f.write_str("option (its name is not shown: it is not spelled like one)")?,
        }
        if let Some(known) = self.suggestion {
            write!(f, " (did you mean `{known}`?)")?;
        }
        Ok(())
    }
}

/// The known option `key` is most likely a misspelling of: the same in
/// another case, or at most two edits away.
fn suggest(key: &str) -> Option<&'static str> {
    let lower = key.to_ascii_lowercase();
    KNOWN
        .iter()
        .map(|known| (edit_distance(&lower, known), *known))
        .filter(|(distance, _)| *distance <= 2)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, known)| known)
}

/// Levenshtein distance, over bytes (option names are ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, &ca) in a.iter().enumerate() {
        let mut current = vec![i + 1; b.len() + 1];
        for (j, &cb) in b.iter().enumerate() {
            let substitute = previous[j] + usize::from(ca != cb);
            current[j + 1] = substitute.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        previous = current;
    }
    previous[b.len()]
}

/// A part of a URL, for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UrlPart {
    /// The user before `@`.
    User,
    /// The password between `:` and `@`.
    Password,
    /// A host.
    Host,
    /// The database after `/`.
    Database,
    /// A parameter's name after `?` or `&`.
    ParameterName,
}

impl fmt::Display for UrlPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UrlPart::User => "user",
            UrlPart::Password => "password",
            UrlPart::Host => "host",
            UrlPart::Database => "database",
            UrlPart::ParameterName => "parameter name",
        })
    }
}

/// Why a connection string cannot be used. No variant holds any of the
/// input's text but an [`OptionName`]: positions are 1-based characters.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ConnInfoError {
    /// `scheme://` other than `postgres://` or `postgresql://`.
    #[error("the URL's scheme is neither postgres:// nor postgresql://")]
    Scheme,
    /// A URL parameter without `=`.
    #[error("the URL parameter at character {at} is not key=value")]
    NotKeyValue {
        /// Where it starts.
        at: usize,
    },
    /// A word of a `key=value` string without `=` after it.
    #[error("the word at character {at} of the connection string is not followed by `=`")]
    NoEquals {
        /// Where it starts.
        at: usize,
    },
    /// A quoted value without its closing quote.
    #[error(
        "the quoted value of the {option} at character {at} of the connection string has no \
         closing quote"
    )]
    Unterminated {
        /// Whose value.
        option: OptionName,
        /// Where the option starts.
        at: usize,
    },
    /// A `%` not followed by two hexadecimal digits in a URL part.
    #[error("the URL's {part} at character {at} has an invalid %-escape")]
    BadEscape {
        /// Which part.
        part: UrlPart,
        /// Where the part starts.
        at: usize,
    },
    /// A `%` not followed by two hexadecimal digits in a URL parameter's
    /// value.
    #[error("the value of the URL's {option} at character {at} has an invalid %-escape")]
    BadValueEscape {
        /// Whose value.
        option: OptionName,
        /// Where the option starts.
        at: usize,
    },
    /// A value that is not UTF-8 (once %-decoded).
    #[error("the value of the {option} at character {at} is not UTF-8")]
    NotUtf8 {
        /// Whose value.
        option: OptionName,
        /// Where the option starts.
        at: usize,
    },
    /// A URL part that is not UTF-8 once %-decoded.
    #[error("the URL's {part} at character {at} is not UTF-8 once decoded")]
    PartNotUtf8 {
        /// Which part.
        part: UrlPart,
        /// Where the part starts.
        at: usize,
    },
    /// `[` of an IPv6 host without `]`.
    #[error("an IPv6 host in the URL has no closing `]`")]
    Ipv6Unclosed,
    /// Text after `[v6 address]` other than `:port`.
    #[error("unexpected text after an IPv6 host in the URL")]
    Ipv6Trailing,
    /// An option neither the sink nor tokio-postgres knows.
    #[error("unknown {option} at character {at}")]
    Unknown {
        /// Which.
        option: OptionName,
        /// Where it starts.
        at: usize,
    },
}

/// One parameter of a connection string.
#[derive(Clone, PartialEq, Eq)]
struct Param {
    key: String,
    value: String,
    /// Where its name (or, for the URL's parts, the part) starts: a
    /// 1-based character position.
    at: usize,
}

/// A parsed connection string. `Debug` shows the parameters' names only.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct ConnInfo {
    /// Parameters in the order given; a later one of a key wins.
    params: Vec<Param>,
}

impl fmt::Debug for ConnInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnInfo")
            .field(
                "params",
                &self
                    .params
                    .iter()
                    .map(|p| OptionName::of(&p.key).shown)
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl ConnInfo {
    /// The last value of `key`.
    #[cfg(test)]
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.params
            .iter()
            .rev()
            .find(|p| p.key == key)
            .map(|p| p.value.as_str())
    }

    /// Refuse the first option that is not known, by its name and place.
    ///
    /// # Errors
    ///
    /// [`ConnInfoError::Unknown`].
    pub(crate) fn check_options(&self) -> Result<(), ConnInfoError> {
        match self
            .params
            .iter()
            .find(|p| !KNOWN.contains(&p.key.as_str()))
        {
            Some(p) => Err(ConnInfoError::Unknown {
                option: OptionName::of(&p.key),
                at: p.at,
            }),
            None => Ok(()),
        }
    }

    /// Remove every parameter named `key`, returning the last value.
    pub(crate) fn take(&mut self, key: &str) -> Option<String> {
        let mut last = None;
        self.params.retain(|p| {
            if p.key == key {
                last = Some(p.value.clone());
                false
            } else {
                true
            }
        });
        last
    }

    /// The parameters as `(key, value)` pairs, in the order given.
    #[cfg(feature = "fuzzing")]
    pub(crate) fn pairs(&self) -> Vec<(String, String)> {
        self.params
            .iter()
            .map(|p| (p.key.clone(), p.value.clone()))
            .collect()
    }

    /// The parameters as a libpq `key='value'` string.
    pub(crate) fn to_key_value(&self) -> String {
        let mut out = String::new();
        for Param { key, value, .. } in &self.params {
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

/// The 1-based character position of byte `at` of `input`.
fn position(input: &str, at: usize) -> usize {
    input.get(..at).map_or(at, |before| before.chars().count()) + 1
}

/// Parse a URL or a `key=value` string.
///
/// # Errors
///
/// Why it cannot be read, by position and option name; never quotes the
/// input.
pub(crate) fn parse(input: &str) -> Result<ConnInfo, ConnInfoError> {
    let params = if let Some(rest) = ["postgresql://", "postgres://"]
        .iter()
        .find_map(|scheme| input.strip_prefix(scheme))
    {
        parse_url(input, input.len() - rest.len())?
    } else if has_scheme(input) {
        return Err(ConnInfoError::Scheme);
    } else {
        parse_key_value(input)?
    };
    Ok(ConnInfo { params })
}

/// Whether `input` opens with a URL scheme (`letter *(letter / digit /
/// "+" / "-" / ".") "://"`, RFC 3986): a `key=value` string whose value
/// holds `://` is not a URL.
fn has_scheme(input: &str) -> bool {
    input.split_once("://").is_some_and(|(scheme, _)| {
        let mut chars = scheme.chars();
        chars.next().is_some_and(|c| c.is_ascii_alphabetic())
            && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    })
}

fn parse_url(input: &str, start: usize) -> Result<Vec<Param>, ConnInfoError> {
    let rest = &input[start..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let mut params = Vec::new();
    let push = |params: &mut Vec<Param>, key: &str, value: String, byte: usize| {
        params.push(Param {
            key: key.to_owned(),
            value,
            at: position(input, byte),
        });
    };
    let part = |text: &str, part: UrlPart, byte: usize| {
        decode(text).map_err(|bad_escape| {
            let at = position(input, byte);
            if bad_escape {
                ConnInfoError::BadEscape { part, at }
            } else {
                ConnInfoError::PartNotUtf8 { part, at }
            }
        })
    };
    let hosts_start;
    let hosts = match authority.rfind('@') {
        Some(at) => {
            let userinfo = &authority[..at];
            let (user, password) = match userinfo.find(':') {
                Some(colon) => (
                    &userinfo[..colon],
                    Some((colon + 1, &userinfo[colon + 1..])),
                ),
                None => (userinfo, None),
            };
            if !user.is_empty() {
                let value = part(user, UrlPart::User, start)?;
                push(&mut params, "user", value, start);
            }
            if let Some((from, password)) = password {
                let value = part(password, UrlPart::Password, start + from)?;
                push(&mut params, "password", value, start + from);
            }
            hosts_start = start + at + 1;
            &authority[at + 1..]
        }
        None => {
            hosts_start = start;
            authority
        }
    };
    if !hosts.is_empty() {
        let mut names = Vec::new();
        let mut ports = Vec::new();
        for spec in hosts.split(',') {
            let (host, port) = split_host_port(spec)?;
            names.push(part(host, UrlPart::Host, hosts_start)?);
            ports.push(port.to_owned());
        }
        if names.iter().any(|h| !h.is_empty()) {
            push(&mut params, "host", names.join(","), hosts_start);
        }
        if ports.iter().any(|p| !p.is_empty()) {
            push(&mut params, "port", ports.join(","), hosts_start);
        }
    }
    let rest = &rest[authority_end..];
    let path_start = start + authority_end;
    let (path, query) = match rest.find('?') {
        Some(q) => (&rest[..q], Some((path_start + q + 1, &rest[q + 1..]))),
        None => (rest, None),
    };
    if let Some(db) = path.strip_prefix('/').filter(|db| !db.is_empty()) {
        let value = part(db, UrlPart::Database, path_start + 1)?;
        push(&mut params, "dbname", value, path_start + 1);
    }
    if let Some((mut offset, query)) = query {
        for pair in query.split('&') {
            if !pair.is_empty() {
                let at = position(input, offset);
                let Some((key, value)) = pair.split_once('=') else {
                    return Err(ConnInfoError::NotKeyValue { at });
                };
                let key = part(key, UrlPart::ParameterName, offset)?;
                let value = decode(value).map_err(|bad_escape| {
                    let option = OptionName::of(&key);
                    if bad_escape {
                        ConnInfoError::BadValueEscape { option, at }
                    } else {
                        ConnInfoError::NotUtf8 { option, at }
                    }
                })?;
                push(&mut params, &key, value, offset);
            }
            offset += pair.len() + 1;
        }
    }
    Ok(params)
}

/// `host[:port]`, with `[v6 address]` brackets.
fn split_host_port(spec: &str) -> Result<(&str, &str), ConnInfoError> {
    if let Some(inner) = spec.strip_prefix('[') {
        let close = inner.find(']').ok_or(ConnInfoError::Ipv6Unclosed)?;
        let after = &inner[close + 1..];
        let port = match after.strip_prefix(':') {
            Some(port) => port,
            None if after.is_empty() => "",
            None => return Err(ConnInfoError::Ipv6Trailing),
        };
        return Ok((&inner[..close], port));
    }
    Ok(match spec.rfind(':') {
        Some(colon) => (&spec[..colon], &spec[colon + 1..]),
        None => (spec, ""),
    })
}

/// Percent-decode `text`; `Err(true)` for an invalid %-escape,
/// `Err(false)` for a result that is not UTF-8.
fn decode(text: &str) -> Result<String, bool> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or(true)?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| false)
}

fn parse_key_value(input: &str) -> Result<Vec<Param>, ConnInfoError> {
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
        let at = position(input, key_start);
        i = skip_space(i);
        if bytes.get(i) != Some(&b'=') {
            return Err(ConnInfoError::NoEquals { at });
        }
        i = skip_space(i + 1);
        let mut value = Vec::new();
        if bytes.get(i) == Some(&b'\'') {
            i += 1;
            loop {
                match bytes.get(i) {
                    None => {
                        return Err(ConnInfoError::Unterminated {
                            option: OptionName::of(key),
                            at,
                        });
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
        let value = String::from_utf8(value).map_err(|_| ConnInfoError::NotUtf8 {
            option: OptionName::of(key),
            at,
        })?;
        params.push(Param {
            key: key.to_owned(),
            value,
            at,
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const PW: &str = "Zq9SecretPw";

    #[test]
    fn urls_give_their_parts() {
        let info =
            parse("postgres://etl:Zq9SecretPw@127.0.0.1:1/db?password=Zq9SecretPw&bogus_opt=1")
                .unwrap();
        assert_eq!(info.get("user"), Some("etl"));
        assert_eq!(info.get("password"), Some(PW));
        assert_eq!(info.get("host"), Some("127.0.0.1"));
        assert_eq!(info.get("port"), Some("1"));
        assert_eq!(info.get("dbname"), Some("db"));
        assert_eq!(info.get("bogus_opt"), Some("1"));
        let info =
            parse("postgresql://u%40x:p%3Aw@[::1]:5433,h2/d%20b?sslmode=verify-full").unwrap();
        assert_eq!(info.get("user"), Some("u@x"));
        assert_eq!(info.get("password"), Some("p:w"));
        assert_eq!(info.get("host"), Some("::1,h2"));
        assert_eq!(info.get("port"), Some("5433,"));
        assert_eq!(info.get("dbname"), Some("d b"));
        assert_eq!(info.get("sslmode"), Some("verify-full"));
    }

    #[test]
    fn a_key_value_string_whose_value_holds_a_url_reads_as_key_value() {
        // What the sink hands tokio-postgres must read back the same,
        // whatever a value holds; only a leading scheme makes a URL.
        let info = parse("host='h' dbname='/u:p@db:gres://x' application_name=a://b").unwrap();
        assert_eq!(info.get("host"), Some("h"));
        assert_eq!(info.get("dbname"), Some("/u:p@db:gres://x"));
        assert_eq!(info.get("application_name"), Some("a://b"));
        assert_eq!(parse(&info.to_key_value()).unwrap(), info);
        for url in ["mysql://h/db", "pg+ssl://h/db", "HTTP://h"] {
            assert!(
                matches!(parse(url), Err(ConnInfoError::Scheme)),
                "{url} is a URL of another scheme"
            );
        }
    }

    #[test]
    fn key_value_strings_take_spaces_and_quotes() {
        for (input, password) in [
            ("host=h port=notaport user=etl password = Zq9SecretPw", PW),
            ("host=h password='Zq9 SecretPw' user=etl", "Zq9 SecretPw"),
            (r"password='it\'s Zq9SecretPw'", "it's Zq9SecretPw"),
        ] {
            let info = parse(input).unwrap();
            assert_eq!(info.get("password"), Some(password), "{input}");
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
            "host=h Zq9SecretPw='x",
            "host=h zq_secret_pw_is_lower_case='x",
            "postgres://u:Zq9SecretPw@h/db?password=Zq9SecretPw%zz",
            "postgres://u:Zq9Secret%ZZPw@h/db",
            "postgres://u@h/db?Zq9SecretPw",
            "postgres://u@h/db?Zq9Secret%ZZPw=1",
            "mysql://u:Zq9SecretPw@h/db",
        ] {
            let err = parse(input).unwrap_err().to_string();
            assert!(!err.contains("Zq9"), "{input}: {err}");
        }
    }

    #[test]
    fn an_unknown_option_is_named_but_its_value_never_shown_however_it_is_spelled() {
        for (input, shown) in [
            (
                "host=h passwd=Zq9SecretPw",
                "unknown option `passwd` (did you mean `password`?) at character 8",
            ),
            (
                "host=h PASSWORD=Zq9SecretPw",
                "(did you mean `password`?) at character 8",
            ),
            (
                "host=h Password = 'Zq9 SecretPw'",
                "(did you mean `password`?)",
            ),
            (
                "host=h bogus=Zq9SecretPw",
                "unknown option `bogus` at character 8",
            ),
            (
                "postgres://u@h/db?passwd=Zq9SecretPw",
                "unknown option `passwd` (did you mean `password`?) at character 19",
            ),
            (
                "postgres://u@h/db?PASSWORD=Zq9SecretPw",
                "(did you mean `password`?)",
            ),
            (
                "postgres://u@h/db?sslmode=require&bogus=Zq9SecretPw",
                "option `bogus` at character 35",
            ),
            (
                "postgres://u@h/db?Zq9SecretPw=1",
                "unknown option (its name is not shown",
            ),
        ] {
            let err = parse(input)
                .unwrap()
                .check_options()
                .unwrap_err()
                .to_string();
            assert!(err.contains(shown), "{input}: {err}");
            assert!(
                !err.contains("Zq9") && !err.contains("SecretPw"),
                "{input}: {err}"
            );
        }
        let known =
            parse("postgres://u:p@h:1/db?sslmode=require&application_name=x&sslrootcert=/a")
                .unwrap();
        assert_eq!(known.check_options(), Ok(()));
    }

    #[test]
    fn debug_shows_option_names_only() {
        let info = parse("host=h passwd=Zq9SecretPw Zq9SecretPw=1").unwrap();
        let shown = format!("{info:?}");
        assert!(
            shown.contains("passwd") && !shown.contains("Zq9"),
            "{shown}"
        );
    }
}
