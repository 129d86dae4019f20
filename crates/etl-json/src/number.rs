//! A number's text read without serde_json's parser, for comparing a
//! field against a `filter`'s constant.
//!
//! [`read`] gives the number serde_json reads from the same text (of the
//! same kind: an integer or a float), or `None` for text it is not sure
//! of: anything but a JSON number, an integer of more than 18 digits, a
//! decimal of more than 15 significant digits, or a power of ten beyond
//! 10^22 either way. Inside those bounds the value is exact: an integer
//! fits `i64`, and a decimal's digits fit an `f64` exactly (below 2^53)
//! and are scaled by one exact power of ten in one correctly rounded
//! multiplication or division, which is what serde_json computes for
//! such text (its fast path, and the correctly rounded value its
//! `float_roundtrip` reading gives).
//!
//! The constant a number is compared with is read once, as a
//! [`Constant`], when the filter is made; a number read once from a
//! record can be compared with several constants.
//!
//! Invariant: `read(text)` is `None` or serde_json's own number for
//! `text`, and [`Read::passes`] judges it against a constant as
//! [`compare`](crate::ops::compare) judges serde_json's values.

use crate::ops::CompareOp;

/// The most digits of an integer read here: any 18 digits fit `i64`.
const MAX_INTEGER_DIGITS: usize = 18;

/// The most significant digits of a decimal read here: any 15 digits are
/// below 2^53, so exact as an `f64`.
const MAX_DECIMAL_DIGITS: usize = 15;

/// 10^0 to 10^22, each exact as an `f64`.
const POWERS_OF_TEN: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// A number as serde_json holds it once read: an integer (`i64`) or a
/// float.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Read {
    Int(i64),
    Float(f64),
}

impl Read {
    /// serde_json's own number of the same kind and value.
    #[cfg(test)]
    fn number(self) -> Option<serde_json::Number> {
        match self {
            Read::Int(i) => Some(serde_json::Number::from(i)),
            Read::Float(f) => serde_json::Number::from_f64(f),
        }
    }

    /// Whether this number passes `op` against `constant`, as
    /// [`compare`](crate::ops::compare) judges the same number against
    /// the constant's value.
    pub(crate) fn passes(self, op: CompareOp, constant: &Constant) -> bool {
        if op == CompareOp::Exists {
            return true;
        }
        let ordering = constant.float.and_then(|c| match (self, constant.int) {
            (Read::Int(a), Some(b)) => Some(a.cmp(&b)),
            #[allow(clippy::cast_precision_loss)]
            (Read::Int(a), None) => (a as f64).partial_cmp(&c),
            (Read::Float(a), _) => a.partial_cmp(&c),
        });
        crate::ops::decide(op, ordering)
    }
}

/// A filter's constant as [`compare`](crate::ops::compare) reads it
/// against a number, read once rather than per record.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Constant {
    /// The constant as an `i64`, when it is an integer that fits.
    int: Option<i64>,
    /// The constant as an `f64`; `None` when it is not a number (then no
    /// number is ordered against it).
    float: Option<f64>,
}

impl Constant {
    /// `value` read for comparing numbers with it.
    pub(crate) fn of(value: &serde_json::Value) -> Self {
        match value {
            serde_json::Value::Number(n) => Constant {
                int: n.as_i64(),
                float: n.as_f64(),
            },
            _ => Constant {
                int: None,
                float: None,
            },
        }
    }
}

/// The number serde_json reads from `text` (a value's whole text, no
/// surrounding whitespace), or `None` when `text` is not a number read
/// here (see the module's documentation).
pub(crate) fn read(text: &str) -> Option<Read> {
    let b = text.as_bytes();
    let (negative, digits) = match b.split_first()? {
        (b'-', rest) => (true, rest),
        _ => (false, b),
    };
    // The integer part: `0` or digits without a leading zero, read in one
    // pass (at most 18 digits: any fit an `i64`, and a decimal with more
    // has more than 15 significant ones).
    let mut significand = 0u64;
    let mut int_len = 0usize;
    while let Some(d) = digits.get(int_len).map(|c| c.wrapping_sub(b'0')) {
        if d > 9 {
            break;
        }
        int_len += 1;
        if int_len > MAX_INTEGER_DIGITS {
            return None;
        }
        significand = significand * 10 + u64::from(d);
    }
    if int_len == 0 || (int_len > 1 && digits.first() == Some(&b'0')) {
        return None;
    }
    let rest = digits.get(int_len..)?;
    if rest.is_empty() {
        let magnitude = i64::try_from(significand).ok()?;
        // serde_json reads `-0` as the float -0.0.
        return Some(match (negative, magnitude) {
            (true, 0) => Read::Float(-0.0),
            (true, m) => Read::Int(-m),
            (false, m) => Read::Int(m),
        });
    }
    // The significant digits so far: the integer part's, unless it is `0`.
    let mut significant = if significand == 0 { 0 } else { int_len };
    if significant > MAX_DECIMAL_DIGITS {
        return None;
    }
    // The fraction: each digit moves the exponent one down.
    let mut frac_len = 0usize;
    let rest = match rest.split_first() {
        Some((b'.', after)) => {
            while let Some(d) = after.get(frac_len).map(|c| c.wrapping_sub(b'0')) {
                if d > 9 {
                    break;
                }
                frac_len += 1;
                if significant > 0 || d != 0 {
                    significant += 1;
                    if significant > MAX_DECIMAL_DIGITS {
                        return None;
                    }
                }
                significand = significand * 10 + u64::from(d);
            }
            if frac_len == 0 {
                return None;
            }
            after.get(frac_len..)?
        }
        _ => rest,
    };
    let exponent = match rest.split_first() {
        None => 0,
        Some((b'e' | b'E', after)) => {
            let (negative, after) = match after.split_first() {
                Some((b'-', a)) => (true, a),
                Some((b'+', a)) => (false, a),
                _ => (false, after),
            };
            if after.is_empty() || !after.iter().all(u8::is_ascii_digit) {
                return None;
            }
            // At most two digits (leading zeros aside): beyond 10^22
            // either way is left to serde_json.
            let after = &after[after.iter().take_while(|c| **c == b'0').count()..];
            if after.len() > 2 {
                return None;
            }
            let e = after.iter().fold(0i32, |e, d| e * 10 + i32::from(d - b'0'));
            if negative { -e } else { e }
        }
        Some(_) => return None,
    };
    let exponent = exponent - i32::try_from(frac_len).ok()?;
    let power = POWERS_OF_TEN.get(usize::try_from(exponent.unsigned_abs()).ok()?)?;
    // Below 2^53: exact.
    #[allow(clippy::cast_precision_loss)]
    let mut f = significand as f64;
    if exponent >= 0 {
        f *= power;
    } else {
        f /= power;
    }
    Some(Read::Float(if negative { -f } else { f }))
}

/// Whether a field whose value's text is `text` passes `op` against
/// `constant`, as [`compare`](crate::ops::compare) judges the value
/// serde_json reads from it; `None` when `text` is not a number
/// [`read`] reads (then parse it).
pub(crate) fn compare(text: &str, op: CompareOp, constant: &Constant) -> Option<bool> {
    Some(read(text)?.passes(op, constant))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{Number, Value};

    use super::*;

    /// The same number: the same kind (integer or float), the same value,
    /// bit for bit.
    fn same(a: &Number, b: &Number) -> bool {
        a.as_i64() == b.as_i64()
            && a.as_u64() == b.as_u64()
            && a.is_f64() == b.is_f64()
            && a.as_f64().map(f64::to_bits) == b.as_f64().map(f64::to_bits)
    }

    fn check(text: &str) {
        let serde = serde_json::from_str::<Value>(text).ok();
        if let Some(ours) = read(text).map(|r| r.number().unwrap()) {
            let Some(Value::Number(theirs)) = &serde else {
                panic!("{text:?}: read {ours:?}, serde_json reads {serde:?}");
            };
            assert!(
                same(&ours, theirs),
                "{text:?}: read {ours:?}, serde_json {theirs:?}"
            );
        }
    }

    #[test]
    fn reads_numbers_as_serde_json_does_and_leaves_what_it_is_not_sure_of() {
        for text in [
            "0",
            "-0",
            "7",
            "-7",
            "931.71",
            "0.5",
            "-0.0",
            "100.00",
            "1e5",
            "1E+5",
            "1e-5",
            "2.5e0",
            "0.000001",
            "123456789012345",
            "999999999999999999",
            "-999999999999999999",
            "1.5e22",
            "1e-22",
            "0e0",
            "0.0e-0",
            "9007199254740993",
            "1e0001",
        ] {
            check(text);
            assert!(read(text).is_some(), "{text:?} is read");
        }
        for text in [
            "",
            "-",
            "01",
            "-01",
            "1.",
            ".5",
            "1e",
            "1e+",
            "+1",
            "1.5.2",
            "1x",
            "\"1\"",
            "true",
            "null",
            "1e400",
            "1e23",
            "1e-23",
            "1234567890123456789",
            "0.1234567890123456",
            " 1",
            "1 ",
            "--1",
            "1e+-1",
            "0x10",
            "NaN",
            "Infinity",
            "1e+",
            "1e-",
        ] {
            check(text);
            assert!(read(text).is_none(), "{text:?} is left to serde_json");
        }
    }

    /// Number texts of every shape: integers of any length, decimals with
    /// leading and trailing zeros, exponents of either sign and case.
    fn number_text() -> impl Strategy<Value = String> {
        (
            any::<bool>(),
            "(0|[1-9][0-9]{0,20})",
            prop::option::of("[0-9]{1,20}"),
            prop::option::of(("[eE]", "[+-]?", "[0-9]{1,4}")),
        )
            .prop_map(|(negative, int, frac, exp)| {
                let mut text = String::new();
                if negative {
                    text.push('-');
                }
                text.push_str(&int);
                if let Some(frac) = frac {
                    text.push('.');
                    text.push_str(&frac);
                }
                if let Some((e, sign, digits)) = exp {
                    text.push_str(&e);
                    text.push_str(&sign);
                    text.push_str(&digits);
                }
                text
            })
    }

    fn constant() -> impl Strategy<Value = Value> {
        prop_oneof![
            any::<i64>().prop_map(Value::from),
            (-1_000_000i64..1_000_000).prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1e6f64..1e6).prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            number_text().prop_filter_map("a number serde_json reads", |t| {
                serde_json::from_str::<Value>(&t).ok()
            }),
            Just(Value::from(-0.0)),
            Just(Value::Null),
            Just(Value::from("1")),
        ]
    }

    fn op() -> impl Strategy<Value = CompareOp> {
        prop_oneof![
            Just(CompareOp::Eq),
            Just(CompareOp::Ne),
            Just(CompareOp::Lt),
            Just(CompareOp::Le),
            Just(CompareOp::Gt),
            Just(CompareOp::Ge),
            Just(CompareOp::Exists),
        ]
    }

    proptest! {
        /// What is read is serde_json's number; what is compared is
        /// judged as the tree path judges serde_json's value.
        #[test]
        fn prop_a_number_read_compares_as_serde_json_reads_it(
            text in number_text(),
            constant in constant(),
            op in op(),
        ) {
            check(&text);
            if let Some(held) = compare(&text, op, &Constant::of(&constant)) {
                let value: Value = serde_json::from_str(&text).unwrap();
                prop_assert_eq!(held, crate::ops::compare(Some(&value), op, &constant), "{}", text);
            }
        }

        /// Anything else is never read: any text is left to serde_json
        /// unless it reads the same number.
        #[test]
        fn prop_any_text_is_read_as_serde_json_or_not_at_all(text in "[-+0-9.eE x]{0,12}") {
            check(&text);
        }

        /// A field equal to the constant as a decimal compares equal:
        /// the exact cases of a numeric compare.
        #[test]
        fn prop_equal_decimals_compare_equal(cents in -10_000_000i64..10_000_000) {
            let text = format!("{}{}.{:02}", if cents < 0 { "-" } else { "" }, cents.abs() / 100, cents.abs() % 100);
            let constant = Value::from(cents / 100);
            let equal = cents % 100 == 0;
            prop_assert_eq!(compare(&text, CompareOp::Eq, &Constant::of(&constant)), Some(equal), "{}", text);
        }
    }
}
