//! `cargo xtask`: the project's task runner.
//!
//! Every task prints each command before running it and stops at the first
//! failure. `cargo xtask ci` is what CI runs; each of its steps also runs
//! on its own. See `cargo xtask help`.

mod bench;
mod cmd;
mod fuzz;
mod kafka;
mod postgres;
mod sim;
mod soak;
mod tidy;

use std::process::ExitCode;

use cmd::{Background, Cmd, root};

const HELP: &str = "\
cargo xtask <TASK>

Tasks:
  ci               everything below, in order, failing fast
  fmt [--check]    rustfmt the workspace (CI checks only)
  lint             clippy on all targets and features, warnings denied, and on
                   etl without default features; cargo check of fuzz/
  test             unit, integration and end-to-end tests, then doc tests
  doc              cargo doc with warnings denied (broken links fail)
  loom             loom models (--cfg etl_loom, own target dir)
  prop [--cases N] every property test (functions named prop_*, release, with
                   the remap language) with N cases each (default 1024; ci
                   runs 10000)
  fuzz --repeatable | [--seconds N] [--target NAME]
                   build the fuzz targets in fuzz/ (cargo-fuzz, installed
                   under the target directory when missing) and run each for
                   N seconds (default 60), growing a kept corpus;
                   --repeatable runs 20000 inputs each from a fixed seed and
                   a fresh corpus, so it passes or fails the same every time
                   (ci runs the targets' checks on their seeds, saved
                   failures and mutations in the test step instead)
  sim [--cases N] [--seed S] [--enable SWITCH,...|all] [--keep-going]
                   the whole-pipeline simulation: N generated pipelines
                   (default 1000; ci runs 2000 from a fixed seed), or one
                   replayed from the seed a failure printed
  tidy             layer order of crate dependencies, module docs
  bench [--full] [--only many-files|lake|...]
                   performance budgets against same-run baselines, one table
                   (not part of ci; --full: memory run at 1M and 10M records)
  kafka [--port N] run the Kafka-compatible test broker in the foreground
  postgres         run a throwaway PostgreSQL server until Enter or Ctrl-C
  soak --minutes N the end-to-end crash loop for N minutes, printing its tally
";

/// Crates with loom models, built with `--cfg etl_loom`.
const LOOM_CRATES: &[&str] = &["etl-ack", "etl-checkpoint"];
/// Cases per property test in `cargo xtask ci`.
const CI_PROP_CASES: u32 = 10_000;
const DEFAULT_PROP_CASES: u32 = 1024;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let builds = !matches!(
        args.first().map(String::as_str),
        Some("fmt" | "tidy" | "help" | "--help" | "-h") | None
    );
    let result = if builds {
        build_prerequisites()
    } else {
        Ok(())
    };
    let result = result.and_then(|()| match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("fmt") => fmt(args.iter().any(|a| a == "--check")),
        Some("lint") => lint(),
        Some("test") => test_then(|| Ok(())),
        Some("doc") => doc(),
        Some("loom") => loom(),
        Some("prop") => prop_cases(&args[1..]).and_then(prop),
        Some("fuzz") => fuzz::Options::parse(&args[1..]).and_then(|o| fuzz::run(&o)),
        Some("sim") => sim::Options::parse(&args[1..]).and_then(|o| sim::run(&o)),
        Some("tidy") => tidy::run(&root()),
        Some("bench") => bench::run(&args[1..]),
        Some("kafka") => kafka::run(&args[1..]),
        Some("postgres") => postgres::run_foreground(&args[1..]),
        Some("soak") => soak::run(&args[1..]),
        Some("help" | "--help" | "-h") | None => {
            print!("{HELP}");
            Ok(())
        }
        Some(other) => Err(format!("unknown task `{other}`\n\n{HELP}")),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e}");
            ExitCode::FAILURE
        }
    }
}

type Result<T = ()> = std::result::Result<T, String>;

/// What building the workspace needs from the system beyond a C compiler:
/// `pkg-config`, OpenSSL's headers (librdkafka's TLS links the system's
/// OpenSSL) and libzstd's (the binary links the system's zstd), with
/// Oniguruma's wanted (VRL's grok functions link it when found, and
/// compile its sources when not). Installed from Debian's packages when
/// missing and we are root (each command printed), as the suites install
/// their servers; otherwise an error saying what to install.
fn build_prerequisites() -> Result {
    let found = |libraries: &[&str]| {
        std::process::Command::new("pkg-config")
            .arg("--exists")
            .args(libraries)
            .status()
            .is_ok_and(|s| s.success())
    };
    // Oniguruma is wanted, not needed: with the two that are needed
    // found, nothing is installed.
    if found(&["openssl", "libzstd"]) {
        return Ok(());
    }
    const PACKAGES: [&str; 4] = ["libssl-dev", "libzstd-dev", "libonig-dev", "pkg-config"];
    let packages = PACKAGES.join(" ");
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    if !root {
        return Err(format!(
            "the headers of OpenSSL or libzstd, or pkg-config, are missing (the binary \
             links the system's OpenSSL and zstd); install them, e.g. \
             `sudo apt-get install {packages}`"
        ));
    }
    Cmd::new("apt-get", &["update", "-q"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .run()?;
    let mut install = vec!["install", "-y", "-q", "--no-install-recommends"];
    install.extend(PACKAGES);
    Cmd::new("apt-get", &install)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .run()?;
    if found(&["openssl", "libzstd"]) {
        Ok(())
    } else {
        Err(format!(
            "apt-get installed {packages} but pkg-config finds no openssl or libzstd"
        ))
    }
}

fn ci() -> Result {
    let started = std::time::Instant::now();
    let mut steps = Steps::default();
    steps.run("fmt", || fmt(true))?;
    steps.run("lint", lint)?;
    // The property tests' release build and the loom models' build do
    // not need the suites: they start once the suites' binaries are
    // built, at the lowest CPU and disk priorities, and take the CPU the
    // suites leave idle while they wait on servers and child processes.
    // Their steps then find them built. Each is dropped (killed) if an
    // earlier step fails.
    //
    // The fuzz targets' checks run in the test step, on their seeds,
    // saved failures and mutations (`etl-tests`, `fuzz_seeds`); the
    // coverage-guided search (`cargo xtask fuzz`) needs an instrumented
    // optimised build of VRL of its own, minutes of CI, and stays out.
    let mut ahead: Option<(Background, Background)> = None;
    steps.run("test", || {
        test_then(|| {
            let prop = Background::start(
                "prop build",
                root().join("target").join("xtask").join("prop-build.log"),
                vec![prop_command(CI_PROP_CASES, true)?],
            )?;
            let loom = Background::start(
                "loom build",
                root().join("target").join("xtask").join("loom-build.log"),
                vec![loom_command(true)],
            )?;
            ahead = Some((prop, loom));
            Ok(())
        })
    })?;
    let (prop_build, loom_build) = ahead.ok_or("the test step started no build ahead")?;
    steps.run("doc", doc)?;
    steps.run("loom", || {
        loom_build.wait()?;
        loom()
    })?;
    steps.run("prop", || {
        prop_build.wait()?;
        prop(CI_PROP_CASES)
    })?;
    steps.run("sim", || sim::run(&sim::Options::ci()))?;
    steps.run("tidy", || tidy::run(&root()))?;
    eprintln!("xtask: ci passed in {:.0?} ({})", started.elapsed(), steps);
    Ok(())
}

/// The wall time of each step `ci` ran, printed as each ends and at the
/// end, so a slow step is found without a profiler.
#[derive(Debug, Default)]
struct Steps(Vec<(&'static str, std::time::Duration)>);

impl Steps {
    fn run(&mut self, name: &'static str, step: impl FnOnce() -> Result) -> Result {
        let started = std::time::Instant::now();
        let result = step();
        let took = started.elapsed();
        self.0.push((name, took));
        let outcome = if result.is_ok() { "passed" } else { "failed" };
        eprintln!("xtask: step {name} {outcome} in {:.0?}", took);
        result
    }
}

impl std::fmt::Display for Steps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (name, took)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{name} {:.0?}", took)?;
        }
        Ok(())
    }
}

fn fmt(check: bool) -> Result {
    let mut cmd = Cmd::cargo(&["fmt", "--all"]);
    if check {
        cmd = cmd.args(&["--", "--check"]);
    }
    cmd.run()
}

fn lint() -> Result {
    Cmd::cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--all-features",
        "--locked",
        "--",
        "-D",
        "warnings",
    ])
    .run()?;
    // `etl` and the `etl` command without the connectors and the remap
    // language, as a user with `default-features = false` builds them:
    // that code is compiled nowhere else.
    Cmd::cargo(&[
        "clippy",
        "-p",
        "etl",
        "-p",
        "etl-cli",
        "--no-default-features",
        "--all-targets",
        "--locked",
        "--",
        "-D",
        "warnings",
    ])
    .run()?;
    // The fuzz crate (a workspace of its own) is compiled nowhere else:
    // its targets, manifest and lock file are checked here, in the
    // workspace's target directory, where the checks above left its
    // dependencies.
    fuzz::check_command().run()
}

/// The test step; `built` runs once every test binary is built, before
/// any runs.
fn test_then(built: impl FnOnce() -> Result) -> Result {
    let pg = postgres::start().map_err(|e| e.to_string())?;
    // The HTTP sink's suite starts its own ClickHouse and VictoriaMetrics
    // servers on loopback (stopped when each test ends); installed here,
    // once, when missing.
    etl_test_support::clickhouse::install().map_err(|e| e.to_string())?;
    etl_test_support::victoria_metrics::install().map_err(|e| e.to_string())?;
    // The object-store sink's suite starts Garage, a real S3 server, in
    // each test; its binary is built here when this machine has none
    // (about 4 minutes on 2 cores, printed), once, outside `target/`.
    let garage = etl_test_support::garage::install().map_err(|e| e.to_string())?;
    eprintln!("xtask: garage: {}", garage.display());
    // And Azurite, the Azure Storage emulator, for its Azure Blob tests:
    // installed here from npm when this machine has none, once, beside
    // Garage.
    let azurite = etl_test_support::azurite::install().map_err(|e| e.to_string())?;
    eprintln!("xtask: azurite: {}", azurite.display());
    // Property tests run in `prop` with a chosen case count; skip them here
    // so they do not run twice.
    // Benches are built by `lint` (clippy --all-targets) and run by
    // `bench`; criterion's harness does not take libtest's `--skip`.
    let targets = [
        "test",
        "--workspace",
        "--lib",
        "--bins",
        "--tests",
        "--examples",
        "--all-features",
        "--locked",
    ];
    Cmd::cargo(&targets).args(&["--no-run"]).run()?;
    built()?;
    Cmd::cargo(&targets)
        // Every failing test binary is reported, not only the first.
        .args(&["--no-fail-fast", "--", "--skip", "prop_"])
        .env("ETL_TEST_POSTGRES", &pg.url())
        .run()?;
    Cmd::cargo(&["test", "--workspace", "--doc", "--all-features", "--locked"]).run()
}

fn doc() -> Result {
    Cmd::cargo(&[
        "doc",
        "--workspace",
        "--no-deps",
        "--all-features",
        "--locked",
    ])
    .env("RUSTDOCFLAGS", "-D warnings")
    .run()
}

fn loom() -> Result {
    loom_command(false).run()
}

/// The loom models' command: the lib tests of [`LOOM_CRATES`] built with
/// `--cfg etl_loom` in a target directory of their own (the flag changes
/// every dependency's build), run, or only built (`build_only`). In the
/// dev profile: the models with two preemptions explore in well under a
/// second unoptimised, and an optimised build of the crates'
/// dependencies (tokio, criterion, proptest) would cost CI minutes.
fn loom_command(build_only: bool) -> Cmd {
    let target = root().join("target").join("loom");
    let mut args = vec!["test", "--locked"];
    for krate in LOOM_CRATES {
        args.extend(["-p", krate]);
    }
    args.push("--lib");
    if build_only {
        args.push("--no-run");
    } else {
        args.extend(["--", "--test-threads=2"]);
    }
    Cmd::cargo(&args)
        .env("RUSTFLAGS", "--cfg etl_loom")
        .env("LOOM_MAX_PREEMPTIONS", "2")
        .env("CARGO_TARGET_DIR", &target.to_string_lossy())
}

fn prop_cases(args: &[String]) -> Result<u32> {
    match args {
        [] => Ok(DEFAULT_PROP_CASES),
        [flag, n] if flag == "--cases" => n
            .parse()
            .map_err(|_| format!("--cases takes a positive integer, got `{n}`")),
        _ => Err("usage: cargo xtask prop [--cases N]".to_owned()),
    }
}

fn prop(cases: u32) -> Result {
    prop_command(cases, false)?.run()
}

/// The property tests' command: `cargo test --release` of the targets
/// that have them, running `prop_*` with `cases` cases each, or only
/// building them (`build_only`).
fn prop_command(cases: u32, build_only: bool) -> Result<Cmd> {
    // Only the targets that have property tests: building the whole
    // workspace in release mode (connectors and every integration test
    // of `etl`, each linking VRL, included) would cost minutes.
    let found = targets_with_prop_tests()?;
    if found.packages.is_empty() {
        return Err("no property tests found (functions named prop_*)".to_owned());
    }
    // Without the connectors (no property test needs one, and building
    // librdkafka in release mode would cost CI minutes), with the remap
    // language: the fast path's differential properties hold it to VRL's
    // runtime. This also builds `etl` without its connectors.
    let mut args = vec!["test", "--release", "--no-default-features", "--locked"];
    // The crates whose property tests need the remap language.
    for (package, feature) in [("etl", "etl/remap"), ("etl-json", "etl-json/remap")] {
        if found.packages.iter().any(|p| p == package) {
            args.extend(["--features", feature]);
        }
    }
    for p in &found.packages {
        args.extend(["-p", p.as_str()]);
    }
    if found.lib {
        args.push("--lib");
    }
    for t in &found.tests {
        args.extend(["--test", t.as_str()]);
    }
    if build_only {
        args.push("--no-run");
    } else {
        args.extend(["--", "prop_"]);
    }
    Ok(Cmd::cargo(&args).env("PROPTEST_CASES", &cases.to_string()))
}

/// Where the property tests are.
#[derive(Debug, Default)]
struct PropTargets {
    /// Crates under `crates/` with a function named `prop_*`.
    packages: Vec<String>,
    /// Whether one of them has one in its library.
    lib: bool,
    /// The integration tests (`tests/NAME.rs` or `tests/NAME/main.rs`
    /// and its modules) that have one.
    tests: Vec<String>,
}

/// The crates and test targets with a function named `prop_*`.
fn targets_with_prop_tests() -> Result<PropTargets> {
    fn has_prop(path: &std::path::Path) -> bool {
        if path.is_dir() {
            return std::fs::read_dir(path)
                .map(|entries| entries.flatten().any(|e| has_prop(&e.path())))
                .unwrap_or(false);
        }
        path.extension().is_some_and(|x| x == "rs")
            && std::fs::read_to_string(path).is_ok_and(|t| t.contains("fn prop_"))
    }
    let crates = root().join("crates");
    let mut found = PropTargets::default();
    for entry in std::fs::read_dir(&crates)
        .map_err(|e| format!("cannot list {}: {e}", crates.display()))?
        .flatten()
    {
        let dir = entry.path();
        let Some(name) = dir.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let lib = has_prop(&dir.join("src"));
        let mut tests = Vec::new();
        if let Ok(entries) = std::fs::read_dir(dir.join("tests")) {
            for test in entries.flatten() {
                let path = test.path();
                let target = if path.is_dir() && path.join("main.rs").is_file() {
                    path.file_name().and_then(|n| n.to_str()).map(str::to_owned)
                } else if path.extension().is_some_and(|x| x == "rs") {
                    path.file_stem().and_then(|n| n.to_str()).map(str::to_owned)
                } else {
                    None
                };
                if let Some(target) = target
                    && has_prop(&path)
                {
                    tests.push(target);
                }
            }
        }
        if lib || !tests.is_empty() {
            found.packages.push(name.to_owned());
            found.lib |= lib;
            // Most crates name their one integration-test binary `it`.
            for test in tests {
                if !found.tests.contains(&test) {
                    found.tests.push(test);
                }
            }
        }
    }
    found.packages.sort();
    found.tests.sort();
    Ok(found)
}
