//! Running, killing and restarting a pipeline process, keeping each run's
//! standard output and error in files beside the data.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A guard against a run that never ends: far above any suite's need.
const RUN_LIMIT: Duration = Duration::from_secs(300);

/// Runs one program (the `etl` binary, or a pipeline program of this
/// package) with JSON logs, numbering its runs.
#[derive(Debug)]
pub struct Etl {
    program: PathBuf,
    prefix: Vec<String>,
    logs: PathBuf,
    runs: u32,
}

/// How a run ended and what it printed.
#[derive(Clone, Debug)]
pub struct RunLog {
    /// The exit code (`None` when killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error (JSON log lines, then any `error:` line).
    pub stderr: String,
}

/// The end of a run started with a kill deadline.
#[derive(Clone, Debug)]
pub struct ExitInfo {
    /// Whether the run was still going at the deadline and got SIGKILL.
    pub killed: bool,
    /// What it printed.
    pub log: RunLog,
}

impl Etl {
    /// The `etl` binary ([`etl_binary`](crate::etl_binary)) with
    /// `--log-format json`, keeping logs in `logs`.
    #[must_use]
    pub fn binary(logs: &Path) -> Self {
        Etl {
            program: crate::etl_binary(),
            prefix: vec!["--log-format".to_owned(), "json".to_owned()],
            logs: logs.to_path_buf(),
            runs: 0,
        }
    }

    /// Another program (taking the same kind of arguments), keeping logs in
    /// `logs`.
    #[must_use]
    pub fn program(program: &Path, logs: &Path) -> Self {
        Etl {
            program: program.to_path_buf(),
            prefix: Vec::new(),
            logs: logs.to_path_buf(),
            runs: 0,
        }
    }

    /// Runs started so far.
    #[must_use]
    pub fn runs(&self) -> u32 {
        self.runs
    }

    /// Run to the end.
    ///
    /// # Errors
    ///
    /// The program cannot start, or runs longer than five minutes (then it
    /// is killed).
    pub fn run<S: AsRef<OsStr>>(&mut self, args: &[S]) -> std::io::Result<RunLog> {
        let end = self.run_until(args, None)?;
        if end.killed {
            return Err(std::io::Error::other(format!(
                "{} ran longer than {RUN_LIMIT:?}; killed",
                self.program.display()
            )));
        }
        Ok(end.log)
    }

    /// Run until it exits or, with `kill_after`, until that much time has
    /// passed: then SIGKILL it (the kill happens only if it is still
    /// running).
    ///
    /// # Errors
    ///
    /// The program cannot start, or its logs cannot be read.
    pub fn run_until<S: AsRef<OsStr>>(
        &mut self,
        args: &[S],
        kill_after: Option<Duration>,
    ) -> std::io::Result<ExitInfo> {
        self.runs += 1;
        std::fs::create_dir_all(&self.logs)?;
        let out_path = self.logs.join(format!("run-{}.out", self.runs));
        let err_path = self.logs.join(format!("run-{}.err", self.runs));
        let mut child = Command::new(&self.program)
            .args(&self.prefix)
            .args(args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out_path)?)
            .stderr(std::fs::File::create(&err_path)?)
            .spawn()?;
        let started = Instant::now();
        let limit = kill_after.unwrap_or(RUN_LIMIT);
        let mut killed = false;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if started.elapsed() >= limit {
                // `Child::kill` sends SIGKILL on Unix: no handler runs.
                child.kill()?;
                killed = true;
                break child.wait()?;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let read = |p: &Path| std::fs::read(p).map(|b| String::from_utf8_lossy(&b).into_owned());
        Ok(ExitInfo {
            killed,
            log: RunLog {
                code: status.code(),
                stdout: read(&out_path)?,
                stderr: read(&err_path)?,
            },
        })
    }
}

impl RunLog {
    /// The JSON log lines.
    pub fn json_lines(&self) -> impl Iterator<Item = serde_json::Value> + '_ {
        self.stderr
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
    }

    /// The fields of the final `pipeline finished` line, if there is one.
    #[must_use]
    pub fn finished(&self) -> Option<serde_json::Value> {
        self.json_lines()
            .filter(|v| v["message"] == "pipeline finished")
            .last()
    }

    /// A field of the `pipeline finished` line as a number (0 if absent).
    #[must_use]
    pub fn finished_count(&self, field: &str) -> u64 {
        self.finished().and_then(|v| v[field].as_u64()).unwrap_or(0)
    }

    /// Log lines with this message.
    #[must_use]
    pub fn count(&self, message: &str) -> u64 {
        self.json_lines()
            .filter(|v| v["message"] == message)
            .count() as u64
    }

    /// Whether anything panicked.
    #[must_use]
    pub fn panicked(&self) -> bool {
        self.stderr.contains("panicked")
    }

    /// The `error:` line(s) printed at the end of a failed run.
    #[must_use]
    pub fn error(&self) -> String {
        self.stderr
            .lines()
            .filter(|l| l.starts_with("error:") || l.starts_with("  "))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_run_past_its_deadline_is_killed_and_a_short_one_exits() {
        let dir = tempfile::tempdir().unwrap();
        let mut sh = Etl::program(Path::new("sh"), dir.path());
        let slow = sh
            .run_until(&["-c", "sleep 5"], Some(Duration::from_millis(50)))
            .unwrap();
        assert!(slow.killed);
        assert_eq!(slow.log.code, None);
        let quick = sh
            .run(&[
                "-c",
                "echo '{\"message\":\"pipeline finished\",\"read\":3}' >&2",
            ])
            .unwrap();
        assert_eq!(quick.code, Some(0));
        assert_eq!(quick.finished_count("read"), 3);
        assert_eq!(sh.runs(), 2);
    }
}
