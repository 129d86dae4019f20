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
