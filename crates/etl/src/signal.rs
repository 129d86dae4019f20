//! Stopping a pipeline on SIGINT, SIGTERM and SIGHUP the way the `etl`
//! command does.

use std::future::Future;
use std::io::{self, Write};

use tokio_util::sync::CancellationToken;

/// The exit status of a process aborted by a second signal: 128 + SIGINT,
/// what shells report for an interrupted command.
pub const ABORT_EXIT_CODE: i32 = 130;

/// A token cancelled by the first SIGINT, SIGTERM or SIGHUP (Ctrl-C on
/// Windows), for [`Pipeline::run`](crate::Pipeline::run).
///
/// The behaviour is the `etl` command's:
///
/// * the **first** signal cancels the token: the pipeline stops reading,
///   drains what is in flight, flushes its sinks and commits; a run
///   stopped this way returns `Ok` with [`Summary::stopped`](crate::Summary::stopped)
///   set, and a restart repeats nothing;
/// * a **second** signal ends the process at once with exit status
///   [`ABORT_EXIT_CODE`] (130) after one line on standard error (written
///   best-effort: a closed or full standard error does not matter). What
///   was not committed is read again by the next run, so nothing is lost.
///
/// SIGHUP stops like SIGTERM: the terminal or the session that started
/// the run went away, and the run ends with its final commit rather than
/// by the default action. SIGUSR1 and SIGUSR2 are caught and ignored (one
/// `info` log line each): by default either would end the process at
/// once, without a final commit.
///
/// The signal handlers are installed before this returns, so a signal
/// arriving right after is not missed; they stay installed for the life
/// of the process (the default "terminate" action of these signals does
/// not come back). Call it once, from inside a tokio runtime; the
/// watching runs on a spawned task.
///
/// ```no_run
/// # async fn demo(pipeline: etl::Pipeline) -> Result<(), Box<dyn std::error::Error>> {
/// let shutdown = etl::shutdown_signal()?;
/// let summary = pipeline.run(shutdown).await?;
/// if summary.stopped {
///     eprintln!("stopped by a signal after {} records", summary.read);
/// }
/// # Ok(())
/// # }
/// ```
///
/// # Errors
///
/// An I/O error when there is no tokio runtime on this thread or the
/// signal handlers cannot be installed.
pub fn shutdown_signal() -> io::Result<CancellationToken> {
    let runtime = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
    let signals = Signals::install()?;
    let token = CancellationToken::new();
    runtime.spawn(watch(
        signals,
        token.clone(),
        || {
            tracing::warn!(
                "stopping: draining in-flight records and committing (signal again to abort)"
            );
        },
        || {
            let _ = writeln!(
                io::stderr().lock(),
                "\naborted; uncommitted records will be read again on the next run"
            );
            std::process::exit(ABORT_EXIT_CODE);
        },
    ));
    Ok(token)
}

/// Something that yields one item per signal received; `None` when no
/// more can come.
pub(crate) trait SignalStream: Send + 'static {
    /// The next signal.
    fn recv(&mut self) -> impl Future<Output = Option<()>> + Send;
}

/// Cancel `token` on the first signal (after `on_first`), call `abort` on
/// the second. Returns when the stream ends or after `abort` returns
/// (which the real one never does).
pub(crate) async fn watch<S: SignalStream>(
    mut signals: S,
    token: CancellationToken,
    on_first: impl FnOnce() + Send,
    abort: impl FnOnce() + Send,
) {
    if signals.recv().await.is_none() {
        return;
    }
    on_first();
    token.cancel();
    if signals.recv().await.is_none() {
        return;
    }
    abort();
}

/// SIGINT, SIGTERM and SIGHUP stop; SIGUSR1 and SIGUSR2 are caught and
/// ignored, so that neither ends the process by its default action
/// (which would stop without a final commit).
#[cfg(unix)]
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
    /// `None` once its stream has ended.
    user1: Option<tokio::signal::unix::Signal>,
    /// `None` once its stream has ended.
    user2: Option<tokio::signal::unix::Signal>,
}

#[cfg(unix)]
impl Signals {
    fn install() -> io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
            user1: Some(signal(SignalKind::user_defined1())?),
            user2: Some(signal(SignalKind::user_defined2())?),
        })
    }
}

/// The next SIGUSR1 or SIGUSR2 of `signal`, or never once it has ended.
#[cfg(unix)]
async fn next_ignored(signal: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match signal {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

#[cfg(unix)]
impl SignalStream for Signals {
    async fn recv(&mut self) -> Option<()> {
        loop {
            tokio::select! {
                got = self.interrupt.recv() => return got,
                got = self.terminate.recv() => return got,
                got = self.hangup.recv() => return got,
                got = next_ignored(&mut self.user1) => match got {
                    Some(()) => tracing::info!("SIGUSR1 received and ignored"),
                    None => self.user1 = None,
                },
                got = next_ignored(&mut self.user2) => match got {
                    Some(()) => tracing::info!("SIGUSR2 received and ignored"),
                    None => self.user2 = None,
                },
            }
        }
    }
}

/// Ctrl-C.
#[cfg(not(unix))]
struct Signals {
    ctrl_c: tokio::signal::windows::CtrlC,
}

#[cfg(not(unix))]
impl Signals {
    fn install() -> io::Result<Self> {
        Ok(Signals {
            ctrl_c: tokio::signal::windows::ctrl_c()?,
        })
    }
}

#[cfg(not(unix))]
impl SignalStream for Signals {
    async fn recv(&mut self) -> Option<()> {
        self.ctrl_c.recv().await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use tokio::sync::mpsc;

    use super::*;

    struct Channel(mpsc::UnboundedReceiver<()>);

    impl SignalStream for Channel {
        async fn recv(&mut self) -> Option<()> {
            self.0.recv().await
        }
    }

    fn counter() -> (Arc<AtomicU32>, impl FnOnce() + Send) {
        let count = Arc::new(AtomicU32::new(0));
        let inc = count.clone();
        (count, move || {
            inc.fetch_add(1, Ordering::SeqCst);
        })
    }

    #[tokio::test]
    async fn first_signal_cancels_and_second_aborts() {
        let (send, recv) = mpsc::unbounded_channel();
        let token = CancellationToken::new();
        let (warned, on_first) = counter();
        let (aborted, abort) = counter();
        let watcher = tokio::spawn(watch(Channel(recv), token.clone(), on_first, abort));

        tokio::task::yield_now().await;
        assert!(!token.is_cancelled(), "nothing before a signal");

        send.send(()).unwrap();
        token.cancelled().await;
        assert_eq!(warned.load(Ordering::SeqCst), 1);
        assert_eq!(
            aborted.load(Ordering::SeqCst),
            0,
            "the first one stops gracefully"
        );

        send.send(()).unwrap();
        watcher.await.unwrap();
        assert_eq!(aborted.load(Ordering::SeqCst), 1, "the second one aborts");
    }

    #[tokio::test]
    async fn no_signal_no_stop() {
        let (send, recv) = mpsc::unbounded_channel::<()>();
        let token = CancellationToken::new();
        let (aborted, abort) = counter();
        let watcher = tokio::spawn(watch(Channel(recv), token.clone(), || {}, abort));
        drop(send);
        watcher.await.unwrap();
        assert!(!token.is_cancelled());
        assert_eq!(aborted.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn outside_a_runtime_is_an_error_not_a_panic() {
        assert!(shutdown_signal().is_err());
    }
}
