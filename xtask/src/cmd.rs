//! Running commands: print each one, then run it, failing on a non-zero
//! exit; or run a few in the background ([`Background`]).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root, found from this crate's manifest directory.
pub(crate) fn root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map_or_else(|| manifest.to_path_buf(), Path::to_path_buf)
}

/// A command to print and run from the workspace root.
#[derive(Debug)]
pub(crate) struct Cmd {
    program: String,
    args: Vec<String>,
    envs: Vec<(String, String)>,
}

impl Cmd {
    /// `cargo` with arguments (the cargo that runs xtask, so the pinned
    /// toolchain).
    pub(crate) fn cargo(args: &[&str]) -> Self {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        Cmd {
            program: cargo,
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            envs: Vec::new(),
        }
    }

    /// `program` with arguments.
    pub(crate) fn new(program: &str, args: &[&str]) -> Self {
        Cmd {
            program: program.to_owned(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            envs: Vec::new(),
        }
    }

    /// Append arguments.
    pub(crate) fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| (*a).to_owned()));
        self
    }

    /// Set an environment variable for the command.
    pub(crate) fn env(mut self, key: &str, value: &str) -> Self {
        self.envs.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Print, then run; an error names the command and its exit status.
    pub(crate) fn run(self) -> crate::Result {
        let shown = self.to_string();
        eprintln!("$ {shown}");
        let status = self
            .command(false)
            .status()
            .map_err(|e| format!("cannot run `{shown}`: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("`{shown}` failed: {status}"))
        }
    }
}

impl std::fmt::Display for Cmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (k, v) in &self.envs {
            write!(f, "{k}={v:?} ")?;
        }
        let program = Path::new(&self.program)
            .file_name()
            .map_or(self.program.as_str(), |n| n.to_str().unwrap_or("cargo"));
        write!(f, "{program}")?;
        for a in &self.args {
            write!(f, " {a}")?;
        }
        Ok(())
    }
}

impl Cmd {
    /// The command as a `std` one, from the workspace root; at the lowest
    /// CPU and disk priorities (`ionice -c3 nice -n 19`) when `niced`.
    fn command(&self, niced: bool) -> Command {
        let mut command = if niced {
            let mut idle = Command::new("ionice");
            idle.args(["-c3", "nice", "-n", "19", &self.program]);
            idle
        } else {
            Command::new(&self.program)
        };
        command
            .args(&self.args)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .current_dir(root());
        command
    }
}

/// Commands run one after another on a thread of their own, at the
/// lowest CPU and disk priorities, their output appended to a log file:
/// work that fills the CPU a foreground step leaves idle (the end-to-end
/// suites mostly wait on servers and child processes) without taking it
/// from that step. [`Background::wait`] joins it; dropping it unjoined
/// kills the command under way, so a failing run leaves nothing
/// building. The commands stay in xtask's process group, so an interrupt
/// from the terminal (Ctrl-C) stops them with the rest.
#[derive(Debug)]
pub(crate) struct Background {
    name: &'static str,
    log: PathBuf,
    thread: Option<std::thread::JoinHandle<crate::Result>>,
    /// The process id of the command under way, and whether the commands
    /// are called off.
    state: std::sync::Arc<std::sync::Mutex<(Option<u32>, bool)>>,
}

impl Background {
    /// Start `commands` (in order, stopping at the first that fails),
    /// logging to `log`.
    pub(crate) fn start(
        name: &'static str,
        log: PathBuf,
        commands: Vec<Cmd>,
    ) -> crate::Result<Self> {
        if let Some(dir) = log.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        let file = std::fs::File::create(&log)
            .map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        eprintln!(
            "xtask: {name}: started in the background at the lowest priority (log: {})",
            log.display()
        );
        let state = std::sync::Arc::new(std::sync::Mutex::new((None, false)));
        let shared = std::sync::Arc::clone(&state);
        let thread = std::thread::spawn(move || -> crate::Result {
            for cmd in commands {
                let shown = cmd.to_string();
                let mut out = file.try_clone().map_err(|e| e.to_string())?;
                let err = file.try_clone().map_err(|e| e.to_string())?;
                {
                    use std::io::Write;
                    let _ = writeln!(out, "$ {shown}");
                }
                let mut command = cmd.command(true);
                command.stdout(out).stderr(err);
                let mut child = {
                    let mut state = shared.lock().map_err(|_| "background state poisoned")?;
                    if state.1 {
                        return Err(format!("`{shown}` called off"));
                    }
                    let child = command
                        .spawn()
                        .map_err(|e| format!("cannot run `{shown}`: {e}"))?;
                    state.0 = Some(child.id());
                    child
                };
                let status = child
                    .wait()
                    .map_err(|e| format!("cannot wait for `{shown}`: {e}"))?;
                if let Ok(mut state) = shared.lock() {
                    state.0 = None;
                }
                if !status.success() {
                    return Err(format!("`{shown}` failed: {status}"));
                }
            }
            Ok(())
        });
        Ok(Background {
            name,
            log,
            thread: Some(thread),
            state,
        })
    }

    /// Wait for the commands to end; on a failure, print their log.
    pub(crate) fn wait(mut self) -> crate::Result {
        let started = std::time::Instant::now();
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        let result = thread
            .join()
            .unwrap_or_else(|_| Err("the background thread panicked".to_owned()));
        eprintln!(
            "xtask: {}: {} (waited {:.0?})",
            self.name,
            if result.is_ok() { "done" } else { "failed" },
            started.elapsed()
        );
        if result.is_err() {
            match std::fs::read_to_string(&self.log) {
                Ok(text) => eprintln!("{text}"),
                Err(e) => eprintln!("xtask: cannot read {}: {e}", self.log.display()),
            }
        }
        result.map_err(|e| format!("{}: {e}", self.name))
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        let pid = match self.state.lock() {
            Ok(mut state) => {
                state.1 = true;
                state.0
            }
            Err(_) => None,
        };
        // `ionice` and `nice` exec the command, so the id is cargo's; the
        // compilers it started end with their crate. Should the kill fail,
        // the thread is left to end on its own rather than waited for.
        let killed = pid.is_some_and(|pid| {
            Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status()
                .is_ok_and(|s| s.success())
        });
        if killed || pid.is_none() {
            let _ = thread.join();
        }
    }
}
