//! The quick line check against serde_json's `IgnoredAny` check: never
//! "surely" where serde_json refuses, and "surely" for the common shapes.

use proptest::prelude::*;

use super::*;

/// Whether the check is sure, holding its ASCII verdict to the bytes on
/// every call: "ASCII" exactly when it is sure and the line is ASCII.
fn surely_one_value(line: &[u8]) -> bool {
    let verdict = check_line(line);
    let sure = verdict != Verdict::NotSure;
    assert_eq!(
        verdict == Verdict::AsciiValue,
        sure && line.is_ascii(),
        "{verdict:?} of {:?}",
        String::from_utf8_lossy(line)
    );
    sure
}

/// serde_json's answer, which the line reader falls back to.
fn serde_accepts(line: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(line).is_ok()
}

/// The invariant on one input, with the input shown when it breaks.
fn assert_never_surer_than_serde(line: &[u8]) {
    if surely_one_value(line) {
        assert!(
            serde_accepts(line),
            "surely one value, but serde_json refuses {:?}",
            String::from_utf8_lossy(line)
        );
    }
}

/// A line the check must pass on its own (and serde_json too).
fn assert_surely(line: &[u8]) {
    assert!(
        serde_accepts(line),
        "serde_json refuses {:?}",
        String::from_utf8_lossy(line)
    );
    assert!(
        surely_one_value(line),
        "not sure of {:?}",
        String::from_utf8_lossy(line)
    );
}

/// A line the check must leave to serde_json.
fn assert_not_sure(line: &[u8]) {
    assert!(
        !surely_one_value(line),
        "surely one value: {:?}",
        String::from_utf8_lossy(line)
    );
}

/// Lines of the shapes NDJSON files hold.
const COMMON: &[&str] = &[
    r#"{"id":0,"user":"user-7535","amount":931.71,"timestamp":1700000000000,"tags":["green","red"]}"#,
    r#"{"a":{"b":[1,2,{"c":null}]},"d":true,"e":false,"f":"","g":[],"h":{}}"#,
    r#" { "a" : 1 , "b" : [ 1 , 2 ] } "#,
    "\t{\"a\":\r\n1}\r",
    r#"[1,-2,3.5,-0.25e-3,4E+10,0,-0,1e5]"#,
    r#""just a string""#,
    r#"{"text":"line\nbreak \"quoted\" back\\slash \/ \b\f\r\t é \u00e9\u0000\uFFFF\uabcD"}"#,
    r#"{"emoji":"😀","cjk":"漢字"}"#,
    "12345678901234567890123456789012345678901234567890",
    "-0.000000000000000000000000001e-999999",
    "true",
    "false",
    "null",
    "[]",
    "{}",
    "[[[[[[[[[[]]]]]]]]]]",
];

#[test]
fn the_common_shapes_are_surely_one_value() {
    for line in COMMON {
        assert_surely(line.as_bytes());
    }
}

#[test]
fn every_short_escape_and_a_non_surrogate_hex_escape_is_surely_valid() {
    for letter in *br#""\/bfnrt"# {
        assert_surely(&[b'"', b'\\', letter, b'"']);
    }
    for unit in [
        "0000", "001f", "007F", "00e9", "D7FF", "e000", "FFFF", "aBcD",
    ] {
        assert_surely(format!(r#""\u{unit}""#).as_bytes());
    }
}

#[test]
fn every_other_escape_letter_is_left_to_serde_json() {
    for letter in 0..=255u8 {
        if br#""\/bfnrtu"#.contains(&letter) {
            continue;
        }
        let line = [b'"', b'\\', letter, b'"'];
        assert_not_sure(&line);
        assert_never_surer_than_serde(&line);
    }
}

#[test]
fn a_hex_escape_needs_four_hex_digits() {
    for line in [
        r#""\u""#,
        r#""\u1""#,
        r#""\u12""#,
        r#""\u123""#,
        r#""\u123g""#,
        r#""\ug123""#,
        r#""\u 123""#,
        r#""\u+123""#,
        r#""\u12"#,
        r#""\"#,
    ] {
        assert_not_sure(line.as_bytes());
        assert!(!serde_accepts(line.as_bytes()), "{line}");
    }
}

#[test]
fn a_surrogate_pair_escaped_is_surely_valid() {
    // What JSON writers that escape everything past ASCII (Python's
    // `json.dumps`) write for a character past the basic plane.
    for line in [
        r#""\ud83d\ude00""#,
        r#""\uD83D\uDE00""#,
        r#"{"a":"x\ud800\udc00y","b":"\udbff\udfff"}"#,
        r#"["\ud83d\ude00\ud83d\ude00"]"#,
    ] {
        assert!(
            matches!(check_line(line.as_bytes()), Verdict::AsciiValue),
            "{line}"
        );
        assert!(serde_accepts(line.as_bytes()), "{line}");
    }
}

#[test]
fn lone_surrogate_escapes_are_left_to_serde_json() {
    // serde_json's `IgnoredAny` takes any code unit today; the check
    // leaves a surrogate that is not one half of a pair to it rather
    // than answer for it.
    for line in [
        r#""\uD800""#,
        r#""\uDBFF""#,
        r#""\uDC00""#,
        r#""\uDFFF""#,
        r#""\ude00\ud83d""#,
        r#""\ud83d\u0041""#,
        r#""\ud83d\ud83d""#,
        r#""\ud83d\n""#,
        r#""\ud83dx""#,
        r#"{"a":"x\ud800y"}"#,
    ] {
        assert_not_sure(line.as_bytes());
        assert!(serde_accepts(line.as_bytes()), "{line}");
    }
}

#[test]
fn a_raw_control_byte_in_a_string_is_never_surely_valid() {
    for byte in 0..0x20u8 {
        for line in [
            vec![b'"', byte, b'"'],
            vec![b'"', b'a', byte, b'b', b'"'],
            [br#"{"k"#.as_slice(), &[byte], br#"ey":1}"#].concat(),
            [br#"{"key":"va"#.as_slice(), &[byte], br#"lue"}"#].concat(),
        ] {
            assert_not_sure(&line);
            assert!(!serde_accepts(&line), "{line:?}");
        }
    }
    // DEL is no control byte to JSON.
    assert_surely(b"\"\x7f\"");
}

#[test]
fn a_stop_byte_at_every_place_of_strings_of_every_length_agrees_with_serde_json() {
    // Strings are crossed eight bytes at a time, then a byte at a time:
    // every length, every place in a word, every alignment in the line.
    let stops: &[&[u8]] = &[
        b"\x00",
        b"\x1f",
        b"\"",
        b"\\",
        b"\\n",
        b"\\u00e9",
        b" ",
        b"\x7f",
        "é".as_bytes(),
        "😀".as_bytes(),
    ];
    for len in 0..24 {
        for at in 0..=len {
            for stop in stops {
                for pad in 0..8 {
                    let mut line = b"[".to_vec();
                    line.extend(std::iter::repeat_n(b' ', pad));
                    line.push(b'"');
                    line.extend(std::iter::repeat_n(b'a', at));
                    line.extend_from_slice(stop);
                    line.extend(std::iter::repeat_n(b'a', len - at));
                    line.extend_from_slice(b"\"]");
                    assert_eq!(
                        surely_one_value(&line),
                        serde_accepts(&line),
                        "{:?}",
                        String::from_utf8_lossy(&line)
                    );
                }
            }
        }
    }
}

#[test]
fn a_byte_after_digits_of_every_length_agrees_with_serde_json() {
    // Digits are crossed eight at a time, then one at a time: every
    // length, every alignment, and the bytes either side of '0'..='9'.
    let after: &[&[u8]] = &[
        b"",
        b"/",
        b":",
        b".",
        b".5",
        b"e",
        b"e5",
        b"E+1",
        b",",
        b" ",
        b"]",
        b"x",
        b"\x00",
        b"\x7f",
        "é".as_bytes(),
    ];
    for len in 1..24 {
        for pad in 0..8 {
            for tail in after {
                for lead in [&b"1"[..], b"-1", b"0"] {
                    let mut line = b"[".to_vec();
                    line.extend(std::iter::repeat_n(b' ', pad));
                    line.extend_from_slice(lead);
                    line.extend(std::iter::repeat_n(b'7', len - 1));
                    line.extend_from_slice(tail);
                    line.push(b']');
                    assert_eq!(
                        surely_one_value(&line),
                        serde_accepts(&line),
                        "{:?}",
                        String::from_utf8_lossy(&line)
                    );
                }
            }
        }
    }
}

#[test]
fn every_ascii_byte_as_whitespace_agrees_with_serde_json() {
    // Each place between tokens of `[{"a":[1,"x",true,null]},2]`.
    let tokens = [
        "[", "{", r#""a""#, ":", "[", "1", ",", r#""x""#, ",", "true", ",", "null", "]", "}", ",",
        "2", "]",
    ];
    for byte in 0..0x80u8 {
        for gap in 0..=tokens.len() {
            let mut line = Vec::new();
            for (k, t) in tokens.iter().enumerate() {
                if k == gap {
                    line.push(byte);
                }
                line.extend_from_slice(t.as_bytes());
            }
            if gap == tokens.len() {
                line.push(byte);
            }
            if matches!(byte, b' ' | b'\t' | b'\n' | b'\r') {
                assert_surely(&line);
            } else {
                // Nothing rare here: the two agree both ways (a digit or
                // a minus sign may make another number).
                assert_eq!(
                    surely_one_value(&line),
                    serde_accepts(&line),
                    "{:?}",
                    String::from_utf8_lossy(&line)
                );
            }
        }
    }
}

#[test]
fn numbers_of_every_form_and_broken_ones_agree_with_serde_json() {
    let valid = [
        "0",
        "-0",
        "7",
        "-7",
        "10",
        "1234567890",
        "0.5",
        "-0.5",
        "10.25",
        "0e0",
        "0E0",
        "1e5",
        "1E5",
        "1e+5",
        "1e-5",
        "1.5e10",
        "-1.5E-10",
        "0.0e+0",
        "123456789012345678901234567890",
        "1e999999",
        "-1e-999999",
    ];
    for n in valid {
        assert_surely(n.as_bytes());
        assert_surely(format!("[{n}]").as_bytes());
        assert_surely(format!(r#"{{"n":{n}}}"#).as_bytes());
    }
    let broken = [
        "-",
        "+1",
        "01",
        "-01",
        "00",
        "1.",
        "-1.",
        ".5",
        "-.5",
        "1.e5",
        "1e",
        "1E",
        "1e+",
        "1e-",
        "1e+-5",
        "1ee5",
        "1.5.5",
        "0x10",
        "1_000",
        "NaN",
        "-NaN",
        "Infinity",
        "-Infinity",
        "1f",
        "--1",
        "- 1",
        "1 2",
        "1,",
        "1e5.5",
    ];
    for n in broken {
        for line in [n.to_owned(), format!("[{n}]"), format!(r#"{{"n":{n}}}"#)] {
            assert_not_sure(line.as_bytes());
            assert!(!serde_accepts(line.as_bytes()), "{line}");
        }
    }
}

#[test]
fn nesting_deeper_than_the_check_keeps_is_left_to_serde_json() {
    let nested = |depth: usize, open: &str, close: &str| {
        format!("{}1{}", open.repeat(depth), close.repeat(depth))
    };
    let depth = MAX_DEPTH as usize;
    assert_surely(nested(depth, "[", "]").as_bytes());
    assert_surely(nested(depth, r#"{"a":"#, "}").as_bytes());
    assert_surely(nested(depth / 2, r#"[{"a":"#, "}]").as_bytes());
    // Empty containers need no level of their own.
    assert_surely(format!("{}[]{}", "[".repeat(depth), "]".repeat(depth)).as_bytes());
    // serde_json's `IgnoredAny` keeps no recursion limit.
    for deeper in [depth + 1, 200, 100_000] {
        let line = nested(deeper, "[", "]");
        assert_not_sure(line.as_bytes());
        assert!(serde_accepts(line.as_bytes()), "depth {deeper}");
    }
    let unclosed = "[".repeat(100_000);
    assert_not_sure(unclosed.as_bytes());
    assert!(!serde_accepts(unclosed.as_bytes()));
}

#[test]
fn mismatched_brackets_and_misplaced_commas_are_never_surely_valid() {
    for line in [
        "[}",
        "{]",
        "[1}",
        r#"{"a":1]"#,
        "[1,]",
        r#"{"a":1,}"#,
        "[,1]",
        "{,}",
        "[1 2]",
        r#"{"a" 1}"#,
        r#"{"a":}"#,
        r#"{"a"}"#,
        r#"{a:1}"#,
        r#"{1:1}"#,
        r#"{"a":1 "b":2}"#,
        "[1]]",
        "[[1]",
        "]",
        "}",
        ",",
        ":",
        "[:]",
        r#"{"a"::1}"#,
        "[1,,2]",
    ] {
        assert_not_sure(line.as_bytes());
        assert!(!serde_accepts(line.as_bytes()), "{line}");
    }
}

#[test]
fn literals_must_be_whole() {
    for line in [
        "tru",
        "truee",
        "True",
        "nul",
        "nulll",
        "fals",
        "falsy",
        "t",
        "n",
        "f",
        "[tru]",
        r#"{"a":nul}"#,
        "true1",
        "nullnull",
    ] {
        assert_not_sure(line.as_bytes());
        assert!(!serde_accepts(line.as_bytes()), "{line}");
    }
}

#[test]
fn empty_lines_and_trailing_characters_are_never_surely_valid() {
    for line in [
        "",
        " ",
        "\t\r",
        "1 1",
        "{} {}",
        "[]]",
        r#""a""b""#,
        "{}x",
        "null,",
        "1\u{0}",
        "\u{feff}1",
        "1\u{a0}",
        "\u{0b}1",
        "\u{0c}1",
    ] {
        assert_not_sure(line.as_bytes());
        assert!(!serde_accepts(line.as_bytes()), "{line:?}");
    }
}

#[test]
fn every_truncation_of_a_valid_line_agrees_with_serde_json() {
    for line in COMMON {
        let line = line.as_bytes();
        for end in 0..line.len() {
            assert_never_surer_than_serde(&line[..end]);
        }
    }
}

#[test]
fn every_one_byte_change_of_a_valid_line_agrees_with_serde_json() {
    for line in COMMON {
        let line = line.as_bytes();
        for at in 0..=line.len() {
            for byte in 0..=255u8 {
                let mut inserted = line.to_vec();
                inserted.insert(at, byte);
                assert_never_surer_than_serde(&inserted);
                if at < line.len() {
                    let mut replaced = line.to_vec();
                    replaced[at] = byte;
                    assert_never_surer_than_serde(&replaced);
                }
            }
            if at < line.len() {
                let mut removed = line.to_vec();
                removed.remove(at);
                assert_never_surer_than_serde(&removed);
            }
        }
    }
}

/// A generated JSON value's text, and whether it uses only what the check
/// answers for itself (no lone surrogate escape).
fn json_text() -> impl Strategy<Value = (String, bool)> {
    let ws = || "[ \t\r\n]{0,2}";
    let leaf = prop_oneof![
        Just(("null".to_owned(), true)),
        Just(("true".to_owned(), true)),
        Just(("false".to_owned(), true)),
        "-?(0|[1-9][0-9]{0,24})(\\.[0-9]{1,12})?([eE][+-]?[0-9]{1,4})?".prop_map(|n| (n, true)),
        string(),
    ];
    leaf.prop_recursive(10, 96, 6, move |inner| {
        prop_oneof![
            prop::collection::vec((ws(), inner.clone(), ws()), 0..6).prop_map(|items| {
                let plain = items.iter().all(|(_, (_, p), _)| *p);
                let body: Vec<String> = items
                    .into_iter()
                    .map(|(a, (v, _), b)| format!("{a}{v}{b}"))
                    .collect();
                (format!("[{}]", body.join(",")), plain)
            }),
            prop::collection::vec((ws(), string(), ws(), ws(), inner, ws()), 0..6).prop_map(
                |entries| {
                    let plain = entries
                        .iter()
                        .all(|(_, (_, pk), _, _, (_, pv), _)| *pk && *pv);
                    let body: Vec<String> = entries
                        .into_iter()
                        .map(|(a, (k, _), b, c, (v, _), d)| format!("{a}{k}{b}:{c}{v}{d}"))
                        .collect();
                    (format!("{{{}}}", body.join(",")), plain)
                }
            ),
        ]
    })
    .prop_flat_map(move |(value, plain)| {
        (ws(), ws()).prop_map(move |(a, b)| (format!("{a}{value}{b}"), plain))
    })
}

/// A string's text with its quotes: plain characters of every width,
/// every escape, hex escapes of any code unit (surrogates too, paired and
/// lone); and whether it holds no lone surrogate.
fn string() -> impl Strategy<Value = (String, bool)> {
    let piece = prop_oneof![
        4 => "[^\"\\\\\\x00-\\x1f]{1,8}",
        1 => prop::sample::select(vec!["\\\"", "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t"])
            .prop_map(str::to_owned),
        1 => any::<u16>().prop_map(|u| format!("\\u{u:04x}")),
        1 => any::<u16>().prop_map(|u| format!("\\u{u:04X}")),
        1 => (0xD800..0xDC00u16, 0xDC00..0xE000u16).prop_map(|(h, l)| format!("\\u{h:04x}\\u{l:04X}")),
    ];
    prop::collection::vec(piece, 0..6).prop_map(|pieces| {
        let body: String = pieces.concat();
        let plain = !holds_a_lone_surrogate(body.as_bytes());
        (format!("\"{body}\""), plain)
    })
}

/// Whether a string's body (its escapes well formed) escapes a surrogate
/// that is not one half of a high-then-low pair.
fn holds_a_lone_surrogate(body: &[u8]) -> bool {
    let unit = |at: usize| -> Option<u32> {
        let hex = body.get(at..at + 6)?;
        if !hex.starts_with(b"\\u") {
            return None;
        }
        u32::from_str_radix(std::str::from_utf8(&hex[2..]).ok()?, 16).ok()
    };
    let mut i = 0;
    while i < body.len() {
        if body[i] != b'\\' {
            i += 1;
            continue;
        }
        match unit(i) {
            Some(0xD800..=0xDBFF) => {
                if !matches!(unit(i + 6), Some(0xDC00..=0xDFFF)) {
                    return true;
                }
                i += 12;
            }
            Some(0xDC00..=0xDFFF) => return true,
            Some(_) => i += 6,
            None => i += 2,
        }
    }
    false
}

/// One change to a line: where, and what.
#[derive(Clone, Debug)]
enum Mutation {
    Truncate(usize),
    Remove(usize),
    Insert(usize, u8),
    Replace(usize, u8),
}

/// Bytes that matter to JSON's grammar more often than chance would pick
/// them.
fn interesting_byte() -> impl Strategy<Value = u8> {
    prop_oneof![
        2 => prop::sample::select(b"\"\\/{}[]:,-+.eE0123456789 \t\r\nbfnrtu".to_vec()),
        1 => 0..0x20u8,
        1 => any::<u8>(),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<usize>().prop_map(Mutation::Truncate),
        any::<usize>().prop_map(Mutation::Remove),
        (any::<usize>(), interesting_byte()).prop_map(|(at, b)| Mutation::Insert(at, b)),
        (any::<usize>(), interesting_byte()).prop_map(|(at, b)| Mutation::Replace(at, b)),
    ]
}

fn mutate(mut line: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        let len = line.len();
        match *m {
            Mutation::Truncate(at) => line.truncate(at % (len + 1)),
            Mutation::Remove(at) if len > 0 => {
                line.remove(at % len);
            }
            Mutation::Remove(_) => {}
            Mutation::Insert(at, b) => line.insert(at % (len + 1), b),
            Mutation::Replace(at, b) if len > 0 => line[at % len] = b,
            Mutation::Replace(..) => {}
        }
    }
    line
}

proptest! {
    /// Generated JSON is "surely one value" unless it holds a lone
    /// surrogate escape, and serde_json agrees that it is.
    #[test]
    fn prop_generated_json_is_surely_one_value((text, plain) in json_text()) {
        prop_assert!(serde_accepts(text.as_bytes()), "{text:?}");
        prop_assert_eq!(surely_one_value(text.as_bytes()), plain, "{:?}", text);
    }

    /// However a valid line is broken, the check never passes what
    /// serde_json refuses.
    #[test]
    fn prop_the_check_never_passes_a_line_serde_json_refuses(
        (text, _) in json_text(),
        mutations in prop::collection::vec(mutation(), 1..4),
    ) {
        let line = mutate(text.into_bytes(), &mutations);
        if surely_one_value(&line) {
            prop_assert!(serde_accepts(&line), "{:?}", String::from_utf8_lossy(&line));
        }
    }
}
