//! `etl::shutdown_signal` against real signals. The first test sends this
//! test process SIGINT; the second runs this test binary again as a child
//! (the `child_process` test, which does nothing unless asked to) and sends
//! it two signals, to see the graceful stop and then the exit with 130.
#![cfg(unix)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const CHILD: &str = "ETL_SHUTDOWN_SIGNAL_CHILD";

fn kill(pid: u32, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("kill runs");
    assert!(status.success());
}

#[tokio::test]
async fn the_first_signal_cancels_the_token() {
    if std::env::var_os(CHILD).is_some() || std::env::var_os(CHILD_LOGGING).is_some() {
        return;
    }
    let token = etl::shutdown_signal().unwrap();
    assert!(!token.is_cancelled());
    kill(std::process::id(), "INT");
    tokio::time::timeout(Duration::from_secs(60), token.cancelled())
        .await
        .expect("SIGINT cancels the token");
}

/// The child's side: says when it is ready and when its token is
/// cancelled, then waits to be ended by the second signal.
#[tokio::test]
async fn child_process() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let token = etl::shutdown_signal().unwrap();
    println!("CHILD READY");
    token.cancelled().await;
    println!("CHILD CANCELLED");
    tokio::time::sleep(Duration::from_secs(600)).await;
    println!("CHILD NOT ABORTED");
}

/// The child's side for the other signals: logs to standard output, so
/// that an ignored signal shows as a line there, then behaves as
/// [`child_process`].
#[tokio::test]
async fn child_process_logging() {
    if std::env::var_os(CHILD_LOGGING).is_none() {
        return;
    }
    tracing_subscriber::fmt()
        .with_writer(std::io::stdout)
        .with_ansi(false)
        .init();
    let token = etl::shutdown_signal().unwrap();
    println!("CHILD READY");
    token.cancelled().await;
    println!("CHILD CANCELLED");
    tokio::time::sleep(Duration::from_secs(600)).await;
    println!("CHILD NOT ABORTED");
}

const CHILD_LOGGING: &str = "ETL_SHUTDOWN_SIGNAL_CHILD_LOGGING";

/// Read lines until one holds `marker`; a line holding `forbidden` first
/// fails the test.
fn wait_for_line_before(
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
    marker: &str,
    forbidden: &str,
) {
    for line in lines.by_ref() {
        let line = line.expect("child stdout");
        assert!(
            !line.contains(forbidden),
            "{forbidden} before {marker}: {line}"
        );
        if line.contains(marker) {
            return;
        }
    }
    panic!("the child ended before printing {marker}");
}

/// SIGUSR1 and SIGUSR2 neither kill (their default action) nor stop;
/// SIGHUP stops gracefully like SIGTERM, and a second signal still aborts.
#[test]
fn sigusr1_and_sigusr2_are_ignored_and_sighup_stops_gracefully() {
    if std::env::var_os(CHILD).is_some() || std::env::var_os(CHILD_LOGGING).is_some() {
        return;
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process_logging",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_LOGGING, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    kill_on_panic(&mut child, |child| {
        let pid = child.id();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        wait_for_line(&mut lines, "CHILD READY");
        for name in ["USR1", "USR2"] {
            kill(pid, name);
            wait_for_line_before(
                &mut lines,
                &format!("SIG{name} received and ignored"),
                "CHILD CANCELLED",
            );
        }
        kill(pid, "HUP");
        wait_for_line(&mut lines, "CHILD CANCELLED");
        kill(pid, "INT");
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(etl::ABORT_EXIT_CODE), "{status:?}");
    });
}

fn wait_for_line(lines: &mut impl Iterator<Item = std::io::Result<String>>, marker: &str) {
    for line in lines.by_ref() {
        if line.expect("child stdout").contains(marker) {
            return;
        }
    }
    panic!("the child ended before printing {marker}");
}

fn kill_on_panic(child: &mut Child, f: impl FnOnce(&mut Child)) {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(child)));
    if let Err(panic) = result {
        let _ = child.kill();
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn a_second_signal_exits_130_with_one_line_on_stderr() {
    if std::env::var_os(CHILD).is_some() || std::env::var_os(CHILD_LOGGING).is_some() {
        return;
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    kill_on_panic(&mut child, |child| {
        let pid = child.id();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        wait_for_line(&mut lines, "CHILD READY");
        kill(pid, "TERM");
        wait_for_line(&mut lines, "CHILD CANCELLED");
        kill(pid, "INT");
        let status = child.wait().unwrap();
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        assert_eq!(
            status.code(),
            Some(etl::ABORT_EXIT_CODE),
            "stderr: {stderr}"
        );
        assert!(stderr.contains("aborted"), "stderr: {stderr}");
        assert!(
            lines.all(|l| !l.unwrap().contains("CHILD NOT ABORTED")),
            "ended by the signal, not by its sleep"
        );
    });
}
