//! Which producer errors are worth retrying, and whose fault they are.
//!
//! librdkafka already retries transient failures inside the producer (up
//! to `message.timeout.ms`); an error that reaches a delivery report has
//! outlived those retries. It is still *retryable* for the pipeline when a
//! later attempt can succeed without anyone changing anything (a broker
//! was down, a leader moved, a queue was full): the sink driver backs off
//! and writes the batch again, and halts the pipeline once its retry
//! policy gives up (an unreachable cluster is not a bad record). It is the
//! *record's* fault when that message would fail wherever it went (too
//! large, malformed, a timestamp out of range): the record is rejected and
//! takes the dead-letter path. Anything else (not authorised, unknown
//! topic, a client that cannot be built) is an error of the *environment*:
//! every record would fail the same way, so the pipeline halts.

use rdkafka::error::KafkaError as ClientError;
use rdkafka::types::RDKafkaErrorCode as Code;

/// How a failed write should be treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// A later attempt may succeed unchanged (an error of the environment
    /// once retries are spent).
    Retryable,
    /// This message will fail wherever it goes: it is rejected and goes
    /// to the dead-letter path.
    Record,
    /// Every message would fail the same way: the pipeline halts.
    Environment,
}

/// Classify a producer error from a delivery report or a failed enqueue.
#[must_use]
pub fn classify(error: &ClientError) -> ErrorClass {
    match error {
        ClientError::Canceled => ErrorClass::Retryable,
        _ => error
            .rdkafka_error_code()
            .map_or(ErrorClass::Environment, classify_code),
    }
}

fn classify_code(code: Code) -> ErrorClass {
    match code {
        Code::MessageSizeTooLarge
        | Code::MessageBatchTooLarge
        | Code::InvalidMessageSize
        | Code::InvalidMessage
        | Code::InvalidRecord
        | Code::InvalidTimestamp
        | Code::InvalidDifferentRecord
        | Code::BadMessage
        | Code::KeySerialization
        | Code::ValueSerialization => ErrorClass::Record,
        Code::MessageTimedOut
        | Code::QueueFull
        | Code::BrokerTransportFailure
        | Code::AllBrokersDown
        | Code::Resolve
        | Code::OperationTimedOut
        | Code::TimedOutQueue
        | Code::Retry
        | Code::PurgeQueue
        | Code::PurgeInflight
        | Code::WaitCache
        | Code::NodeUpdate
        | Code::ISRInsufficient
        | Code::UnknownTopicOrPartition
        | Code::UnknownPartition
        | Code::LeaderNotAvailable
        | Code::NotLeaderForPartition
        | Code::RequestTimedOut
        | Code::BrokerNotAvailable
        | Code::ReplicaNotAvailable
        | Code::NetworkException
        | Code::NotEnoughReplicas
        | Code::NotEnoughReplicasAfterAppend
        | Code::NotController
        | Code::KafkaStorageError
        | Code::FencedLeaderEpoch
        | Code::UnknownLeaderEpoch
        | Code::OutOfOrderSequenceNumber
        | Code::UnknownProducerId
        | Code::CoordinatorLoadInProgress
        | Code::CoordinatorNotAvailable
        | Code::NotCoordinator => ErrorClass::Retryable,
        _ => ErrorClass::Environment,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_broker_trouble_is_retryable() {
        for code in [
            Code::MessageTimedOut,
            Code::QueueFull,
            Code::AllBrokersDown,
            Code::NotLeaderForPartition,
            Code::NotEnoughReplicas,
        ] {
            assert_eq!(
                classify(&ClientError::MessageProduction(code)),
                ErrorClass::Retryable,
                "{code:?}"
            );
        }
        assert_eq!(classify(&ClientError::Canceled), ErrorClass::Retryable);
    }

    #[test]
    fn bad_records_are_the_records_fault() {
        for code in [
            Code::MessageSizeTooLarge,
            Code::InvalidMessage,
            Code::InvalidRecord,
            Code::InvalidTimestamp,
        ] {
            assert_eq!(
                classify(&ClientError::MessageProduction(code)),
                ErrorClass::Record,
                "{code:?}"
            );
        }
    }

    #[test]
    fn authorisation_and_missing_topics_are_the_environments_fault() {
        for code in [
            Code::TopicAuthorizationFailed,
            Code::ClusterAuthorizationFailed,
            Code::UnknownTopic,
        ] {
            assert_eq!(
                classify(&ClientError::MessageProduction(code)),
                ErrorClass::Environment,
                "{code:?}"
            );
        }
        assert_eq!(
            classify(&ClientError::ClientCreation("bad".into())),
            ErrorClass::Environment
        );
    }
}
