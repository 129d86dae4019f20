//! `etl validate` on VRL programs and array paths: compile errors are
//! configuration errors, reported at their place in the file.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use etl::ConfigProblem;

fn with_transforms(transforms: &str) -> String {
    format!(
        "[source]\ntype = \"generator\"\nrecords_per_partition = 1\n\n{transforms}\n[[sinks]]\ntype = \"blackhole\"\n"
    )
}

fn problems(transforms: &str) -> Vec<ConfigProblem> {
    etl::registry()
        .loader()
        .text(&with_transforms(transforms), Path::new("."))
        .unwrap_err()
}

#[cfg(feature = "remap")]
#[test]
fn a_vrl_compile_error_is_reported_at_its_line_and_column_in_the_file() {
    let found =
        problems("[[transforms]]\ntype = \"remap\"\nsource = '''\n.a = 1\n.b = upcasee(.a)\n'''\n");
    assert_eq!(found.len(), 1, "{found:?}");
    // Line 9 of the file is `.b = upcasee(.a)`; the call starts at column 6.
    assert_eq!((found[0].line, found[0].column), (9, 6), "{found:?}");
    assert_eq!(found[0].section, "[[transforms]] #1");
    assert!(
        found[0].message.contains("undefined function"),
        "{}",
        found[0].message
    );
}

#[cfg(feature = "remap")]
#[test]
fn programs_cannot_read_the_environment_or_reach_the_network() {
    for call in [
        "get_env_var!(\"HOME\")",
        "http_request!(\"http://127.0.0.1/\", \"get\")",
        "dns_lookup!(\"localhost\")",
        "get_hostname!()",
    ] {
        let found = problems(&format!(
            "[[transforms]]\ntype = \"remap\"\nsource = '.x = {call}'\n"
        ));
        assert!(
            found
                .iter()
                .any(|p| p.message.contains("undefined function")),
            "{call}: {found:?}"
        );
    }
}

#[cfg(feature = "remap")]
#[test]
fn a_remap_file_is_read_beside_the_config_and_named_in_its_errors() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("good.vrl"), ".n = 1\n").unwrap();
    std::fs::write(dir.path().join("bad.vrl"), ".n = to_int(.s)\n").unwrap();
    let config = etl::registry()
        .loader()
        .text(
            &with_transforms("[[transforms]]\ntype = \"remap\"\nfile = \"good.vrl\"\n"),
            dir.path(),
        )
        .unwrap();
    assert!(matches!(
        &config.transforms[0],
        etl::config::TransformConfig::Remap { source: Some(s), drop_on_error: true, .. } if s == ".n = 1\n"
    ));
    let found = etl::registry()
        .loader()
        .text(
            &with_transforms("[[transforms]]\ntype = \"remap\"\nfile = \"bad.vrl\"\n"),
            dir.path(),
        )
        .unwrap_err();
    assert!(found[0].message.contains("bad.vrl"), "{found:?}");
    assert!(found[0].message.contains("unhandled fallible"), "{found:?}");
    let found = etl::registry()
        .loader()
        .text(
            &with_transforms("[[transforms]]\ntype = \"remap\"\nfile = \"none.vrl\"\n"),
            dir.path(),
        )
        .unwrap_err();
    assert!(
        found[0].message.contains("cannot read the program"),
        "{found:?}"
    );
    let found = problems("[[transforms]]\ntype = \"remap\"\n");
    assert!(
        found[0].message.contains("`source` or in `file`"),
        "{found:?}"
    );
}

#[test]
fn a_filter_takes_a_condition_or_a_comparison() {
    let found = problems(
        "[[transforms]]\ntype = \"filter\"\ncondition = '.a == 1'\nfield = \"a\"\nop = \"exists\"\n",
    );
    assert!(
        found.iter().any(|p| p.message.contains("not both")),
        "{found:?}"
    );
    let found = problems("[[transforms]]\ntype = \"filter\"\nfield = \"a\"\n");
    assert!(
        found
            .iter()
            .any(|p| p.message.contains("missing field `op`")),
        "{found:?}"
    );
    let found = problems("[[transforms]]\ntype = \"filter\"\nop = \"exists\"\n");
    assert!(
        found
            .iter()
            .any(|p| p.message.contains("missing field `field`")),
        "{found:?}"
    );
}

#[cfg(feature = "remap")]
#[test]
fn a_condition_must_be_boolean_and_read_only() {
    let found = problems("[[transforms]]\ntype = \"filter\"\ncondition = '.a'\n");
    assert!(found[0].message.contains("boolean"), "{found:?}");
    let found = problems("[[transforms]]\ntype = \"filter\"\ncondition = '.a = true'\n");
    assert!(found[0].message.contains("read-only"), "{found:?}");
    let ok = etl::registry().loader().text(
        &with_transforms(
            "[[transforms]]\ntype = \"filter\"\ncondition = '.order.status == \"paid\"'\n",
        ),
        Path::new("."),
    );
    assert!(ok.is_ok(), "{ok:?}");
}

#[test]
fn array_paths_are_written_with_dots() {
    let found = problems(
        "[[transforms]]\ntype = \"filter\"\nfield = \"order.items[0].qty\"\nop = \"exists\"\n",
    );
    assert!(found[0].message.contains("items.0.qty"), "{found:?}");
    let ok = etl::registry().loader().text(
        &with_transforms(
            "[[transforms]]\ntype = \"filter\"\nfield = \"order.items.0.qty\"\nop = \"exists\"\n",
        ),
        Path::new("."),
    );
    assert!(ok.is_ok(), "{ok:?}");
}
