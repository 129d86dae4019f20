//! `cargo xtask tidy`: invariants of the repository that the compiler does
//! not check.
//!
//! * Layer order: a crate depends only on the crates below it (read from
//!   `cargo metadata`). `etl-record <- etl-ack <- etl-checkpoint <-
//!   etl-source`; `etl-sink` sees only `etl-record` and `etl-ack`;
//!   the configuration language and its registry (`etl-config`) see the
//!   lower crates and the engine but never the runtime, the command line
//!   or a heavy connector (whose glue registers from above); connectors
//!   and the runtime sit on top, and the command line (`etl-cli`) above
//!   the runtime.
//! * The transform interface (`etl-transform`) depends on `etl-record`
//!   and on no third-party crate ([`THIRD_PARTY_ALLOWED`]): whoever writes
//!   a transform builds nothing else.
//! * Heavy third-party crates stay where they belong: the VRL interpreter
//!   in the crate of the remap language, the command line's own crates
//!   (argument parsing, HTTP server, status line, log formatter) in
//!   `etl-cli`, so that a library user does not build them.
//! * Every `.rs` file opens with a `//!` module doc.
//! * No unused dependency: every dependency a crate declares is named
//!   in its code (`name::`, `use name`, `name!`); a dev-dependency in its
//!   sources, tests, benches or examples. A dependency declared only to
//!   turn on features, or a normal one used only by tests, is reported:
//!   the first is listed in [`FEATURE_ONLY`] with its reason, the second
//!   becomes a dev-dependency.
//! * `unsafe_code` is allowed (`#[allow(unsafe_code)]`,
//!   `#![allow(unsafe_code)]`, `expect` alike) only in the files that
//!   `docs/architecture.md`'s "Unsafe code" section names (as paths from
//!   the workspace root, in backticks), and every file it names allows it:
//!   the section is the list, read from there ([`UNSAFE_SECTION`]). Unsafe
//!   code written in a file it does not name is reported too, however it
//!   is allowed, and so is a member whose manifest does not take the
//!   workspace's lints or sets `unsafe_code`.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// Which workspace crates each crate may depend on (any dependency kind).
/// A crate missing from this table is an error: add it with its layer.
const LAYERS: &[(&str, &[&str])] = &[
    ("etl-fs", &[]),
    // The configuration's units (durations), read alike by every crate
    // that reads a table.
    ("etl-units", &[]),
    ("etl-record", &["etl-fs"]),
    ("etl-ack", &["etl-record"]),
    ("etl-checkpoint", &["etl-fs", "etl-record", "etl-ack"]),
    (
        "etl-source",
        &["etl-fs", "etl-record", "etl-ack", "etl-checkpoint"],
    ),
    ("etl-sink", &["etl-fs", "etl-record", "etl-ack"]),
    // The transform interface and chain: records in, outcomes out.
    ("etl-transform", &["etl-record"]),
    // The engine: JSON steps, the faithful writer, VRL.
    ("etl-json", &["etl-record", "etl-transform"]),
    // The configuration language and the registry: never the runtime, the
    // command line or a heavy connector (their glue registers from above).
    (
        "etl-config",
        &[
            "etl-units",
            "etl-fs",
            "etl-record",
            "etl-ack",
            "etl-checkpoint",
            "etl-source",
            "etl-sink",
            "etl-transform",
            "etl-json",
        ],
    ),
    (
        "etl-kafka",
        &[
            "etl-units",
            "etl-fs",
            "etl-record",
            "etl-ack",
            "etl-checkpoint",
            "etl-source",
            "etl-sink",
        ],
    ),
    (
        "etl-postgres",
        &[
            "etl-units",
            "etl-fs",
            "etl-record",
            "etl-ack",
            "etl-checkpoint",
            "etl-source",
            "etl-sink",
        ],
    ),
    // Change data capture: a source that reuses the sink crate's
    // connection settings. `etl` for its tests alone (the whole pipeline
    // over a slot); nothing below depends on it.
    (
        "etl-postgres-cdc",
        &[
            "etl-units",
            "etl-fs",
            "etl-record",
            "etl-ack",
            "etl-checkpoint",
            "etl-source",
            "etl-sink",
            "etl-config",
            "etl-postgres",
            "etl",
        ],
    ),
    // The object-store sink; its tests run whole pipelines through the
    // runtime's registry and `Pipeline::builder()` (dev-dependencies
    // only: the crate itself sees records and sinks).
    (
        "etl-object-store",
        &[
            "etl-units",
            "etl-record",
            "etl-ack",
            "etl-checkpoint",
            "etl-source",
            "etl-sink",
            "etl-config",
            "etl",
            "etl-test-support",
        ],
    ),
    // The HTTP sink; its tests run whole pipelines through the runtime's
    // registry against the test-support servers (dev-dependencies only).
    (
        "etl-http",
        &[
            "etl-units",
            "etl-record",
            "etl-ack",
            "etl-checkpoint",
            "etl-source",
            "etl-sink",
            "etl-config",
            "etl",
            "etl-test-support",
        ],
    ),
    (
        "etl",
        &[
            "etl-fs",
            "etl-record",
            "etl-ack",
            "etl-checkpoint",
            "etl-source",
            "etl-sink",
            "etl-transform",
            "etl-json",
            "etl-config",
            "etl-kafka",
            "etl-postgres",
        ],
    ),
    (
        "etl-cli",
        &[
            "etl-fs",
            "etl-record",
            "etl-ack",
            "etl-checkpoint",
            "etl-source",
            "etl-sink",
            "etl-transform",
            "etl-json",
            "etl-config",
            "etl-kafka",
            "etl-postgres",
            "etl-postgres-cdc",
            "etl-object-store",
            "etl-http",
            "etl",
        ],
    ),
    (
        "etl-tests",
        &[
            "etl-record",
            "etl-ack",
            "etl-checkpoint",
            "etl-source",
            "etl-sink",
            "etl-transform",
            "etl-json",
            "etl-config",
            "etl-fs",
            "etl-kafka",
            "etl-postgres",
            "etl-postgres-cdc",
            "etl-object-store",
            "etl",
            "etl-cli",
        ],
    ),
    (
        "etl-example-custom",
        &[
            "etl-fs",
            "etl-record",
            "etl-ack",
            "etl-checkpoint",
            "etl-source",
            "etl-sink",
            "etl-transform",
            "etl-json",
            "etl-config",
            "etl",
            "etl-cli",
        ],
    ),
    (
        "etl-test-support",
        &["etl-record", "etl-ack", "etl-checkpoint", "etl-source"],
    ),
    ("xtask", &["etl-test-support"]),
];

/// The test-support crate: the tests of the crates it does not build on
/// may use it (those at or above its own layer; it depends on
/// `etl-source`, so `etl-source`'s own tests may too; and `etl-sink`,
/// beside that chain), but only `xtask` and `etl-tests` may depend on it
/// for real.
const TEST_SUPPORT: &str = "etl-test-support";
/// Crates whose tests may use the test-support crate.
const TEST_SUPPORT_IN_TESTS: &[&str] = &[
    "etl-sink",
    "etl-source",
    "etl-object-store",
    "etl-http",
    "etl-kafka",
    "etl-postgres",
    "etl-postgres-cdc",
    "etl",
    "etl-cli",
    "etl-tests",
    "etl-example-custom",
];
/// Crates that may depend on the test-support crate for real.
const TEST_SUPPORT_FOR_REAL: &[&str] = &["xtask", "etl-tests"];

/// Third-party crates that only these workspace crates may depend on: the
/// VRL interpreter (and its ~200 crates) belongs to the engine's `remap`
/// feature (`etl-json`), never to the interface, the runtime or the
/// configuration.
const ONLY_IN: &[(&str, &[&str])] = &[("vrl", &["etl-json"])];

/// Crates whose normal dependencies outside the workspace are limited to
/// a list: the transform interface is what every engine and every user's
/// transform builds on, so it stays as light as the record itself.
const THIRD_PARTY_ALLOWED: &[(&str, &[&str])] = &[("etl-transform", &[])];

/// Dependencies declared for their features alone, never named in code:
/// (crate, dependency, why). Everything else a crate declares must be
/// used, or tidy reports it.
const FEATURE_ONLY: &[(&str, &str, &str)] = &[(
    "etl-object-store",
    "reqwest",
    "object_store's HTTP client, declared to give it rustls without aws-lc-rs",
)];

/// Third-party crates of the command line (argument parsing, the metrics
/// endpoint's HTTP server, the status line, the log formatter): only
/// [`CLI_CRATES`] may depend on them for real, so that a library user of
/// `Pipeline::builder()` does not build them. Tests of any crate may use
/// them (`tracing-subscriber`, to see a test's logs).
const CLI_ONLY: &[&str] = &["clap", "axum", "indicatif", "tracing-subscriber"];
/// The command line, and the test programs of `etl-tests` (`etl-faulty`
/// and `etl-soak` log through `tracing-subscriber`; nothing depends on
/// that crate).
const CLI_CRATES: &[&str] = &["etl-cli", "etl-tests"];

/// The document and the heading of the section that lists the files
/// allowed `unsafe_code`.
const UNSAFE_SECTION: (&str, &str) = ("docs/architecture.md", "### Unsafe code");

/// Run every check against the workspace at `root`.
pub(crate) fn run(root: &Path) -> crate::Result {
    eprintln!("$ cargo metadata --format-version 1 --no-deps (tidy: layer order)");
    let output = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(root)
        .output()
        .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let metadata: Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("cargo metadata printed invalid JSON: {e}"))?;
    let mut problems = layer_violations(&metadata);
    eprintln!("tidy: unused dependencies");
    problems.extend(unused_dependencies(&metadata));
    eprintln!("tidy: unsafe_code allowed only where docs/architecture.md says");
    problems.extend(unlisted_unsafe(root));
    problems.extend(lints_not_the_workspace(&metadata));
    eprintln!("tidy: module docs of every .rs file");
    for dir in ["crates", "xtask", "tests", "examples"] {
        missing_module_docs(&root.join(dir), root, &mut problems);
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("tidy found problems:\n  {}", problems.join("\n  ")))
    }
}

/// Every dependency edge between workspace crates that breaks the layer
/// order, as readable sentences.
pub(crate) fn layer_violations(metadata: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let packages = metadata["packages"].as_array().cloned().unwrap_or_default();
    let members: Vec<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    for package in &packages {
        let Some(name) = package["name"].as_str() else {
            continue;
        };
        let Some((_, allowed)) = LAYERS.iter().find(|(n, _)| *n == name) else {
            problems.push(format!(
                "crate `{name}` has no layer: add it to LAYERS in xtask/src/tidy.rs"
            ));
            continue;
        };
        for dep in package["dependencies"].as_array().into_iter().flatten() {
            let Some(dep_name) = dep["name"].as_str() else {
                continue;
            };
            let kind = dep["kind"].as_str().unwrap_or("normal");
            if dep_name == TEST_SUPPORT {
                let allowed = if kind == "dev" {
                    TEST_SUPPORT_IN_TESTS.contains(&name) || TEST_SUPPORT_FOR_REAL.contains(&name)
                } else {
                    TEST_SUPPORT_FOR_REAL.contains(&name)
                };
                if !allowed {
                    problems.push(format!(
                        "`{name}` depends on `{dep_name}` ({kind}), which only the tests of \
                         crates it does not build on may use"
                    ));
                }
                continue;
            }
            // A crate's tests may enable its own test features through a
            // dev-dependency on itself.
            let on_itself = dep_name == name && kind == "dev";
            if members.contains(&dep_name) && !allowed.contains(&dep_name) && !on_itself {
                problems.push(format!(
                    "`{name}` depends on `{dep_name}` ({kind}), which breaks the layer order"
                ));
            }
            if let Some((_, owners)) = ONLY_IN.iter().find(|(d, _)| *d == dep_name)
                && !owners.contains(&name)
            {
                problems.push(format!(
                    "`{name}` depends on `{dep_name}`, which only {owners:?} may use"
                ));
            }
            if let Some((_, allowed)) = THIRD_PARTY_ALLOWED.iter().find(|(c, _)| *c == name)
                && kind != "dev"
                && !members.contains(&dep_name)
                && !allowed.contains(&dep_name)
            {
                problems.push(format!(
                    "`{name}` depends on `{dep_name}` ({kind}); its only third-party \
                     dependencies may be {allowed:?}"
                ));
            }
            if CLI_ONLY.contains(&dep_name) && kind != "dev" && !CLI_CRATES.contains(&name) {
                problems.push(format!(
                    "`{name}` depends on `{dep_name}` ({kind}), a crate of the command line \
                     that only {CLI_CRATES:?} may depend on outside their tests"
                ));
            }
        }
    }
    problems
}

/// Every declared dependency no code of its crate names, as readable
/// sentences. A normal or build dependency must be named in `src/` or
/// `build.rs`; a dev-dependency anywhere in the crate (`src/`, `tests/`,
/// `benches/`, `examples/`), unless it only adds features to a normal
/// dependency of the same name or to the crate itself.
pub(crate) fn unused_dependencies(metadata: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    for package in metadata["packages"].as_array().into_iter().flatten() {
        let (Some(name), Some(manifest)) =
            (package["name"].as_str(), package["manifest_path"].as_str())
        else {
            continue;
        };
        let dir = Path::new(manifest).parent().unwrap_or(Path::new("."));
        let mut main_code = String::new();
        rust_text(&dir.join("src"), &mut main_code);
        rust_text(&dir.join("build.rs"), &mut main_code);
        let mut all_code = main_code.clone();
        for extra in ["tests", "benches", "examples"] {
            rust_text(&dir.join(extra), &mut all_code);
        }
        let deps: Vec<&Value> = package["dependencies"]
            .as_array()
            .into_iter()
            .flatten()
            .collect();
        let normal = |dep: &str| {
            deps.iter().any(|d| {
                d["name"].as_str() == Some(dep) && d["kind"].as_str().is_none_or(|k| k != "dev")
            })
        };
        for dep in &deps {
            let Some(dep_name) = dep["name"].as_str() else {
                continue;
            };
            let kind = dep["kind"].as_str().unwrap_or("normal");
            if FEATURE_ONLY
                .iter()
                .any(|(c, d, _)| *c == name && *d == dep_name)
            {
                continue;
            }
            let ident = dep["rename"].as_str().unwrap_or(dep_name).replace('-', "_");
            if kind == "dev" {
                if dep_name == name || normal(dep_name) || names_crate(&all_code, &ident) {
                    continue;
                }
                problems.push(format!(
                    "`{name}` declares the dev-dependency `{dep_name}`, which none of its code uses"
                ));
            } else if !names_crate(&main_code, &ident) {
                let hint = if names_crate(&all_code, &ident) {
                    ": only its tests use it, so make it a dev-dependency"
                } else {
                    ""
                };
                problems.push(format!(
                    "`{name}` declares the {kind} dependency `{dep_name}`, which its code does not use{hint}"
                ));
            }
        }
    }
    problems
}

/// Whether `code` names the crate `ident` as a path (`ident::`), an
/// import (`use ident;`, `ident as`), a macro (`ident!`) or an `extern
/// crate`.
fn names_crate(code: &str, ident: &str) -> bool {
    let bytes = code.as_bytes();
    code.match_indices(ident).any(|(at, _)| {
        let before = at.checked_sub(1).map(|i| bytes[i]);
        if before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return false;
        }
        let rest = &code[at + ident.len()..];
        rest.starts_with("::")
            || rest.starts_with('!')
            || rest.trim_start().starts_with(';')
            || rest.starts_with(" as ")
            || code[..at].ends_with("extern crate ")
    })
}

/// Append the text of every `.rs` file at or under `path` to `out`.
fn rust_text(path: &Path, out: &mut String) {
    rust_files(path, &mut |file| {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        out.push_str(&text);
        out.push('\n');
        // A module brought in with `#[path = "..."]` from outside the
        // folders read (the fuzz checks the tests run) is this crate's
        // code too; read once, not followed further.
        let dir = file.parent().unwrap_or(Path::new("."));
        for included in path_attributes(&text) {
            let included = dir.join(included);
            if included.is_file() && included.extension().is_some_and(|e| e == "rs") {
                out.push_str(&std::fs::read_to_string(&included).unwrap_or_default());
                out.push('\n');
            }
        }
    });
}

/// Calls `each` with every `.rs` file at or under `path`, in name order,
/// skipping hidden folders and build folders (known by the
/// `CACHEDIR.TAG` cargo writes in them, not by their name: a module
/// folder may be called `target`).
fn rust_files(path: &Path, each: &mut dyn FnMut(&Path)) {
    if path.is_file() {
        if path.extension().is_some_and(|e| e == "rs") {
            each(path);
        }
        return;
    }
    let Ok(entries) = std::fs::read_dir(path) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for entry in entries {
        let name = entry.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !name.starts_with('.') && !entry.join("CACHEDIR.TAG").is_file() {
            rust_files(&entry, each);
        }
    }
}

/// The paths of the `#[path = "..."]` attributes in `text`.
fn path_attributes(text: &str) -> Vec<&str> {
    text.match_indices("#[path = \"")
        .filter_map(|(at, found)| {
            let rest = &text[at + found.len()..];
            rest.find('"').map(|end| &rest[..end])
        })
        .collect()
}

/// Every file that allows `unsafe_code` without being listed in
/// [`UNSAFE_SECTION`], and every listed file that does not allow it, as
/// readable sentences.
pub(crate) fn unlisted_unsafe(root: &Path) -> Vec<String> {
    let (doc, heading) = UNSAFE_SECTION;
    let text = std::fs::read_to_string(root.join(doc)).unwrap_or_default();
    let Some(listed) = unsafe_listed(&text, heading) else {
        return vec![format!(
            "{doc} has no `{heading}` section: it lists the files allowed unsafe_code"
        )];
    };
    let mut allowing = Vec::new();
    for dir in ["crates", "xtask", "tests", "examples", "fuzz"] {
        files_allowing_unsafe(&root.join(dir), root, &mut allowing);
    }
    let mut problems = Vec::new();
    for file in &allowing {
        if !listed.contains(file) {
            problems.push(format!(
                "{file} allows or writes unsafe code, but {doc}'s \"{}\" section does not \
                 list it: name it there (`{file}`) with its reason, or remove it",
                heading.trim_start_matches('#').trim()
            ));
        }
    }
    for file in &listed {
        if !allowing.contains(file) {
            problems.push(format!(
                "{doc}'s \"{}\" section lists {file}, which does not allow unsafe_code \
                 (or does not exist): take it off the list",
                heading.trim_start_matches('#').trim()
            ));
        }
    }
    problems
}

/// The paths (backticked, ending in `.rs`, with a `/`) in the section of
/// `doc` under `heading`, up to the next heading; `None` without one.
fn unsafe_listed(doc: &str, heading: &str) -> Option<Vec<String>> {
    let mut lines = doc.lines().skip_while(|l| l.trim_end() != heading);
    lines.next()?;
    let section: Vec<&str> = lines.take_while(|l| !l.starts_with('#')).collect();
    let section = section.join("\n");
    Some(
        section
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|s| s.ends_with(".rs") && s.contains('/') && !s.contains(char::is_whitespace))
            .map(str::to_owned)
            .collect(),
    )
}

/// The `.rs` files at or under `path` (paths from `root`, with `/`)
/// with an attribute that allows `unsafe_code`.
fn files_allowing_unsafe(path: &Path, root: &Path, out: &mut Vec<String>) {
    rust_files(path, &mut |file| {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        if allows_unsafe(&text) || uses_unsafe(&text) {
            let shown = file.strip_prefix(root).unwrap_or(file);
            let parts: Vec<_> = shown.iter().map(|p| p.to_string_lossy()).collect();
            out.push(parts.join("/"));
        }
    });
}

/// Whether `text` writes unsafe code itself (`unsafe` before a block,
/// `fn`, `impl`, `trait` or `extern`, outside `//` comments), whatever
/// allows it: an allowance [`allows_unsafe`] does not see (two attributes
/// on one line, one a macro writes) still needs the code it allows.
fn uses_unsafe(text: &str) -> bool {
    text.lines().any(|line| {
        let code = line.split("//").next().unwrap_or("");
        code.match_indices("unsafe").any(|(at, word)| {
            let before = code[..at].chars().next_back();
            let after = code[at + word.len()..].trim_start();
            before.is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
                && (after.starts_with('{')
                    || ["fn", "impl", "trait", "extern"].iter().any(|k| {
                        after.strip_prefix(k).is_some_and(|rest| {
                            rest.chars()
                                .next()
                                .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
                        })
                    }))
        })
    })
}

/// Every workspace member whose manifest does not take the workspace's
/// lints (`[lints] workspace = true`), or sets `unsafe_code` itself: its
/// code would escape the `deny` the list above relies on.
pub(crate) fn lints_not_the_workspace(metadata: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    for package in metadata["packages"].as_array().into_iter().flatten() {
        let (Some(name), Some(manifest)) =
            (package["name"].as_str(), package["manifest_path"].as_str())
        else {
            continue;
        };
        let text = std::fs::read_to_string(manifest).unwrap_or_default();
        let mut lines = text.lines().map(str::trim);
        let takes_workspace = lines.by_ref().any(|l| l == "[lints]")
            && lines
                .take_while(|l| !l.starts_with('['))
                .any(|l| l.replace(' ', "") == "workspace=true");
        if !takes_workspace {
            problems.push(format!(
                "`{name}` does not take the workspace's lints: add `[lints]` with \
                 `workspace = true` to its manifest"
            ));
        }
        if text.contains("unsafe_code") {
            problems.push(format!(
                "`{name}`'s manifest sets `unsafe_code`: the workspace's `deny` is the rule, \
                 and a file that needs unsafe code allows it where docs/architecture.md lists it"
            ));
        }
    }
    problems
}

/// Whether `text` has an attribute (a line starting `#[` or `#![`, to
/// its closing bracket, over several lines if need be) that allows or
/// expects `unsafe_code`, alone or among other lints, with or without a
/// reason or a `cfg_attr`. Comments and strings that mention it are not
/// attributes.
fn allows_unsafe(text: &str) -> bool {
    let lines: Vec<&str> = text.lines().collect();
    (0..lines.len()).any(|start| {
        let first = lines[start].trim_start();
        if !first.starts_with("#[") && !first.starts_with("#![") {
            return false;
        }
        let mut attribute = String::new();
        let mut depth = 0i32;
        'lines: for line in &lines[start..] {
            for c in line.chars() {
                attribute.push(c);
                match c {
                    '[' | '(' => depth += 1,
                    ']' | ')' => {
                        depth -= 1;
                        if depth == 0 {
                            break 'lines;
                        }
                    }
                    _ => {}
                }
            }
            attribute.push('\n');
        }
        let words: Vec<&str> = attribute
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
            .collect();
        (words.contains(&"allow") || words.contains(&"expect")) && words.contains(&"unsafe_code")
    })
}

fn missing_module_docs(dir: &Path, root: &Path, problems: &mut Vec<String>) {
    rust_files(dir, &mut |file| {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let first = text.lines().map(str::trim).find(|l| !l.is_empty());
        if !first.is_some_and(|l| l.starts_with("//!")) {
            let shown = file.strip_prefix(root).unwrap_or(file);
            problems.push(format!(
                "{} does not open with a `//!` module doc",
                shown.display()
            ));
        }
    });
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn package(name: &str, deps: &[&str]) -> Value {
        json!({
            "name": name,
            "dependencies": deps
                .iter()
                .map(|d| json!({ "name": d, "kind": null }))
                .collect::<Vec<_>>(),
        })
    }

    #[test]
    fn the_workspace_is_tidy() {
        run(&crate::cmd::root()).unwrap();
    }

    #[test]
    fn record_depending_on_ack_is_a_violation() {
        let metadata = json!({
            "packages": [package("etl-record", &["etl-ack", "bytes"]), package("etl-ack", &["etl-record"])]
        });
        let problems = layer_violations(&metadata);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("`etl-record` depends on `etl-ack`"));
    }

    #[test]
    fn a_crate_above_the_runtime_is_refused_in_its_tests_too() {
        let metadata = |kind: &str| {
            json!({
                "packages": [
                    {
                        "name": "etl",
                        "dependencies": [{ "name": "etl-object-store", "kind": kind }],
                    },
                    package("etl-object-store", &[]),
                ]
            })
        };
        for kind in ["dev", "normal"] {
            let problems = layer_violations(&metadata(kind));
            assert_eq!(problems.len(), 1, "{problems:?}");
            assert!(problems[0].contains(&format!("`etl` depends on `etl-object-store` ({kind})")));
        }
    }

    #[test]
    fn sink_must_not_see_checkpoints_or_sources() {
        let metadata = json!({
            "packages": [
                package("etl-sink", &["etl-ack", "etl-checkpoint", "etl-source"]),
                package("etl-ack", &[]),
                package("etl-checkpoint", &[]),
                package("etl-source", &[]),
            ]
        });
        assert_eq!(layer_violations(&metadata).len(), 2);
    }

    #[test]
    fn the_configuration_never_depends_on_the_runtime_the_cli_or_a_connector() {
        let metadata = json!({
            "packages": [
                package("etl-config", &["etl-source", "etl-json", "etl", "etl-cli", "etl-kafka"]),
                package("etl-source", &[]),
                package("etl-json", &[]),
                package("etl", &["etl-config"]),
                package("etl-cli", &["etl-config", "etl"]),
                package("etl-kafka", &[]),
            ]
        });
        let problems = layer_violations(&metadata);
        assert_eq!(problems.len(), 3, "{problems:?}");
        for crate_ in ["etl", "etl-cli", "etl-kafka"] {
            assert!(
                problems
                    .iter()
                    .any(|p| p.contains(&format!("`etl-config` depends on `{crate_}`"))),
                "{problems:?}"
            );
        }
    }

    #[test]
    fn only_the_engine_may_use_vrl() {
        let metadata = json!({
            "packages": [package("etl-json", &["vrl"]), package("etl", &["vrl"]), package("etl-source", &["vrl"])]
        });
        let problems = layer_violations(&metadata);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("`etl` depends on `vrl`"));
        assert!(problems[1].contains("`etl-source` depends on `vrl`"));
    }

    #[test]
    fn the_transform_interface_takes_no_third_party_crate() {
        let metadata = json!({
            "packages": [
                package("etl-transform", &["etl-record", "serde_json"]),
                package("etl-record", &[]),
                json!({ "name": "etl-transform", "dependencies": [{ "name": "proptest", "kind": "dev" }] }),
            ]
        });
        let problems = layer_violations(&metadata);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("`etl-transform` depends on `serde_json` (normal)"));
    }

    #[test]
    fn command_line_crates_only_in_the_cli_except_in_tests() {
        let with = |name: &str, dep: &str, kind: Option<&str>| json!({ "name": name, "dependencies": [{ "name": dep, "kind": kind }] });
        let metadata = json!({
            "packages": [
                with("etl-cli", "clap", None),
                with("etl", "clap", None),
                with("etl", "axum", Some("build")),
                with("etl-sink", "indicatif", None),
                with("etl-source", "tracing-subscriber", Some("dev")),
            ]
        });
        let problems = layer_violations(&metadata);
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].contains("`etl` depends on `clap` (normal)"));
        assert!(problems[1].contains("`etl` depends on `axum` (build)"));
        assert!(problems[2].contains("`etl-sink` depends on `indicatif` (normal)"));
    }

    #[test]
    fn test_support_is_for_tests_only() {
        let dev = |name: &str| {
            json!({
                "name": name,
                "dependencies": [{ "name": "etl-test-support", "kind": "dev" }],
            })
        };
        let metadata = json!({
            "packages": [
                dev("etl-source"),
                dev("etl-kafka"),
                dev("etl-ack"),
                package("xtask", &["etl-test-support"]),
                package("etl-test-support", &["etl-source"]),
                package("etl-sink", &["etl-test-support"]),
            ]
        });
        let problems = layer_violations(&metadata);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("`etl-ack` depends on `etl-test-support` (dev)"));
        assert!(problems[1].contains("`etl-sink` depends on `etl-test-support` (normal)"));
    }

    #[test]
    fn an_unknown_crate_must_be_given_a_layer() {
        let metadata = json!({ "packages": [package("etl-new", &[])] });
        assert!(layer_violations(&metadata)[0].contains("has no layer"));
    }

    fn manifest(name: &str, deps: Value) -> Value {
        let dir =
            std::env::temp_dir().join(format!("xtask-tidy-deps-{}-{name}", std::process::id()));
        json!({
            "name": name,
            "manifest_path": dir.join("Cargo.toml").to_string_lossy(),
            "dependencies": deps,
        })
    }

    #[test]
    fn a_dependency_no_code_names_is_reported_and_a_test_only_one_is_told_to_move() {
        let package = manifest(
            "etl-demo",
            json!([
                { "name": "serde_json", "kind": null },
                { "name": "etl-ack", "kind": null },
                { "name": "memchr", "kind": null },
                { "name": "tokio", "kind": "dev" },
                { "name": "proptest", "kind": "dev" },
                { "name": "memchr", "kind": "dev" },
                { "name": "etl-demo", "kind": "dev" },
            ]),
        );
        let dir = std::path::PathBuf::from(package["manifest_path"].as_str().unwrap());
        let dir = dir.parent().unwrap();
        std::fs::create_dir_all(dir.join("src")).unwrap();
        std::fs::create_dir_all(dir.join("tests")).unwrap();
        std::fs::write(
            dir.join("src/lib.rs"),
            "//! Demo.\nuse serde_json::Value;\npub fn f() { let _ = memchr::memchr; }\n// not etl_ack_like::x\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("tests/it.rs"),
            "//! It.\n#[tokio::test]\nasync fn t() { etl_ack::channel(); }\n",
        )
        .unwrap();
        let problems = unused_dependencies(&json!({ "packages": [package] }));
        std::fs::remove_dir_all(dir).unwrap();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0].contains("`etl-ack`") && problems[0].contains("make it a dev-dependency")
        );
        assert!(problems[1].contains("dev-dependency `proptest`"));
    }

    #[test]
    fn a_module_a_path_attribute_brings_in_from_outside_the_crate_is_its_code() {
        let package = manifest(
            "etl-demo-path",
            json!([{ "name": "arbitrary", "kind": "dev" }]),
        );
        let dir = std::path::PathBuf::from(package["manifest_path"].as_str().unwrap());
        let dir = dir.parent().unwrap();
        let outside = dir.with_extension("outside");
        std::fs::create_dir_all(dir.join("tests")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("checks.rs"), "use arbitrary::Unstructured;\n").unwrap();
        let included = format!(
            "#[path = \"../../{}/checks.rs\"]\nmod checks;\n",
            outside.file_name().unwrap().to_str().unwrap()
        );
        std::fs::write(dir.join("tests/it.rs"), included).unwrap();
        let problems = unused_dependencies(&json!({ "packages": [package] }));
        std::fs::remove_dir_all(dir).unwrap();
        std::fs::remove_dir_all(&outside).unwrap();
        assert!(problems.is_empty(), "{problems:?}");
    }

    #[test]
    fn a_crate_is_named_only_as_a_whole_word_followed_by_a_path_import_or_macro() {
        assert!(names_crate("use tokio::sync;", "tokio"));
        assert!(names_crate("extern crate libc;", "libc"));
        assert!(names_crate("use rand;", "rand"));
        assert!(names_crate("tracing::warn!()", "tracing"));
        assert!(names_crate("anyhow!(\"x\")", "anyhow"));
        assert!(!names_crate("my_tokio::x", "tokio"));
        assert!(!names_crate("tokio_util::sync", "tokio"));
        assert!(!names_crate("// talks about tokio here", "tokio"));
    }

    #[test]
    fn unsafe_code_is_allowed_only_in_the_files_the_architecture_lists() {
        let root = std::env::temp_dir().join(format!("xtask-tidy-unsafe-{}", std::process::id()));
        let write = |path: &str, text: &str| {
            let file = root.join(path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(file, text).unwrap();
        };
        write(
            "docs/architecture.md",
            "# Map\n\n### Unsafe code\n\nThese: `crates/a/src/listed.rs` (why), \
             `crates/a/tests/alloc.rs`, `crates/gone/src/old.rs`; not `unsafe_code`.\n\n\
             ### Secrets\n\n`crates/b/src/later.rs`\n",
        );
        write(
            "crates/a/src/listed.rs",
            "//! A.\n#[allow(unsafe_code)] // why\nmod x {}\n",
        );
        write(
            "crates/a/tests/alloc.rs",
            "//! T.\n#![allow(\n    unsafe_code,\n    reason = \"a global allocator\"\n)]\n",
        );
        write(
            "crates/b/src/later.rs",
            "//! B.\n    #![allow(dead_code, unsafe_code)]\n",
        );
        write(
            "crates/b/src/said.rs",
            "//! Says `#[allow(unsafe_code)]` in a comment.\n// #[allow(unsafe_code)]\n\
             #![deny(unsafe_code)]\n#[allow(clippy::unwrap_used)]\nfn f() {}\n",
        );
        write(
            "xtask/src/gated.rs",
            "//! G.\n#[cfg_attr(test, expect(\n    unsafe_code\n))]\nfn g() {}\n",
        );
        // Unsafe code itself, whatever allows it (here an attribute
        // after another on one line), in a module folder called `target`
        // too; not in a build folder, nor in names, strings or comments
        // that merely contain the word.
        let code = ["un", "safe { *p }"].concat();
        write(
            "crates/b/src/inline.rs",
            &format!(
                "//! I.\n#[inline] #[allow(unsafe_code)] fn f(p: *const u8) -> u8 {{ {code} }}\n"
            ),
        );
        write(
            "crates/b/src/target/mod.rs",
            &format!("//! M.\nfn g() {{ {code}; }}\n"),
        );
        write(
            "crates/b/target/CACHEDIR.TAG",
            "Signature: 8a477f597d28d172789f06886806bc55\n",
        );
        write(
            "crates/b/target/built.rs",
            &format!("fn h() {{ {code}; }}\n"),
        );
        write(
            "crates/b/src/words.rs",
            "//! W.\nfn not_unsafe_fn() {}\nconst UNSAFE_FNS: u8 = 0;\nlet unsafe_thing = 1; \
             // an unsafe { block in a comment\n",
        );
        let problems = unlisted_unsafe(&root);
        std::fs::remove_dir_all(&root).unwrap();
        let named = |file: &str| {
            problems
                .iter()
                .any(|p| p.starts_with(&format!("{file} allows or writes unsafe code")))
        };
        assert_eq!(problems.len(), 5, "{problems:?}");
        assert!(named("crates/b/src/inline.rs"), "{problems:?}");
        assert!(named("crates/b/src/later.rs"), "{problems:?}");
        assert!(named("crates/b/src/target/mod.rs"), "{problems:?}");
        assert!(named("xtask/src/gated.rs"), "{problems:?}");
        assert!(
            problems
                .iter()
                .any(|p| p.contains("\"Unsafe code\" section does not list it")),
            "{problems:?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| p.contains("lists crates/gone/src/old.rs, which does not allow")),
            "{problems:?}"
        );
        // Without the section, that is the problem.
        assert!(
            unlisted_unsafe(Path::new("/nonexistent"))[0].contains("no `### Unsafe code` section")
        );
    }

    #[test]
    fn a_member_not_taking_the_workspaces_lints_or_setting_unsafe_code_is_reported() {
        let dir = std::env::temp_dir().join(format!("xtask-tidy-lints-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let manifest = |name: &str, text: &str| {
            let path = dir.join(format!("{name}.toml"));
            std::fs::write(&path, text).unwrap();
            json!({ "name": name, "manifest_path": path.to_str().unwrap() })
        };
        let packages = vec![
            manifest(
                "good",
                "[package]\nname = \"good\"\n\n[lints]\nworkspace = true\n",
            ),
            manifest("none", "[package]\nname = \"none\"\n"),
            manifest("elsewhere", "[lints]\n\n[dependencies]\nworkspace = true\n"),
            manifest(
                "own",
                "[lints]\nworkspace = true\n\n[lints.rust]\nunsafe_code = \"allow\"\n",
            ),
        ];
        let problems = lints_not_the_workspace(&json!({ "packages": packages }));
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(
            problems[0].starts_with("`none` does not take"),
            "{problems:?}"
        );
        assert!(
            problems[1].starts_with("`elsewhere` does not take"),
            "{problems:?}"
        );
        assert!(
            problems[2].starts_with("`own`'s manifest sets `unsafe_code`"),
            "{problems:?}"
        );
    }

    #[test]
    fn files_without_module_docs_are_reported() {
        let dir = std::env::temp_dir().join(format!("xtask-tidy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("good.rs"), "\n//! Documented.\nfn f() {}\n").unwrap();
        std::fs::write(dir.join("bad.rs"), "// not a module doc\n").unwrap();
        let mut problems = Vec::new();
        missing_module_docs(&dir, &dir, &mut problems);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            problems,
            vec!["bad.rs does not open with a `//!` module doc"]
        );
    }
}
