//! The fuzz targets' checks (`fuzz/src/lib.rs`) without libFuzzer, in
//! every test run: on each target's seeds (`fuzz/seeds/<target>/`,
//! committed), on the crashes a local fuzzing run left in
//! `fuzz/artifacts/<target>/crash-*` (not committed: once fixed, an input
//! is kept as a seed), and on mutations of the seeds drawn from a fixed
//! seed (ASCII bytes flipped and inserted, bytes removed, runs spliced
//! from another seed: text, as the targets read it), the same inputs on
//! every run. The coverage-guided search itself is `cargo xtask fuzz`'s.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use rand::rngs::SmallRng;
use rand::{RngExt as _, SeedableRng};

#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    dead_code,
    unreachable_pub
)]
#[path = "../../../fuzz/src/lib.rs"]
mod checks;

/// Mutations per target and test run.
const MUTATIONS: usize = 2_000;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// The files in `fuzz/<kind>/<target>/` whose names start with
/// `prefix`, sorted (none when the folder is missing: a target may have
/// no saved crash).
fn inputs(kind: &str, target: &str, prefix: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = fuzz_dir().join(kind).join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("a readable folder entry").path())
        .filter(|p| p.is_file())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, bytes)
        })
        .collect()
}

/// One mutation of `input`, splicing from `other`.
fn mutate(rng: &mut SmallRng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..rng.random_range(1..=4) {
        let at = rng.random_range(0..=out.len());
        match rng.random_range(0..5) {
            // Within ASCII, so the text stays text.
            0 if at < out.len() && out[at].is_ascii() => out[at] ^= 1 << rng.random_range(0..7),
            1 => out.insert(at, rng.random_range(0x20..0x7f)),
            2 if at < out.len() => {
                out.remove(at);
            }
            3 if !other.is_empty() => {
                let from = rng.random_range(0..other.len());
                let to = rng.random_range(from..=other.len().min(from + 32));
                out.splice(at..at, other[from..to].iter().copied());
            }
            // A byte the grammars care about.
            _ => out.insert(
                at,
                *b"{}[]\":,.=\\ '\n0-+e$"
                    .get(rng.random_range(0..19))
                    .unwrap_or(&b'x'),
            ),
        }
    }
    out
}

/// How a target reads its input.
#[derive(PartialEq)]
enum Reads {
    /// UTF-8 text only (anything else is returned from at once).
    Text,
    /// Any bytes.
    Bytes,
}

/// Run `check` on every seed, saved crash and mutation of `target`,
/// reporting every input that fails rather than the first.
fn replay(target: &str, reads: Reads, check: fn(&[u8])) {
    let seeds = inputs("seeds", target, "");
    assert!(
        !seeds.is_empty(),
        "no seeds for {target} in fuzz/seeds/{target}/"
    );
    let mut cases: Vec<(String, Vec<u8>)> = seeds
        .iter()
        // Only crashes: a slow input or one that ran out of memory would
        // hold the test step up.
        .chain(inputs("artifacts", target, "crash-").iter())
        .map(|(p, b)| (p.display().to_string(), b.clone()))
        .collect();
    let mut rng = SmallRng::seed_from_u64(0x00f0_22ed);
    for i in 0..MUTATIONS {
        let input = &seeds[rng.random_range(0..seeds.len())].1;
        let other = &seeds[rng.random_range(0..seeds.len())].1;
        cases.push((format!("mutation {i}"), mutate(&mut rng, input, other)));
    }
    let text = cases
        .iter()
        .filter(|(_, b)| std::str::from_utf8(b).is_ok())
        .count();
    // A check that reads text only checks text: most inputs must be.
    assert!(
        reads == Reads::Bytes || text * 10 >= cases.len() * 9,
        "only {text} of {} inputs of {target} are UTF-8",
        cases.len()
    );
    let failed: Vec<String> = cases
        .iter()
        .filter(|(_, bytes)| catch_unwind(AssertUnwindSafe(|| check(bytes))).is_err())
        .map(|(name, bytes)| format!("{name}: {:?}", String::from_utf8_lossy(bytes)))
        .collect();
    assert!(
        failed.is_empty(),
        "{target} failed on {} of {} inputs:\n{}",
        failed.len(),
        cases.len(),
        failed.join("\n")
    );
}

#[test]
fn the_json_checking_pass_holds_on_the_fuzz_seeds_and_their_mutations() {
    replay("json_check", Reads::Text, checks::json_check);
}

#[test]
fn the_ndjson_line_check_holds_on_the_fuzz_seeds_and_their_mutations() {
    replay("ndjson_line", Reads::Bytes, checks::ndjson_line);
}

#[test]
fn the_fast_paths_agree_with_the_general_ones_on_the_fuzz_seeds_and_their_mutations() {
    replay("fast_paths", Reads::Bytes, checks::fast_paths);
}

#[test]
fn the_configuration_loader_never_panics_on_the_fuzz_seeds_and_their_mutations() {
    replay("toml_config", Reads::Text, checks::toml_config);
}

#[test]
fn the_connection_string_parser_holds_on_the_fuzz_seeds_and_their_mutations() {
    replay("conninfo", Reads::Text, checks::conninfo);
}
