//! The program as users run it: `etl-custom validate` and `run` on TOML
//! files that use the registered types.

use std::path::Path;
use std::process::{Command, Output};

fn etl_custom(args: &[&str], config: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_etl-custom"))
        .args(["--log-format", "json"])
        .args(args)
        .arg(config)
        .output()
        .expect("the binary runs")
}

fn pipeline_in(dir: &Path) -> std::path::PathBuf {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("pipeline.toml");
    let text = std::fs::read_to_string(example).expect("the example's pipeline.toml");
    let path = dir.join("pipeline.toml");
    std::fs::write(&path, text).expect("a copy in the test's folder");
    path
}

#[test]
fn the_example_pipeline_validates_and_runs_with_its_own_components() {
    let dir = tempfile::tempdir().unwrap();
    let config = pipeline_in(dir.path());

    let validate = etl_custom(&["validate"], &config);
    assert!(
        validate.status.success(),
        "{}",
        String::from_utf8_lossy(&validate.stderr)
    );

    let run = etl_custom(&["run"], &config);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let csv = std::fs::read_to_string(dir.path().join("output/readings.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("sensor,reading,celsius,fahrenheit_delta")
    );
    let rows: Vec<Vec<String>> = lines
        .map(|l| l.split(',').map(str::to_owned).collect())
        .collect();
    // celsius = 15 + (reading % 20) / 2 is at least 20 for reading % 20
    // >= 10: half of the 2 x 500 readings.
    assert_eq!(rows.len(), 500, "{csv}");
    for row in &rows {
        let celsius: f64 = row[2].parse().unwrap();
        let scaled: f64 = row[3].parse().unwrap();
        assert!(celsius >= 20.0, "{row:?}");
        assert!((scaled - celsius * 1.8).abs() < 1e-9, "{row:?}");
    }

    // Everything was committed: a second run reads nothing again.
    let again = etl_custom(&["run"], &config);
    assert!(again.status.success());
    let csv_again = std::fs::read_to_string(dir.path().join("output/readings.csv")).unwrap();
    assert_eq!(csv_again, csv);
}

#[test]
fn a_problem_in_a_registered_table_is_reported_at_its_line_and_exits_78() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("pipeline.toml");
    std::fs::write(
        &config,
        r#"[source]
type = "sensors"
readings = "many"

[[transforms]]
type = "scale"
field = "celsius"
factr = 2

[[sinks]]
type = "csv"
path = "out.csv"
columns = ["sensor"]
password = "hunter2-secret"
"#,
    )
    .unwrap();
    let out = etl_custom(&["validate"], &config);
    assert_eq!(out.status.code(), Some(78));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(":3:"), "readings, at its line: {stderr}");
    assert!(stderr.contains("factr"), "{stderr}");
    assert!(stderr.contains(":8:"), "factr, at its line: {stderr}");
    assert!(stderr.contains("password"), "{stderr}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("hunter2") && !stderr.contains("hunter2"),
        "a secret-looking value never shows: {stderr}"
    );
}
