//! The bench input shared by the harnesses: NDJSON order records of about
//! 100 bytes (`id`, `user`, `amount`, `timestamp`, `tags`), the same for
//! a given id in every run.

use std::fmt::Write as _;

/// splitmix64: deterministic input without a dependency.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Append record `id` as one NDJSON line without its newline; whether its
/// `amount` is at least 100 (about 90% are: the lines the bench filter
/// keeps).
#[allow(dead_code)]
pub(crate) fn record(id: u64, out: &mut String) -> bool {
    const TAGS: [&str; 6] = ["red", "green", "blue", "new", "sale", "vip"];
    let h = mix(id);
    let cents = (h >> 10) % 100_000;
    let _ = write!(
        out,
        r#"{{"id":{id},"user":"user-{:04}","amount":{}.{:02},"timestamp":{},"tags":["{}","{}"]}}"#,
        h % 10_000,
        cents / 100,
        cents % 100,
        1_700_000_000_000u64 + id * 7,
        TAGS[((h >> 30) % 6) as usize],
        TAGS[((h >> 40) % 6) as usize],
    );
    cents >= 10_000
}

/// The amount of record `id` (as [`record`] writes it), in cents.
#[allow(dead_code)]
pub(crate) fn amount_cents(id: u64) -> u64 {
    (mix(id) >> 10) % 100_000
}

/// Append nested order `id` as one NDJSON line of about 400 bytes without
/// its newline: an object with nested objects, an array of 3 item
/// objects, non-ASCII text and escaped strings. Returns whether its
/// `order.status` is `"paid"` (about 60% are).
#[allow(dead_code)]
pub(crate) fn nested_record(id: u64, out: &mut String) -> bool {
    const STATUS: [&str; 5] = ["paid", "paid", "paid", "pending", "refunded"];
    const NAMES: [&str; 4] = [
        "Zoë \\\"Z\\\" Adler",
        "山田 太郎",
        "Bo Ek",
        "Renée O\\u2019Brien",
    ];
    const NOTES: [&str; 3] = [
        "première\\ncommande",
        "livrer à l'accueil",
        "\\u00e9t\\u00e9 \\/ winter",
    ];
    let h = mix(id);
    let status = STATUS[(h % 5) as usize];
    let _ = write!(
        out,
        r#"{{"id":{id},"ts":"2026-11-{:02}T{:02}:{:02}:00Z","order":{{"status":"{status}","currency":"EUR","items":["#,
        1 + (h >> 8) % 28,
        (h >> 16) % 24,
        (h >> 24) % 60,
    );
    for i in 0..3u64 {
        let g = mix(h ^ i);
        if i > 0 {
            out.push(',');
        }
        let _ = write!(
            out,
            r#"{{"sku":"SKU-{:05}","qty":{},"price":{}.{:02}}}"#,
            g % 100_000,
            1 + (g >> 20) % 5,
            (g >> 30) % 200,
            (g >> 40) % 100,
        );
    }
    let _ = write!(
        out,
        r#"]}},"customer":{{"name":"{}","email":"c{}@example.com","tier":{},"address":{{"city":"Zürich","zip":"80{:02}"}}}},"note":"{}","tags":["new","vip"]}}"#,
        NAMES[((h >> 32) % 4) as usize],
        h % 100_000,
        (h >> 36) % 3,
        (h >> 44) % 100,
        NOTES[((h >> 48) % 3) as usize],
    );
    status == "paid"
}
