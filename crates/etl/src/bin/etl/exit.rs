//! Exit codes and how failures are reported (see `etl --help`).

use std::process::ExitCode;

/// Documented exit codes (sysexits where one fits).
pub(crate) mod code {
    pub(crate) const FAILURE: u8 = 1;
    pub(crate) const DATA: u8 = 65;
    pub(crate) const NO_INPUT: u8 = 66;
    pub(crate) const IO: u8 = 74;
    pub(crate) const CONFIG: u8 = 78;
    pub(crate) const ABORTED: u8 = 130;
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

    pub(crate) fn from_pipeline(e: etl::PipelineError) -> Self {
        use etl::PipelineError as P;
        use etl_checkpoint::CheckpointError as C;
        use etl_source::SourceError as S;
        let code = match &e {
            P::Source(
                S::Io { .. } | S::NoMatch { .. } | S::Pattern { .. } | S::NotAFile { .. },
            ) => code::NO_INPUT,
            P::Source(S::Poison { .. } | S::InputReplaced { .. }) | P::NoDeadLetterSink { .. } => {
                code::DATA
            }
            P::Source(S::Config(_)) => code::CONFIG,
            P::Checkpoint(C::Io { .. } | C::Corrupt { .. } | C::Commit { .. })
            | P::Source(S::Checkpoint(C::Io { .. } | C::Corrupt { .. } | C::Commit { .. })) => {
                code::IO
            }
            P::Invalid(_) => code::CONFIG,
            _ => code::FAILURE,
        };
        Exit::new(code, e.to_string())
    }

    /// Print the error the way cargo does and return the exit code.
    pub(crate) fn report(self) -> ExitCode {
        eprintln!("error: {}", self.message);
        ExitCode::from(self.code)
    }
}
