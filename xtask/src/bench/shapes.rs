//! The nested transform rows' records in several shapes, so that their
//! budgets hold on records the engine was not tuned to, and the check
//! that the pipeline's output holds the same records as the Python
//! script's.
//!
//! Every record is an order with `order.status`, `order.items` (objects
//! with a numeric `qty` and `price`) and a `customer` object, as both
//! jobs read them; around that, each shape stresses something else:
//! escaped and non-ASCII strings, nulls, nested objects holding arrays,
//! arrays of scalars, long strings, wide objects, deeper nesting, and
//! whitespace with the fields in another order. The shapes interleave
//! (a record's shape comes from a hash of its id), so every batch holds
//! all of them.

use std::collections::hash_map::DefaultHasher;
use std::fmt::Write as _;
use std::hash::{Hash, Hasher};
use std::io::BufRead as _;
use std::path::Path;

use super::records;
use crate::Result;

/// The shapes, in the order of their number.
pub(super) const SHAPES: [&str; 8] = [
    "escaped and non-ASCII strings",
    "nulls",
    "nested objects holding arrays",
    "arrays of scalars",
    "long strings",
    "wide objects",
    "deeper nesting",
    "whitespace, fields reordered",
];

/// splitmix64, as the harnesses' records use it.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The shape of record `id` (an index into [`SHAPES`]).
pub(super) fn shape_of(id: u64) -> usize {
    (mix(id ^ 0x5348_4150_4553) % SHAPES.len() as u64) as usize
}

/// Append nested record `id` in its shape as one NDJSON line without its
/// newline; whether its `order.status` is `"paid"` (about 60% are).
pub(super) fn record(id: u64, out: &mut String) -> bool {
    let shape = shape_of(id);
    if shape == 0 {
        // The harnesses' own nested order: `\"`, `\u2019`, `\/` and
        // `\n` escapes, non-ASCII names.
        return records::nested_record(id, out);
    }
    const STATUS: [&str; 5] = ["paid", "paid", "paid", "pending", "refunded"];
    let h = mix(id);
    let status = STATUS[(h % 5) as usize];
    let items = 1 + (h >> 8) % 5;
    let mut order = format!(r#"{{"status":"{status}","currency":"EUR","items":["#);
    for i in 0..items {
        if i > 0 {
            order.push(',');
        }
        item(shape, mix(h ^ i), &mut order);
    }
    order.push(']');
    match shape {
        1 => order.push_str(r#","coupon":null,"shipped_at":null"#),
        2 => order.push_str(
            r#","shipping":{"carrier":"Poste","legs":[{"from":"Zürich","to":"Genève","days":[1,2]},{"from":"Genève","to":"Lyon","days":[3]}]}"#,
        ),
        _ => {}
    }
    order.push('}');
    let customer = customer(shape, h);
    let extra = extra(shape, h);
    if shape == 7 {
        let _ = write!(
            out,
            r#"{{ "customer" : {customer}, "tags" : [ "new", "vip" ], "order" : {order} , "id" : {id} }}"#
        );
    } else {
        let _ = write!(
            out,
            r#"{{"id":{id},"ts":"2026-11-{:02}T{:02}:00:00Z","order":{order},"customer":{customer}{extra}}}"#,
            1 + (h >> 12) % 28,
            (h >> 16) % 24,
        );
    }
    status == "paid"
}

/// One item of `order.items` in `shape`, from hash `g`.
fn item(shape: usize, g: u64, out: &mut String) {
    let (qty, price) = (
        1 + (g >> 20) % 5,
        format!("{}.{:02}", (g >> 30) % 200, (g >> 40) % 100),
    );
    match shape {
        1 => {
            let _ = write!(
                out,
                r#"{{"sku":null,"qty":{qty},"price":{price},"discount":null,"gift":{}}}"#,
                if g.is_multiple_of(2) { "null" } else { "false" }
            );
        }
        2 => {
            let _ = write!(
                out,
                r#"{{"sku":"SKU-{:05}","qty":{qty},"price":{price},"options":{{"colors":["red","blue"],"sizes":[38,39,40]}}}}"#,
                g % 100_000
            );
        }
        3 => {
            let _ = write!(
                out,
                r#"{{"sku":"SKU-{:05}","qty":{qty},"price":{price},"dims":[{},{},{}],"weights":[0.5,1.25,-3e2,7E-1]}}"#,
                g % 100_000,
                g % 90,
                (g >> 8) % 90,
                (g >> 16) % 90
            );
        }
        4 => {
            let _ = write!(
                out,
                r#"{{"sku":"SKU-{:05}","qty":{qty},"price":{price},"description":"{}"}}"#,
                g % 100_000,
                long_text(g, 60 + (g >> 50) as usize % 120)
            );
        }
        5 => {
            let _ = write!(
                out,
                r#"{{"sku":"SKU-{:05}","qty":{qty},"price":{price},"a":1,"b":"x","c":true,"d":null,"e":2.5,"f":"y","g":[],"h":{{}}}}"#,
                g % 100_000
            );
        }
        6 => {
            let _ = write!(
                out,
                r#"{{"sku":"SKU-{:05}","qty":{qty},"price":{price},"meta":{{"a":{{"b":{{"c":{{"d":[{{"e":{{"f":{}}}}}]}}}}}}}}}}"#,
                g % 100_000,
                g % 1000
            );
        }
        7 => {
            let _ = write!(
                out,
                r#"{{ "price" : {price} , "qty" : {qty} , "sku" : "SKU-{:05}" }}"#,
                g % 100_000
            );
        }
        _ => {
            let _ = write!(
                out,
                r#"{{"sku":"SKU-{:05}","qty":{qty},"price":{price}}}"#,
                g % 100_000
            );
        }
    }
}

/// The `customer` object in `shape`, from hash `h`; most have an `email`
/// (the one both jobs drop), some do not.
fn customer(shape: usize, h: u64) -> String {
    let email = |h: u64| format!("c{}@example.com", h % 100_000);
    let mut c = String::new();
    match shape {
        1 => {
            let email = if h.is_multiple_of(3) {
                "null".to_owned()
            } else {
                format!(r#""{}""#, email(h))
            };
            let _ = write!(
                c,
                r#"{{"name":null,"email":{email},"tier":null,"address":null}}"#
            );
        }
        2 => {
            let _ = write!(
                c,
                r#"{{"name":"Bo Ek","email":"{}","address":{{"lines":["12 rue de la Paix","Bâtiment B"],"geo":{{"lat":47.37,"lon":8.54,"trail":[[47.1,8.2],[47.3,8.5]]}}}},"phones":["+41 44 000 00 00"]}}"#,
                email(h)
            );
        }
        5 => {
            c.push('{');
            for k in 0..16u64 {
                let _ = write!(c, r#""f{k:02}":"#);
                match (h >> k) % 4 {
                    0 => {
                        let _ = write!(c, "{}", (h >> k) % 1000);
                    }
                    1 => c.push_str(r#""valeur moyenne""#),
                    2 => c.push_str("true"),
                    _ => c.push_str("null"),
                }
                c.push(',');
                if k == 11 {
                    let _ = write!(c, r#""email":"{}","#, email(h));
                }
            }
            c.push_str(r#""tier":1}"#);
        }
        6 => {
            let _ = write!(
                c,
                r#"{{"name":"Ana","email":"{}","prefs":{{"mail":{{"news":{{"weekly":{{"on":true,"topics":[{{"id":1,"tags":["a",["b",["c"]]]}}]}}}}}}}}}}"#,
                email(h)
            );
        }
        7 => {
            if h.is_multiple_of(4) {
                c.push_str(r#"{ "tier" : 2 , "name" : "Zoë" }"#);
            } else {
                let _ = write!(
                    c,
                    r#"{{ "email" : "{}" , "tier" : 2 , "name" : "Zoë" }}"#,
                    email(h)
                );
            }
        }
        _ => {
            let _ = write!(
                c,
                r#"{{"name":"Renée","email":"{}","tier":{}}}"#,
                email(h),
                (h >> 36) % 3
            );
        }
    }
    c
}

/// The top-level fields after `customer` in `shape`, each with its
/// leading comma.
fn extra(shape: usize, h: u64) -> String {
    match shape {
        1 => r#","note":null,"tags":null,"refund":null"#.to_owned(),
        3 => format!(
            r#","scores":[{},-{},0,1.5,2e3,-0.25,{}],"flags":[true,false,null,true],"tags":["a","b","c","d","e","f"]"#,
            h % 1000,
            (h >> 10) % 1000,
            (h >> 20) % 100_000
        ),
        4 => format!(
            r#","note":"{}","tags":["long"]"#,
            long_text(h, 300 + (h >> 40) as usize % 900)
        ),
        5 => {
            let mut s = r#","attrs":{"#.to_owned();
            for k in 0..32u64 {
                if k > 0 {
                    s.push(',');
                }
                let _ = write!(s, r#""attr_{k:02}":{}"#, (h >> (k % 60)) % 10_000);
            }
            s.push('}');
            s
        }
        6 => format!(
            r#","trace":[[[[[[{{"x":{{"y":[{}]}}}}]]]]]],"tags":[]"#,
            h % 97
        ),
        _ => r#","tags":["new","vip"]"#.to_owned(),
    }
}

/// About `len` bytes of prose from hash `h`: non-ASCII words, and now and
/// then an escaped quote, backslash, tab or newline.
fn long_text(h: u64, len: usize) -> String {
    const WORDS: [&str; 12] = [
        "livraison",
        "prévue",
        "à",
        "l'entrée",
        "côté",
        "cour",
        "山田",
        "Straße",
        r#"\"fragile\""#,
        r"C:\\depot",
        r"\tcolis",
        r"\nétage 2",
    ];
    let mut s = String::with_capacity(len + 16);
    let mut g = h;
    while s.len() < len {
        g = mix(g);
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(WORDS[(g % WORDS.len() as u64) as usize]);
    }
    s
}

/// Whether the lines of `a` and `b` are the same JSON values, in any
/// order: each line is read and written canonically (keys sorted, numbers
/// as `f64`, `-0` as `0`), hashed, and the sorted hashes compared. Byte-for-byte
/// equality cannot hold: the pipeline keeps each field's text as it came
/// (escapes, number text, spacing) where orjson writes its own.
pub(super) fn same_records(a: &Path, b: &Path) -> Result<()> {
    let hashes = |path: &Path| -> Result<Vec<u64>> {
        let file = std::fs::File::open(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let mut out = Vec::new();
        let mut canonical = String::new();
        // Line by line: the outputs are hundreds of megabytes.
        for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
            let line = line.map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            let value: serde_json::Value = serde_json::from_str(&line)
                .map_err(|e| format!("{} line {}: not JSON: {e}", path.display(), n + 1))?;
            canonical.clear();
            write_canonical(&value, &mut canonical);
            let mut hasher = DefaultHasher::new();
            canonical.hash(&mut hasher);
            out.push(hasher.finish());
        }
        out.sort_unstable();
        Ok(out)
    };
    let (x, y) = (hashes(a)?, hashes(b)?);
    if x.len() != y.len() {
        return Err(format!(
            "{} holds {} records, {} holds {}",
            a.display(),
            x.len(),
            b.display(),
            y.len()
        ));
    }
    if x != y {
        // Both sorted: walk them side by side, counting the records of
        // `a` with no equal one left in `b`.
        let (mut i, mut j, mut differ) = (0, 0, 0);
        while i < x.len() {
            match y.get(j).map(|h| x[i].cmp(h)) {
                Some(std::cmp::Ordering::Equal) => (i, j) = (i + 1, j + 1),
                Some(std::cmp::Ordering::Greater) => j += 1,
                Some(std::cmp::Ordering::Less) | None => (i, differ) = (i + 1, differ + 1),
            }
        }
        return Err(format!(
            "{} and {} hold different records ({differ} of {})",
            a.display(),
            b.display(),
            x.len()
        ));
    }
    Ok(())
}

/// `value` written with its object keys sorted and every number as an
/// `f64` (zero without its sign).
fn write_canonical(value: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => {
            let _ = write!(out, "{b}");
        }
        Value::Number(n) => {
            // `-0` is zero: Python reads it as the integer 0.
            let f = n.as_f64().unwrap_or(f64::NAN);
            let _ = write!(out, "{:?}", if f == 0.0 { 0.0 } else { f });
        }
        Value::String(s) => {
            let _ = write!(out, "{s:?}");
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|p, q| p.0.cmp(q.0));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let _ = write!(out, "{k:?}:");
                write_canonical(v, out);
            }
            out.push('}');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shape_is_a_json_order_both_jobs_can_read() {
        let mut seen = [0u32; SHAPES.len()];
        for id in 0..2_000 {
            let mut line = String::new();
            let paid = record(id, &mut line);
            seen[shape_of(id)] += 1;
            let value: serde_json::Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("record {id} is not JSON ({e}): {line}"));
            assert_eq!(value["order"]["status"] == "paid", paid, "{line}");
            assert!(value["customer"].is_object(), "{line}");
            let items = value["order"]["items"].as_array().expect("items");
            assert!(!items.is_empty(), "{line}");
            for item in items {
                assert!(item["qty"].is_u64() && item["price"].is_f64(), "{line}");
            }
        }
        assert!(seen.iter().all(|&n| n > 150), "{seen:?}");
    }

    /// [`same_records`] of two files holding `a` and `b`, in a folder of
    /// their own named after `test`.
    fn compare(test: &str, a: &str, b: &str) -> Result<()> {
        let dir = std::env::temp_dir().join(format!("xtask-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (pa, pb) = (dir.join("a"), dir.join("b"));
        std::fs::write(&pa, a).unwrap();
        std::fs::write(&pb, b).unwrap();
        let result = same_records(&pa, &pb);
        std::fs::remove_dir_all(&dir).unwrap();
        result
    }

    #[test]
    fn the_same_records_in_another_order_and_spelling_are_the_same() {
        let a = "{\"x\":1.50,\"s\":\"\\u00e9\\/\"}\n{\"y\":[1]}\n";
        let b = "{\"y\":[1]}\n{\"s\":\"é/\", \"x\":1.5}\n";
        let c = "{\"y\":[1]}\n{\"s\":\"é/\",\"x\":1.25}\n";
        assert_eq!(compare("spelling", a, b), Ok(()));
        assert!(compare("spelling", a, c).is_err());
    }

    /// The pipeline keeps `-0` as it came; Python reads it as the integer
    /// zero and orjson writes `0`.
    #[test]
    fn zero_with_a_minus_sign_is_the_same_record_as_zero() {
        let same = compare("zero", "{\"s\":[-0,-0.0,1]}\n", "{\"s\":[0,0.0,1]}\n");
        assert_eq!(same, Ok(()));
    }

    /// A record that differs is counted once, not with every record
    /// sorted after it.
    #[test]
    fn records_that_differ_are_counted_as_they_are() {
        let lines = |first: u32| {
            (first..first + 50)
                .map(|i| format!("{{\"i\":{i}}}\n"))
                .collect::<String>()
        };
        let err = compare("count", &lines(0), &lines(1)).unwrap_err();
        assert!(err.contains("(1 of 50)"), "{err}");
    }
}
