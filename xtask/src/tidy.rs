//! `cargo xtask tidy`: invariants of the repository that the compiler does
//! not check.
//!
//! * Layer order: a crate depends only on the crates below it (read from
//!   `cargo metadata`). `etl-record <- etl-ack <- etl-checkpoint <-
//!   etl-source`; `etl-sink` sees only `etl-record` and `etl-ack`;
//!   connectors and the runtime sit on top.
//! * Every `.rs` file opens with a `//!` module doc.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// Which workspace crates each crate may depend on (any dependency kind).
/// A crate missing from this table is an error: add it with its layer.
const LAYERS: &[(&str, &[&str])] = &[
    ("etl-fs", &[]),
    ("etl-record", &["etl-fs"]),
    ("etl-ack", &["etl-record"]),
    ("etl-checkpoint", &["etl-fs", "etl-record", "etl-ack"]),
    (
        "etl-source",
        &["etl-fs", "etl-record", "etl-ack", "etl-checkpoint"],
    ),
    ("etl-sink", &["etl-fs", "etl-record", "etl-ack"]),
    (
        "etl-kafka",
        &[
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
            "etl-fs",
            "etl-record",
            "etl-ack",
            "etl-checkpoint",
            "etl-source",
            "etl-sink",
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
            "etl-kafka",
            "etl-postgres",
        ],
    ),
    (
        "etl-tests",
        &[
            "etl-fs",
            "etl-record",
            "etl-ack",
            "etl-checkpoint",
            "etl-source",
            "etl-sink",
            "etl-kafka",
            "etl-postgres",
            "etl",
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
            "etl",
        ],
    ),
    (
        "etl-test-support",
        &["etl-record", "etl-ack", "etl-checkpoint", "etl-source"],
    ),
    ("xtask", &["etl-test-support"]),
];

/// The test-support crate: the tests of the crates at or above its own
/// layer may use it (it depends on `etl-source`, so `etl-source`'s own
/// tests may too), but only `xtask` and `etl-tests` may depend on it for
/// real.
const TEST_SUPPORT: &str = "etl-test-support";
/// Crates whose tests may use the test-support crate.
const TEST_SUPPORT_IN_TESTS: &[&str] = &[
    "etl-source",
    "etl-kafka",
    "etl-postgres",
    "etl",
    "etl-tests",
    "etl-example-custom",
];
/// Crates that may depend on the test-support crate for real.
const TEST_SUPPORT_FOR_REAL: &[&str] = &["xtask", "etl-tests"];

/// Third-party crates that only these workspace crates may depend on: the
/// VRL interpreter (and its ~200 crates) belongs to the `etl` crate's
/// `remap` feature, never to the lower layers.
const ONLY_IN: &[(&str, &[&str])] = &[("vrl", &["etl"])];

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
                         crates at or above `etl-source` may use"
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
        }
    }
    problems
}

fn missing_module_docs(dir: &Path, root: &Path, problems: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                missing_module_docs(&path, root, problems);
            }
        } else if name.ends_with(".rs") {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let first = text.lines().map(str::trim).find(|l| !l.is_empty());
            if !first.is_some_and(|l| l.starts_with("//!")) {
                let shown = path.strip_prefix(root).unwrap_or(&path);
                problems.push(format!(
                    "{} does not open with a `//!` module doc",
                    shown.display()
                ));
            }
        }
    }
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
    fn only_the_etl_crate_may_use_vrl() {
        let metadata = json!({
            "packages": [package("etl", &["vrl"]), package("etl-source", &["vrl"])]
        });
        let problems = layer_violations(&metadata);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("`etl-source` depends on `vrl`"));
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
