//! The crate's error type and how database errors are classified.

use std::time::Duration;

use etl_sink::SinkError;
use tokio_postgres::error::SqlState;

/// Everything that can go wrong in the PostgreSQL sink.
///
/// No variant carries the password: connection errors name the server by
/// host, port, database and user only.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PostgresError {
    /// The configuration is invalid.
    #[error("invalid PostgreSQL sink config: {field}: {reason}")]
    Config {
        /// The offending field (`table`, `columns[2].type`, ...).
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Connecting failed.
    #[error("cannot connect to PostgreSQL at {target}: {}", describe(source))]
    Connect {
        /// `user@host:port/database`.
        target: String,
        /// The client's error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// Connecting did not finish in time.
    #[error("connecting to PostgreSQL at {target} timed out after {after:?}")]
    ConnectTimeout {
        /// `user@host:port/database`.
        target: String,
        /// The limit.
        after: Duration,
    },
    /// A statement failed.
    #[error("PostgreSQL failed to {during} (table {table}): {}", describe(source))]
    Query {
        /// What the sink was doing ("write a batch", "read progress", ...).
        during: &'static str,
        /// The table concerned.
        table: String,
        /// The client's error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// Another sink holds this sink's progress (the same progress table
    /// and progress name): two writers would interleave their progress.
    /// The holder keeps it for its life (a session-level advisory lock,
    /// released by the server when its connection ends).
    #[error(
        "progress {name:?} in table {table} is in use by another sink ({}): one sink at a \
         time may write under a progress name; stop the other run or wait for it to end",
        holder(*pid)
    )]
    InUse {
        /// The progress table, schema-qualified.
        table: String,
        /// The progress name.
        name: String,
        /// The server process id of the holder's session, when the server
        /// shows it.
        pid: Option<i32>,
    },
    /// The progress table holds a row this sink cannot use.
    #[error("progress table {table} is unusable: {reason}")]
    CorruptProgress {
        /// The progress table.
        table: String,
        /// What is wrong.
        reason: String,
    },
}

/// How the sink treats a database error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// The connection or server is (temporarily) unavailable: retry.
    Retryable,
    /// Some row's data is at fault: find it row by row and reject it.
    Row,
    /// Retrying cannot help, and no row is at fault (a missing table, no
    /// permission, a broken schema): an error of the environment, which
    /// halts the pipeline.
    Permanent,
}

/// Classify a client error by its SQLSTATE; errors without one (I/O, a
/// closed connection) are retryable.
pub(crate) fn classify(err: &tokio_postgres::Error) -> Class {
    match err.code() {
        Some(code) => classify_sqlstate(code.code()),
        None => Class::Retryable,
    }
}

/// Classify a SQLSTATE (`"42501"`, `"23505"`, ...) by its class.
fn classify_sqlstate(code: &str) -> Class {
    let class = code.get(..2).unwrap_or(code);
    match class {
        // Data exception, integrity constraint violation, and cardinality
        // violation (one statement hitting the same key twice).
        "22" | "23" | "21" => Class::Row,
        // Connection exception, insufficient resources, operator
        // intervention (shutdown, restart), transaction rollback
        // (serialization failure, deadlock), lock not available.
        "08" | "53" | "57" | "40" => Class::Retryable,
        _ if code == SqlState::LOCK_NOT_AVAILABLE.code() => Class::Retryable,
        // Everything else, syntax error or access rule violation (class
        // 42: a revoked privilege, a dropped table or column) included.
        _ => Class::Permanent,
    }
}

/// The database's reason for an error: message, detail and SQLSTATE; the
/// client's own text when there is no database error.
pub(crate) fn describe(err: &tokio_postgres::Error) -> String {
    match err.as_db_error() {
        Some(db) => {
            let mut text = format!("{} (SQLSTATE {})", db.message(), db.code().code());
            if let Some(detail) = db.detail() {
                text.push_str(": ");
                text.push_str(detail);
            }
            text
        }
        None => {
            // The client's own text is terse ("error connecting to
            // server"); the cause (connection refused, reset) is in the
            // chain.
            let mut text = err.to_string();
            let mut cause = std::error::Error::source(err);
            while let Some(c) = cause {
                let shown = c.to_string();
                if !text.ends_with(&shown) {
                    text.push_str(": ");
                    text.push_str(&shown);
                }
                cause = c.source();
            }
            text
        }
    }
}

fn holder(pid: Option<i32>) -> String {
    match pid {
        Some(pid) => format!("PostgreSQL backend pid {pid}, see pg_stat_activity"),
        None => "a session this role cannot see".to_owned(),
    }
}

/// At most one WARN line per this interval says a connection was lost;
/// the rest go to DEBUG.
const WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// A rate limit for WARN lines: `allow` is true at most once per
/// [`WARN_EVERY`].
#[derive(Debug)]
pub(crate) struct RateLimit(std::sync::Mutex<Option<std::time::Instant>>);

impl RateLimit {
    pub(crate) const fn new() -> Self {
        RateLimit(std::sync::Mutex::new(None))
    }

    /// Whether a WARN may be logged now (and if so, starts a new interval).
    pub(crate) fn allow(&self) -> bool {
        let mut last = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = std::time::Instant::now();
        if last.is_some_and(|at| now.duration_since(at) < WARN_EVERY) {
            return false;
        }
        *last = Some(now);
        true
    }
}

/// What the sink says during an outage: one WARN line when writes start
/// failing for a retryable reason (with the server's reason), one every
/// [`WARN_EVERY`] while they keep failing, and one when a write succeeds
/// again, with the outage's length. Failures in between go to DEBUG.
#[derive(Debug, Default)]
pub(crate) struct Outage(std::sync::Mutex<OutageState>);

#[derive(Debug, Default)]
struct OutageState {
    since: Option<std::time::Instant>,
    last_warn: Option<std::time::Instant>,
    failures: u64,
}

impl Outage {
    /// A write (or its connection) failed with `err`.
    pub(crate) fn failed(&self, target: &str, err: &PostgresError) {
        if !err.is_retryable() {
            return;
        }
        let now = std::time::Instant::now();
        let mut state = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state.failures += 1;
        let Some(since) = state.since else {
            state.since = Some(now);
            state.last_warn = Some(now);
            tracing::warn!(
                target = %target,
                reason = %err,
                "PostgreSQL unavailable; the batch is retried with backoff (within the \
                 sink's retry.max_elapsed) on a new connection"
            );
            return;
        };
        if state
            .last_warn
            .is_none_or(|at| now.duration_since(at) >= WARN_EVERY)
        {
            state.last_warn = Some(now);
            tracing::warn!(
                target = %target,
                reason = %err,
                failed_attempts = state.failures,
                "PostgreSQL still unavailable after {:.1} s; still retried with backoff",
                now.duration_since(since).as_secs_f64()
            );
        } else {
            tracing::debug!(target = %target, reason = %err, "PostgreSQL write failed; retried");
        }
    }

    /// A write succeeded.
    pub(crate) fn succeeded(&self, target: &str) {
        let mut state = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(since) = state.since.take() {
            tracing::warn!(
                target = %target,
                failed_attempts = state.failures,
                "PostgreSQL reachable again after {:.1} s; writes resumed",
                since.elapsed().as_secs_f64()
            );
            *state = OutageState::default();
        }
    }
}

/// Say that a connection ended with an error: WARN (rate-limited) with
/// the server's reason.
pub(crate) fn connection_lost(target: &str, error: &tokio_postgres::Error) {
    static LOST: RateLimit = RateLimit::new();
    let reason = describe(error);
    if LOST.allow() {
        tracing::warn!(
            target = %target,
            %reason,
            "PostgreSQL connection lost; writes are retried on a new connection with backoff"
        );
    } else {
        tracing::debug!(target = %target, %reason, "PostgreSQL connection lost");
    }
}

impl PostgresError {
    /// Whether another sink holds this sink's progress
    /// ([`PostgresError::InUse`]).
    #[must_use]
    pub fn is_in_use(&self) -> bool {
        matches!(self, PostgresError::InUse { .. })
    }

    /// Whether the same operation may succeed later (the server is down,
    /// restarting or overloaded).
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        match self {
            PostgresError::Connect { source, .. } => {
                // Wrong password or database, a certificate refused: no
                // point retrying.
                !crate::tls::is_tls_failure(source)
                    && !matches!(
                        source.code().map(SqlState::code).map(|c| &c[..2]),
                        Some("28" | "3D")
                    )
                    && classify(source) == Class::Retryable
            }
            PostgresError::ConnectTimeout { .. } => true,
            PostgresError::Query { source, .. } => classify(source) == Class::Retryable,
            PostgresError::Config { .. }
            | PostgresError::CorruptProgress { .. }
            | PostgresError::InUse { .. } => false,
        }
    }
}

/// The sink driver's view: retryable errors are retried (and halt the
/// pipeline once its retry policy gives up: a server that stays down is
/// not a bad record), errors of a row's data (SQLSTATE classes 21, 22, 23)
/// are the data's ([`SinkError::Data`]; the sink normally turns them into
/// per-row rejects first), everything else (class 42: a revoked privilege,
/// a dropped table; a wrong password) is an error of the environment
/// ([`SinkError::Permanent`]) and halts the pipeline.
impl From<PostgresError> for SinkError {
    fn from(err: PostgresError) -> Self {
        if err.is_retryable() {
            SinkError::retryable(err)
        } else if matches!(&err, PostgresError::Query { source, .. } if classify(source) == Class::Row)
        {
            SinkError::data(err)
        } else {
            SinkError::permanent(err)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_errors_are_permanent() {
        let err = PostgresError::Config {
            field: "table".into(),
            reason: "is empty".into(),
        };
        assert!(!err.is_retryable());
        let err = SinkError::from(err);
        assert!(matches!(err, SinkError::Permanent(_)));
        assert_eq!(err.kind(), etl_sink::FailureKind::Environment, "halts");
        let timeout = PostgresError::ConnectTimeout {
            target: "etl@127.0.0.1:1/db".into(),
            after: Duration::from_secs(1),
        };
        assert!(SinkError::from(timeout).is_retryable());
    }

    #[test]
    fn sqlstate_classes_say_whether_a_row_or_the_environment_is_at_fault() {
        // A revoked privilege, a dropped table or column: every row would
        // fail, so no row is at fault.
        for code in ["42501", "42P01", "42703", "3D000", "28P01"] {
            assert_eq!(classify_sqlstate(code), Class::Permanent, "{code}");
        }
        // A value the column refuses, a constraint: that row's fault.
        for code in ["22P02", "22003", "23505", "23502", "23514", "21000"] {
            assert_eq!(classify_sqlstate(code), Class::Row, "{code}");
        }
        // The server is away or busy: retried, then the environment's.
        for code in ["08006", "57P01", "53300", "40001", "55P03"] {
            assert_eq!(classify_sqlstate(code), Class::Retryable, "{code}");
        }
    }
}
