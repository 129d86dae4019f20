//! Exit codes and how failures are reported (see `etl --help`).

use std::process::ExitCode;

/// Documented exit codes (sysexits where one fits).
pub(crate) mod code {
    pub(crate) const FAILURE: u8 = 1;
    pub(crate) const DATA: u8 = 65;
    pub(crate) const NO_INPUT: u8 = 66;
    pub(crate) const IO: u8 = 74;
    /// EX_TEMPFAIL: the state (offset store, exactly-once output) is owned
    /// by another run; try again once it has ended.
    pub(crate) const IN_USE: u8 = 75;
    pub(crate) const CONFIG: u8 = 78;
    // 130, aborted by a second signal: `etl::ABORT_EXIT_CODE`, exited
    // by `etl::shutdown_signal`'s handler.
}

/// A failed command: what to print and which code to exit with.
#[derive(Debug)]
pub(crate) struct Exit {
    code: u8,
    message: String,
}

impl Exit {
    pub(crate) fn new(code: u8, message: String) -> Self {
        Exit { code, message }
    }

    pub(crate) fn failure(message: String) -> Self {
        Exit::new(code::FAILURE, message)
    }

    pub(crate) fn from_config(e: etl::ConfigError) -> Self {
        let code = match &e {
            etl::ConfigError::Read { .. } => code::NO_INPUT,
            etl::ConfigError::Invalid { .. } => code::CONFIG,
        };
        Exit::new(code, e.to_string())
    }

    /// The exit of a failed pipeline; `registry` gives its components'
    /// errors their [`etl::ErrorKind`].
    pub(crate) fn from_pipeline(e: etl::PipelineError, registry: &etl::Registry) -> Self {
        use etl::PipelineError as P;
        use etl_checkpoint::CheckpointError as C;
        use etl_source::SourceError as S;
        if held_by_another_run(&e) {
            return Exit::new(code::IN_USE, e.to_string());
        }
        // What a component says of its error, whichever side met it: a
        // broker that refused the login or the TLS handshake (the source
        // when it connects, a sink at its first write) is the
        // configuration's error, not an outage; a sink's progress held by
        // another run is state in use.
        match registry.classify(&e) {
            Some(etl::ErrorKind::Config) => return Exit::new(code::CONFIG, e.to_string()),
            Some(etl::ErrorKind::InUse) => return Exit::new(code::IN_USE, e.to_string()),
            _ => {}
        }
        let code = match &e {
            P::Source(
                S::Io { .. } | S::NoMatch { .. } | S::Pattern { .. } | S::NotAFile { .. },
            ) => code::NO_INPUT,
            P::Source(S::Poison { .. } | S::InputReplaced { .. })
            | P::NoDeadLetterSink { .. }
            | P::TransformHalted { .. } => code::DATA,
            P::Source(S::Config(_)) => code::CONFIG,
            // A lock the store cannot take for a reason other than another
            // run (the lock file cannot be created or written: a folder
            // that is not writable, a full disk) is the store's I/O too;
            // a lock held by another run was answered above (75).
            P::FinalCommit(_)
            | P::Checkpoint(C::Io { .. } | C::Corrupt { .. } | C::Commit { .. } | C::Lock(_))
            | P::Source(S::Checkpoint(
                C::Io { .. } | C::Corrupt { .. } | C::Commit { .. } | C::Lock(_),
            )) => code::IO,
            // The output cannot be written (a broken pipe, a read-only or
            // full disk): the sink halted the pipeline.
            P::Sink { source, .. } if source.is_io() => code::IO,
            P::Invalid(_) => code::CONFIG,
            _ => code::FAILURE,
        };
        Exit::new(code, e.to_string())
    }

    /// An offset store's failure: 75 when another run owns it, else 74.
    pub(crate) fn from_store(e: &etl_checkpoint::CheckpointError) -> Self {
        let code = if held_by_another_run(e) {
            code::IN_USE
        } else {
            code::IO
        };
        Exit::new(code, e.to_string())
    }

    /// Print the error the way cargo does and return the exit code.
    pub(crate) fn report(self) -> ExitCode {
        say_err(format_args!("error: {}", self.message));
        ExitCode::from(self.code)
    }
}

/// Write one line to standard output. A failed write (a full device, a
/// closed pipe, a descriptor open for reading only) is an I/O error of
/// the command's output: exit 74, with a message on standard error where
/// that still works.
pub(crate) fn say(line: std::fmt::Arguments<'_>) -> Result<(), Exit> {
    use std::io::Write;
    let failed =
        |e: std::io::Error| Exit::new(code::IO, format!("cannot write to standard output: {e}"));
    let text = format!("{line}\n");
    // Through a duplicate of descriptor 1: `std::io::stdout` counts a
    // write that failed with EBADF (`1</dev/null`) as done.
    #[cfg(unix)]
    {
        use std::os::fd::AsFd;
        let fd = std::io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .map_err(failed)?;
        std::fs::File::from(fd)
            .write_all(text.as_bytes())
            .map_err(failed)
    }
    #[cfg(not(unix))]
    {
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .map_err(failed)
    }
}

/// Write one line to standard error, best effort: a closed or full
/// standard error loses the line, never the run (`eprintln!` would panic).
pub(crate) fn say_err(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Whether `e`, or any error under it, says another run holds a lock this
/// one needs (the offset store, an exactly-once output), wherever in the
/// pipeline it was found. A component's own locks are its
/// [`etl::ErrorKind::InUse`].
fn held_by_another_run(e: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(e), |e| e.source()).any(|e| {
        e.downcast_ref::<etl_record::LockError>()
            .is_some_and(etl_record::LockError::is_in_use)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/operations.md: a revocation that halted the run (its
    /// deadline passed with an exactly-once write under way) exits 1.
    #[test]
    fn a_revocation_that_halted_the_run_is_a_failure() {
        let registry = etl::registry();
        let exit = Exit::from_pipeline(
            etl::PipelineError::Checkpoint(etl_checkpoint::CheckpointError::RevokeUnsettled {
                partitions: vec![etl_record::PartitionId(3)],
                deadline: std::time::Duration::from_secs(10),
            }),
            &registry,
        );
        assert_eq!(exit.code, code::FAILURE);
        assert!(exit.message.contains("revoke_deadline"), "{}", exit.message);
    }

    #[test]
    fn a_failed_final_commit_is_an_io_error_and_a_forced_stop_a_failure() {
        let registry = etl::registry();
        let commit = Exit::from_pipeline(
            etl::PipelineError::FinalCommit("the offset store did not answer".to_owned()),
            &registry,
        );
        assert_eq!(commit.code, code::IO);
        let forced = Exit::from_pipeline(
            etl::PipelineError::ShutdownTimeout {
                parts: "the transform stage".to_owned(),
                timeout: std::time::Duration::from_secs(30),
            },
            &registry,
        );
        assert_eq!(forced.code, code::FAILURE);
        assert!(forced.message.contains("30s"), "{}", forced.message);
    }
}
