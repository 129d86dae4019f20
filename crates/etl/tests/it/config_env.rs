//! `${VAR}` in the configuration: values from the environment, defaults,
//! `$$`, comments left alone, unset variables as problems at their line
//! (the `etl` command's exit 78 on them is tested in `etl-cli`).

// Helpers outside `#[test]` functions unwrap too.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use etl::ConfigProblem;

fn env(name: &str) -> Option<String> {
    match name {
        "OUT" => Some("/data/out".to_owned()),
        "EMPTY" => Some(String::new()),
        "KAFKA_PASSWORD" => Some("Zq9SecretPw".to_owned()),
        _ => None,
    }
}

fn parse(text: &str) -> Result<etl::Config, Vec<ConfigProblem>> {
    etl::registry()
        .loader()
        .env(env)
        .text(text, Path::new("/base"))
}

fn file_sink_path(config: &etl::Config) -> String {
    let kind = &config.sinks[0].kind;
    match kind.options_of::<etl::config::FileSinkOptions>("file") {
        Some(f) => f.path.display().to_string(),
        None => panic!("{kind:?}"),
    }
}

const GENERATOR: &str = "[source]\ntype = \"generator\"\nrecords_per_partition = 1\n";

#[test]
fn string_values_take_variables_and_defaults() {
    let config = parse(&format!(
        "{GENERATOR}[[sinks]]\ntype = \"file\"\npath = \"${{OUT}}/a.ndjson\"\nname = \"${{NAME:-main}}\"\n"
    ))
    .unwrap();
    assert_eq!(file_sink_path(&config), "/data/out/a.ndjson");
    assert_eq!(config.sinks[0].name, "main");
    let config = parse(&format!(
        "{GENERATOR}[[sinks]]\ntype = \"file\"\npath = \"${{EMPTY:-x}}/${{EMPTY-y}}b\"\n"
    ))
    .unwrap();
    assert_eq!(file_sink_path(&config), "/base/x/b");
}

#[test]
fn double_dollars_escape_and_comments_are_not_interpolated() {
    let config = parse(&format!(
        "# path = \"${{UNSET}}\"\n{GENERATOR}[[sinks]]\ntype = \"file\"\n\
         path = \"/p/$${{OUT}}/$$/a$b\" # ${{UNSET}} here too\n"
    ))
    .unwrap();
    assert_eq!(file_sink_path(&config), "/p/${OUT}/$/a$b");
}

#[test]
fn an_unset_variable_is_a_problem_at_its_line_naming_it() {
    let problems = parse(&format!(
        "{GENERATOR}\n[[sinks]]\ntype = \"file\"\npath = \"${{EDIR}}/out.ndjson\"\n"
    ))
    .unwrap_err();
    assert_eq!(problems.len(), 1, "{problems:?}");
    let p = &problems[0];
    assert_eq!((p.line, p.column), (7, 8), "{p:?}");
    assert_eq!(p.section, "[[sinks]] #1");
    assert!(
        p.message
            .contains("path: environment variable EDIR is not set"),
        "{p:?}"
    );
}

#[test]
fn every_malformed_reference_is_reported() {
    let problems = parse(&format!(
        "{GENERATOR}name = \"${{A B}}\"\n[[sinks]]\ntype = \"file\"\npath = \"${{OPEN\"\n"
    ))
    .unwrap_err();
    let lines: Vec<usize> = problems.iter().map(|p| p.line).collect();
    assert_eq!(lines, [4, 7], "{problems:?}");
    assert!(problems[0].message.contains("invalid variable reference"));
    assert!(problems[1].message.contains("unterminated"));
}

#[test]
fn a_secret_from_a_variable_is_in_no_problem_and_stays_a_secret() {
    // Put where it does not belong: the message about it leaves it out.
    let problems =
        parse("[source]\ntype = \"${KAFKA_PASSWORD}\"\n[[sinks]]\ntype = \"blackhole\"\n")
            .unwrap_err();
    let shown = format!("{problems:?}");
    assert!(!shown.contains("Zq9SecretPw"), "{shown}");
    assert!(shown.contains("***"), "{shown}");
    // Where it belongs, the connector's table holds it as a secret.
    #[cfg(feature = "kafka")]
    {
        let config = parse(
            "[source]\ntype = \"kafka\"\nbrokers = \"b:1\"\ngroup_id = \"g\"\ntopics = [\"t\"]\n\
             [source.properties]\n\"sasl.password\" = \"${KAFKA_PASSWORD}\"\n\
             [[sinks]]\ntype = \"blackhole\"\n[checkpoint]\nrevoke_deadline = \"1s\"\n",
        )
        .unwrap();
        assert_eq!(config.source.type_name(), "kafka");
        let table = config.source.table();
        use secrecy::ExposeSecret;
        assert_eq!(
            table.expose_secret()["properties"]["sasl.password"].as_str(),
            Some("Zq9SecretPw")
        );
        assert!(!format!("{config:?}").contains("Zq9SecretPw"));
    }
}
