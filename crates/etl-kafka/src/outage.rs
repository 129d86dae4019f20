//! Saying that the brokers are unreachable without flooding the log.
//!
//! While no broker answers, librdkafka reports a transport failure (and
//! "all brokers down") for every reconnection attempt, tens of times a
//! second. [`Outage`] turns them into one WARN when the outage starts, one
//! at most every [`REPEAT`] while it lasts (with how long and how many
//! failures), and one when a broker answers again. librdkafka's own log
//! lines about the failed connections go to DEBUG.
//!
//! A broker that refuses the client's credentials or TLS settings is no
//! outage (see [`crate::refusal`]): the "all brokers down" that follows a
//! refusal is not reported as one, and once the client gives up on its
//! settings, [`Outage::refused`] says why.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError as ClientError, RDKafkaErrorCode};
use tokio::sync::watch;

use crate::KafkaError;
use crate::refusal::{REFUSALS_ALLOWED, Security};

/// How often a lasting outage is reported again.
pub(crate) const REPEAT: Duration = Duration::from_secs(10);

/// What is known of the brokers' reachability, for one client.
#[derive(Debug)]
pub(crate) struct Outage {
    /// `consumer` or `producer`, in the messages.
    client: &'static str,
    /// Whether an outage is going on: the one check a message makes.
    down: AtomicBool,
    state: Mutex<State>,
    /// Refusals of the client's settings since a broker last answered.
    refusals: AtomicU32,
    /// What a refusal of the client's settings names.
    security: Security,
    /// The refusal the client gave up on, once it did: set once, never
    /// cleared (the client is not used again).
    refused: watch::Sender<Option<KafkaError>>,
}

#[derive(Debug, Default)]
struct State {
    /// When the current outage started, if there is one.
    since: Option<Instant>,
    /// When it was last reported.
    reported: Option<Instant>,
    /// Failures seen in the current outage.
    failures: u64,
}

/// What [`Outage::failure`] and [`Outage::recovered`] decided to say.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Said {
    Nothing,
    Started,
    Lasting { after: Duration, failures: u64 },
    Recovered { after: Duration, failures: u64 },
}

impl Outage {
    pub(crate) fn new(security: Security) -> Self {
        Outage {
            client: security.client(),
            down: AtomicBool::new(false),
            state: Mutex::new(State::default()),
            refusals: AtomicU32::new(0),
            security,
            refused: watch::Sender::new(None),
        }
    }

    /// The refusal the client gave up on, if it did.
    pub(crate) fn refused(&self) -> Option<KafkaError> {
        self.refused.borrow().as_ref().and_then(KafkaError::again)
    }

    /// Wait until the client gives up on a refusal of its settings.
    pub(crate) async fn wait_refused(&self) -> KafkaError {
        let mut changes = self.refused.subscribe();
        loop {
            if let Some(e) = self.refused() {
                return e;
            }
            if changes.changed().await.is_err() {
                // Never: `self` holds the sender.
                std::future::pending::<()>().await;
            }
        }
    }

    /// A refusal of the client's settings (`error`, with librdkafka's
    /// `reason`): the error to end the client with once there were
    /// [`REFUSALS_ALLOWED`] in a row, the first time only. The refusals
    /// before that are logged at DEBUG: the error itself is what the user
    /// sees, once, where the client's failure ends the run.
    fn refusal(&self, error: KafkaError) -> Option<KafkaError> {
        let refusals = self
            .refusals
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1);
        if refusals < REFUSALS_ALLOWED || self.refused.borrow().is_some() {
            tracing::debug!(client = self.client, %error, refusals, "a broker refused the settings");
            return None;
        }
        let again = error.again();
        self.refused.send_replace(Some(error));
        again
    }

    /// Whether the brokers' last word was a refusal of the settings: the
    /// "all brokers down" that follows one is its consequence, not an
    /// outage.
    fn refusing(&self) -> bool {
        self.refusals.load(Ordering::Acquire) > 0
    }

    /// A failure to reach the brokers, from the error callback.
    fn transport_failure(&self, error: &ClientError, reason: &str) {
        let all_down = matches!(
            error,
            ClientError::Global(RDKafkaErrorCode::AllBrokersDown)
                | ClientError::MessageConsumption(RDKafkaErrorCode::AllBrokersDown)
        );
        if all_down && self.refusing() {
            tracing::debug!(client = self.client, %reason, "librdkafka: brokers down after a refusal");
            return;
        }
        if !all_down {
            // The broker cannot be reached at all now: an outage, whatever
            // it said before.
            self.refusals.store(0, Ordering::Release);
        }
        self.failure(reason);
    }

    /// A transport failure at `now`, for `reason`.
    pub(crate) fn failure_at(&self, now: Instant, reason: &str) -> Said {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.failures += 1;
        let said = match s.since {
            None => {
                s.since = Some(now);
                s.reported = Some(now);
                self.down.store(true, Ordering::Release);
                Said::Started
            }
            Some(_) if s.reported.is_some_and(|r| now.duration_since(r) < REPEAT) => Said::Nothing,
            Some(since) => {
                s.reported = Some(now);
                Said::Lasting {
                    after: now.duration_since(since),
                    failures: s.failures,
                }
            }
        };
        drop(s);
        match &said {
            Said::Started => tracing::warn!(
                client = self.client,
                %reason,
                "Kafka brokers unreachable; the {} keeps retrying",
                self.client
            ),
            Said::Lasting { after, failures } => tracing::warn!(
                client = self.client,
                %reason,
                failures,
                "Kafka brokers still unreachable after {} s",
                after.as_secs()
            ),
            Said::Nothing | Said::Recovered { .. } => {}
        }
        said
    }

    /// A transport failure now.
    pub(crate) fn failure(&self, reason: &str) {
        self.failure_at(Instant::now(), reason);
    }

    /// A broker answered at `now` (a message, an assignment, a delivery).
    pub(crate) fn recovered_at(&self, now: Instant) -> Said {
        self.refusals.store(0, Ordering::Release);
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(since) = s.since.take() else {
            return Said::Nothing;
        };
        self.down.store(false, Ordering::Release);
        let failures = std::mem::take(&mut s.failures);
        s.reported = None;
        drop(s);
        let after = now.duration_since(since);
        tracing::warn!(
            client = self.client,
            failures,
            "Kafka brokers reachable again after {} s",
            after.as_secs()
        );
        Said::Recovered { after, failures }
    }

    /// A broker answered now: an assignment, a commit, a metadata answer,
    /// a delivery report. (Not a message read: librdkafka hands out what
    /// it fetched before the brokers went away for a while after.) Two
    /// atomic loads when there is neither an outage nor a refusal.
    pub(crate) fn recovered(&self) {
        if self.down.load(Ordering::Acquire) || self.refusing() {
            self.recovered_at(Instant::now());
        }
    }

    /// librdkafka's error callback: transport failures feed the outage,
    /// refusals of the client's settings count towards giving up on them
    /// (the error to end the client with, once), anything else is logged
    /// as librdkafka's default does.
    pub(crate) fn client_error(&self, error: &ClientError, reason: &str) -> Option<KafkaError> {
        if let Some(refused) = refusal_code(error).and_then(|c| self.security.refusal(c, reason)) {
            return self.refusal(refused);
        }
        if matches!(error, ClientError::Global(RDKafkaErrorCode::BrokerDestroy)) {
            // The client is closing (the run ends): nothing went wrong.
            tracing::debug!(client = self.client, %reason, "librdkafka: broker handle destroyed");
        } else if is_transport(error) {
            self.transport_failure(error, reason);
        } else if is_unknown_topic(error) {
            // A broker answered that.
            self.recovered();
            tracing::warn!(
                client = self.client,
                %reason,
                "a topic does not exist (yet); the {} uses it once it is created",
                self.client
            );
        } else {
            tracing::error!(client = self.client, %error, %reason, "librdkafka error");
        }
        None
    }

    /// librdkafka's log callback: lines about failed connections go to
    /// DEBUG (the outage reports them), the rest at their level.
    pub(crate) fn client_log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        let connection = matches!(fac, "FAIL" | "BROKERFAIL" | "CONNECT" | "DESTROY")
            || message.contains("Connection refused")
            || message.contains("brokers are down");
        match level {
            _ if connection => tracing::debug!(client = self.client, fac, "librdkafka: {message}"),
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(client = self.client, fac, "librdkafka: {message}");
            }
            RDKafkaLogLevel::Warning => {
                tracing::warn!(client = self.client, fac, "librdkafka: {message}");
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(client = self.client, fac, "librdkafka: {message}");
            }
            RDKafkaLogLevel::Debug => {
                tracing::debug!(client = self.client, fac, "librdkafka: {message}");
            }
        }
    }
}

/// A topic that does not exist (reported by the error callback once per
/// metadata refresh).
pub(crate) fn is_unknown_topic(error: &ClientError) -> bool {
    matches!(
        error,
        ClientError::Global(RDKafkaErrorCode::UnknownTopicOrPartition)
            | ClientError::MessageConsumption(RDKafkaErrorCode::UnknownTopicOrPartition)
    )
}

/// The code of an error that may be a refusal of the client's settings
/// (see [`Security::refusal`]).
pub(crate) fn refusal_code(error: &ClientError) -> Option<RDKafkaErrorCode> {
    match error {
        ClientError::Global(code) | ClientError::MessageConsumption(code) => Some(*code),
        _ => None,
    }
}

/// Whether `error` is a refusal of the client's settings (reported, with
/// its reason, by the error callback too).
pub(crate) fn is_refusal(error: &ClientError) -> bool {
    use RDKafkaErrorCode as C;
    refusal_code(error)
        .is_some_and(|c| matches!(c, C::Authentication | C::SaslAuthenticationFailed | C::SSL))
}

/// A failure to reach the brokers, which retrying may end.
pub(crate) fn is_transport(error: &ClientError) -> bool {
    use RDKafkaErrorCode as C;
    let code = match error {
        ClientError::Global(code)
        | ClientError::MessageConsumption(code)
        | ClientError::MetadataFetch(code) => *code,
        _ => return false,
    };
    matches!(
        code,
        C::BrokerTransportFailure
            | C::AllBrokersDown
            | C::Resolve
            | C::BrokerNotAvailable
            | C::NetworkException
            | C::RequestTimedOut
            | C::OperationTimedOut
    )
}

/// A client context that only reports outages, shared with the code that
/// sees the brokers answer (for clients with no other use for a context).
#[derive(Clone, Debug)]
pub(crate) struct OutageContext(pub(crate) std::sync::Arc<Outage>);

impl ClientContext for OutageContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.0.client_log(level, fac, log_message);
    }

    fn error(&self, error: ClientError, reason: &str) {
        // A refusal the client gives up on is kept in the outage, where
        // the sink's writes look for it.
        let _ = self.0.client_error(&error, reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_is_said_once_then_every_ten_seconds_then_when_it_ends() {
        let outage = Outage::new(Security::none("consumer"));
        let t0 = Instant::now();
        assert_eq!(outage.failure_at(t0, "down"), Said::Started);
        for ms in (50..10_000).step_by(50) {
            assert_eq!(
                outage.failure_at(t0 + Duration::from_millis(ms), "down"),
                Said::Nothing,
                "{ms} ms in"
            );
        }
        assert_eq!(
            outage.failure_at(t0 + Duration::from_secs(10), "down"),
            Said::Lasting {
                after: Duration::from_secs(10),
                failures: 201
            }
        );
        assert_eq!(
            outage.failure_at(t0 + Duration::from_secs(11), "down"),
            Said::Nothing
        );
        assert_eq!(
            outage.recovered_at(t0 + Duration::from_secs(12)),
            Said::Recovered {
                after: Duration::from_secs(12),
                failures: 202
            }
        );
        assert_eq!(
            outage.recovered_at(t0 + Duration::from_secs(13)),
            Said::Nothing,
            "said once"
        );
        // A new outage starts over.
        assert_eq!(
            outage.failure_at(t0 + Duration::from_secs(20), "down"),
            Said::Started
        );
    }

    #[test]
    fn a_refusal_ends_the_client_once_and_the_brokers_down_after_it_is_no_outage() {
        let outage = Outage::new(Security::none("consumer"));
        let refused = outage.client_error(
            &ClientError::Global(RDKafkaErrorCode::Authentication),
            "sasl_ssl://b:9/bootstrap: SASL authentication error: Authentication failed",
        );
        assert!(
            matches!(&refused, Some(KafkaError::Refused { broker, .. }) if broker == "b:9"),
            "{refused:?}"
        );
        assert!(outage.refused().is_some(), "kept for the sink's writes");
        let all_down = ClientError::Global(RDKafkaErrorCode::AllBrokersDown);
        assert!(
            outage
                .client_error(&all_down, "1/1 brokers are down")
                .is_none()
        );
        assert!(
            !outage.down.load(Ordering::Acquire),
            "no outage after a refusal"
        );
        assert!(
            outage
                .client_error(
                    &ClientError::Global(RDKafkaErrorCode::Authentication),
                    "again"
                )
                .is_none(),
            "said once"
        );
        // A broker that cannot be reached at all is an outage again.
        let refused_connection = ClientError::Global(RDKafkaErrorCode::BrokerTransportFailure);
        outage.client_error(&refused_connection, "Connection refused");
        assert!(outage.down.load(Ordering::Acquire));
    }

    #[test]
    fn only_failures_to_reach_the_brokers_count_as_an_outage() {
        assert!(is_transport(&ClientError::Global(
            RDKafkaErrorCode::AllBrokersDown
        )));
        assert!(is_transport(&ClientError::MessageConsumption(
            RDKafkaErrorCode::BrokerTransportFailure
        )));
        assert!(!is_transport(&ClientError::MessageConsumption(
            RDKafkaErrorCode::UnknownTopicOrPartition
        )));
        assert!(!is_transport(&ClientError::Global(
            RDKafkaErrorCode::SaslAuthenticationFailed
        )));
    }
}
