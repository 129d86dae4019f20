//! Column values in faithful JSON, from the types' text output.
//!
//! The replication connection sets `DateStyle = ISO`, `TimeZone = UTC`,
//! `IntervalStyle = iso_8601`, `bytea_output = hex` and
//! `extra_float_digits = 3`, so every text form below is the exact one.

use crate::pgoutput::Value;

/// Type OIDs of `pg_catalog` the mapping knows.
mod oid {
    pub(super) const BOOL: u32 = 16;
    pub(super) const BYTEA: u32 = 17;
    pub(super) const INT8: u32 = 20;
    pub(super) const INT2: u32 = 21;
    pub(super) const INT4: u32 = 23;
    pub(super) const OID: u32 = 26;
    pub(super) const JSON: u32 = 114;
    pub(super) const FLOAT4: u32 = 700;
    pub(super) const FLOAT8: u32 = 701;
    pub(super) const TIMESTAMP: u32 = 1114;
    pub(super) const TIMESTAMPTZ: u32 = 1184;
    pub(super) const JSONB: u32 = 3802;
}

/// The element type of an array type, for the arrays of the types above
/// and of the common text-like ones (their elements stay strings).
fn element_of(type_oid: u32) -> Option<u32> {
    Some(match type_oid {
        1000 => oid::BOOL,
        1001 => oid::BYTEA,
        1005 => oid::INT2,
        1007 => oid::INT4,
        1016 => oid::INT8,
        1028 => oid::OID,
        199 => oid::JSON,
        3807 => oid::JSONB,
        1021 => oid::FLOAT4,
        1022 => oid::FLOAT8,
        1115 => oid::TIMESTAMP,
        1185 => oid::TIMESTAMPTZ,
        // numeric, text, varchar, bpchar, name, date, time, timetz,
        // interval, uuid, inet, cidr, macaddr: elements as strings.
        1231 | 1009 | 1015 | 1014 | 1003 | 1182 | 1183 | 1270 | 1187 | 2951 | 1041 | 651 | 1040 => {
            25
        }
        _ => return None,
    })
}

/// Append `text` as a JSON string.
pub(crate) fn push_str(out: &mut Vec<u8>, text: &str) {
    // Writing into a Vec cannot fail, and a &str always serializes.
    let _ = serde_json::to_writer(&mut *out, text);
}

/// Append a column's value as JSON; `Value::UnchangedToast` is the
/// caller's to handle (it is left out of the row).
pub(crate) fn push_value(out: &mut Vec<u8>, type_oid: u32, value: &Value) {
    match value {
        Value::Null | Value::UnchangedToast => out.extend_from_slice(b"null"),
        Value::Binary(bytes) => push_base64(out, bytes),
        Value::Text(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) => push_text(out, type_oid, text),
            // The database's encoding is not UTF-8: the bytes as they are.
            Err(_) => push_base64(out, bytes),
        },
    }
}

fn push_text(out: &mut Vec<u8>, type_oid: u32, text: &str) {
    match type_oid {
        oid::BOOL => out.extend_from_slice(if text == "t" { b"true" } else { b"false" }),
        oid::INT2 | oid::INT4 | oid::INT8 | oid::OID if is_integer(text) => {
            out.extend_from_slice(text.as_bytes());
        }
        oid::FLOAT4 | oid::FLOAT8 if is_json_number(text) => {
            out.extend_from_slice(text.as_bytes());
        }
        oid::JSON | oid::JSONB if is_json(text) => out.extend_from_slice(text.as_bytes()),
        oid::BYTEA => match text.strip_prefix("\\x").and_then(hex) {
            Some(bytes) => push_base64(out, &bytes),
            None => push_str(out, text),
        },
        oid::TIMESTAMP => push_str(out, &iso_timestamp(text)),
        oid::TIMESTAMPTZ => push_str(out, &iso_timestamptz(text)),
        other => match element_of(other) {
            Some(element) => match parse_array(text) {
                Some(array) => push_array(out, element, &array),
                None => push_str(out, text),
            },
            // numeric (exact text), text, dates, uuids, enums, ...
            None => push_str(out, text),
        },
    }
}

fn is_integer(text: &str) -> bool {
    let digits = text.strip_prefix('-').unwrap_or(text);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// A finite float's text (`NaN` and `Infinity` stay strings).
fn is_json_number(text: &str) -> bool {
    text.bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E'))
        && serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok()
}

fn is_json(text: &str) -> bool {
    serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok()
}

fn hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    let digit = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    text.as_bytes()
        .chunks(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

/// Standard base64 with padding, as a JSON string.
pub(crate) fn push_base64(out: &mut Vec<u8>, bytes: &[u8]) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    out.push(b'"');
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]);
            } else {
                out.push(b'=');
            }
        }
    }
    out.push(b'"');
}

/// `2024-01-02 03:04:05.5` → `2024-01-02T03:04:05.5`; `infinity` and BC
/// dates stay as the server wrote them.
fn iso_timestamp(text: &str) -> String {
    match text.split_once(' ') {
        Some((date, time)) if !time.contains(' ') => format!("{date}T{time}"),
        _ => text.to_owned(),
    }
}

/// `2024-01-02 03:04:05.5+00` → `2024-01-02T03:04:05.5+00:00`.
fn iso_timestamptz(text: &str) -> String {
    let iso = iso_timestamp(text);
    if iso == text {
        return iso;
    }
    // The zone is the last `+hh`, `-hh`, `+hh:mm` or `+hh:mm:ss` after
    // the time; ISO-8601 wants minutes.
    match iso.rfind(['+', '-']) {
        Some(at) if at > 10 && iso.len() - at == 3 => format!("{iso}:00"),
        _ => iso,
    }
}

/// An array literal's structure.
#[derive(Debug, PartialEq)]
enum Element {
    Null,
    Text(String),
    Array(Vec<Element>),
}

/// Parse `{1,2,NULL}`, `{{"a b","c\"d"},{e,f}}` or `[0:1]={x,y}`; `None`
/// when the text is not an array literal.
fn parse_array(text: &str) -> Option<Vec<Element>> {
    let text = match text.strip_prefix('[') {
        Some(_) => text.split_once('=')?.1,
        None => text,
    };
    let mut chars = text.chars().peekable();
    let array = parse_level(&mut chars)?;
    if chars.next().is_some() {
        return None;
    }
    Some(array)
}

fn parse_level(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> Option<Vec<Element>> {
    if chars.next()? != '{' {
        return None;
    }
    let mut items = Vec::new();
    if chars.peek() == Some(&'}') {
        chars.next();
        return Some(items);
    }
    loop {
        let item = match chars.peek()? {
            '{' => Element::Array(parse_level(chars)?),
            '"' => {
                chars.next();
                let mut s = String::new();
                loop {
                    match chars.next()? {
                        '"' => break,
                        '\\' => s.push(chars.next()?),
                        c => s.push(c),
                    }
                }
                Element::Text(s)
            }
            _ => {
                let mut s = String::new();
                while let Some(c) = chars.peek() {
                    if *c == ',' || *c == '}' {
                        break;
                    }
                    s.push(*c);
                    chars.next();
                }
                if s.eq_ignore_ascii_case("NULL") {
                    Element::Null
                } else {
                    Element::Text(s)
                }
            }
        };
        items.push(item);
        match chars.next()? {
            ',' => {}
            '}' => return Some(items),
            _ => return None,
        }
    }
}

fn push_array(out: &mut Vec<u8>, element: u32, items: &[Element]) {
    out.push(b'[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        match item {
            Element::Null => out.extend_from_slice(b"null"),
            Element::Text(text) => push_text(out, element, text),
            Element::Array(inner) => push_array(out, element, inner),
        }
    }
    out.push(b']');
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn json(type_oid: u32, text: &str) -> String {
        let mut out = Vec::new();
        push_value(
            &mut out,
            type_oid,
            &Value::Text(Bytes::copy_from_slice(text.as_bytes())),
        );
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn values_keep_their_exact_meaning_in_json() {
        assert_eq!(json(16, "t"), "true");
        assert_eq!(json(20, "-9223372036854775808"), "-9223372036854775808");
        assert_eq!(
            json(1700, "12345678901234567890.000000001"),
            "\"12345678901234567890.000000001\""
        );
        assert_eq!(json(1700, "NaN"), "\"NaN\"");
        assert_eq!(json(701, "0.1"), "0.1");
        assert_eq!(json(701, "Infinity"), "\"Infinity\"");
        assert_eq!(json(3802, r#"{"a": [1, 2.50]}"#), r#"{"a": [1, 2.50]}"#);
        assert_eq!(json(17, "\\x00ff10"), "\"AP8Q\"");
        assert_eq!(json(17, "\\x"), "\"\"");
        assert_eq!(
            json(1114, "2024-01-02 03:04:05.123456"),
            "\"2024-01-02T03:04:05.123456\""
        );
        assert_eq!(
            json(1184, "2024-01-02 03:04:05+00"),
            "\"2024-01-02T03:04:05+00:00\""
        );
        assert_eq!(
            json(1184, "2024-01-02 03:04:05+05:30"),
            "\"2024-01-02T03:04:05+05:30\""
        );
        assert_eq!(json(1184, "infinity"), "\"infinity\"");
        assert_eq!(json(25, "a \"quoted\"\n"), r#""a \"quoted\"\n""#);
    }

    #[test]
    fn arrays_become_json_arrays_of_their_elements() {
        assert_eq!(json(1007, "{1,2,NULL}"), "[1,2,null]");
        assert_eq!(json(1007, "{{1,2},{3,4}}"), "[[1,2],[3,4]]");
        assert_eq!(
            json(1009, r#"{"a b","c\"d",NULL,"NULL"}"#),
            r#"["a b","c\"d",null,"NULL"]"#
        );
        assert_eq!(json(1231, "{1.50,NaN}"), r#"["1.50","NaN"]"#);
        assert_eq!(json(1007, "[0:1]={7,8}"), "[7,8]");
        assert_eq!(json(1007, "{}"), "[]");
        // Not an array literal: kept as the server's text.
        assert_eq!(json(1007, "{1,2"), "\"{1,2\"");
    }

    #[test]
    fn base64_pads_like_the_standard_alphabet() {
        for (bytes, expected) in [
            (&b""[..], "\"\""),
            (b"f", "\"Zg==\""),
            (b"fo", "\"Zm8=\""),
            (b"foo", "\"Zm9v\""),
            (b"foob", "\"Zm9vYg==\""),
        ] {
            let mut out = Vec::new();
            push_base64(&mut out, bytes);
            assert_eq!(String::from_utf8(out).expect("utf-8"), expected);
        }
    }
}
