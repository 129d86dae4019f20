//! Which producer errors are worth retrying.
//!
//! librdkafka already retries transient failures inside the producer (up
//! to `message.timeout.ms`); an error that reaches a delivery report has
//! outlived those retries. It is still *retryable* for the pipeline when a
//! later attempt can succeed without anyone changing anything (a broker
//! was down, a leader moved, a queue was full): the sink driver backs off
//! and writes the batch again. It is *permanent* when the same records
//! will fail the same way (too large, not authorised, invalid): the batch
//! goes to the dead-letter path or fails its partition, by policy.

use rdkafka::error::KafkaError as ClientError;
use rdkafka::types::RDKafkaErrorCode as Code;

/// How a failed write should be treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// A later attempt may succeed unchanged.
    Retryable,
    /// The same records will fail the same way.
    Permanent,
}

/// Classify a producer error from a delivery report or a failed enqueue.
#[must_use]
pub fn classify(error: &ClientError) -> ErrorClass {
    match error {
        ClientError::Canceled => ErrorClass::Retryable,
        _ => error
            .rdkafka_error_code()
            .map_or(ErrorClass::Permanent, classify_code),
    }
}

fn classify_code(code: Code) -> ErrorClass {
    match code {
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
        _ => ErrorClass::Permanent,
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
    fn bad_records_and_authorisation_are_permanent() {
        for code in [
            Code::MessageSizeTooLarge,
            Code::InvalidMessage,
            Code::TopicAuthorizationFailed,
            Code::UnknownTopic,
            Code::InvalidRecord,
        ] {
            assert_eq!(
                classify(&ClientError::MessageProduction(code)),
                ErrorClass::Permanent,
                "{code:?}"
            );
        }
        assert_eq!(
            classify(&ClientError::ClientCreation("bad".into())),
            ErrorClass::Permanent
        );
    }
}
