//! `examples/postgres_cdc/pipeline.toml` through a registry that knows
//! `postgres_cdc` as the `etl` command's does.

use std::path::Path;

use etl::{Registry, pipeline_from_config};

fn registry() -> Registry {
    // The same line as `etl_cli::main_with`'s.
    etl_postgres_cdc::register(Registry::new())
}

#[tokio::test]
async fn the_example_configuration_builds_a_pipeline() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/postgres_cdc");
    let text = std::fs::read_to_string(example.join("pipeline.toml")).unwrap();
    // Its outputs and state in a folder of the test's, not the example's.
    let base = std::env::temp_dir().join(format!("etl-cdc-example-{}", std::process::id()));
    std::fs::create_dir_all(&base).unwrap();
    let config = registry()
        .loader()
        .env(|name| (name == "DATABASE_URL").then(|| "postgres://etl@127.0.0.1:1/shop".to_owned()))
        .text(&text, &base)
        .unwrap();
    // The source connects nowhere until it is positioned: building the
    // pipeline needs no server.
    let built = pipeline_from_config(&config).await;
    let _ = std::fs::remove_dir_all(&base);
    built.unwrap();
}

#[test]
fn a_misspelt_option_of_the_source_is_reported_at_its_line() {
    let problems = registry()
        .loader().env(|_| None).text("[source]\ntype = \"postgres_cdc\"\nurl = \"postgres://h/d\"\npublication = \"p\"\nslot = \"s\"\nslto = \"x\"\n[[sinks]]\ntype = \"blackhole\"\n", ".".as_ref())
        .unwrap_err();
    assert!(
        problems
            .iter()
            .any(|p| p.line == 6 && p.message.contains("unknown field `slto`")),
        "{problems:?}"
    );
}

/// Offsets given again after a restart are those given before, so an
/// exactly-once sink beside the source is accepted: the pipeline builds
/// (connecting nowhere), with the file sink's `exactly_once = true`.
#[tokio::test]
async fn an_exactly_once_sink_is_accepted_beside_the_source() {
    let folder = std::env::temp_dir().join(format!("etl-cdc-exactly-once-{}", std::process::id()));
    std::fs::create_dir_all(&folder).unwrap();
    let text = "[source]\ntype = \"postgres_cdc\"\nurl = \"postgres://etl@127.0.0.1:1/shop\"\n\
                publication = \"p\"\nslot = \"s\"\n\n[[sinks]]\ntype = \"file\"\n\
                path = \"out.ndjson\"\nexactly_once = true\n";
    let config = registry().loader().text(text, &folder).unwrap();
    let built = pipeline_from_config(&config).await;
    let _ = std::fs::remove_dir_all(&folder);
    if let Err(error) = built {
        panic!("an exactly-once sink was refused beside postgres_cdc: {error}");
    }
}
