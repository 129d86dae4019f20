//! Telling a broker that refuses the client's security settings from a
//! broker that cannot be reached.
//!
//! librdkafka treats a refused SASL login (a wrong user, password or
//! mechanism) and a failed TLS handshake (a CA that did not sign the
//! broker's certificate, a certificate for another name, a client
//! certificate the broker does not accept) like a broker that is down: it
//! reports the reason once (`RD_KAFKA_RESP_ERR__AUTHENTICATION`,
//! `RD_KAFKA_RESP_ERR__SSL`), then "all brokers down", and reconnects
//! forever, repeating the reason at most every 30 s. No retry fixes such
//! a setting, so the client gives up on it after [`REFUSALS_ALLOWED`]
//! reports in a row with no broker answering in between: a
//! [`KafkaError::Refused`], an error of the configuration, naming the
//! broker and the mechanism or the TLS problem, never a secret.

use crate::{KafkaError, KafkaProperties};

/// How many refusals in a row the client takes before it gives up. One:
/// the broker's answer (invalid credentials, an unverifiable certificate)
/// is already the verdict of a completed attempt, and librdkafka only
/// repeats it every 30 s while it keeps retrying in between, so waiting
/// for a second report would hold the run for half a minute to learn
/// nothing new.
pub(crate) const REFUSALS_ALLOWED: u32 = 1;

/// What a broker refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The SASL login, with this mechanism (`SCRAM-SHA-512`, `PLAIN`...).
    Login {
        /// `sasl.mechanism` as configured (librdkafka's default when
        /// unset).
        mechanism: String,
    },
    /// The TLS handshake.
    Tls,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Login { mechanism } => {
                write!(f, "refused the SASL login (mechanism {mechanism})")
            }
            Refusal::Tls => f.write_str("failed the TLS handshake"),
        }
    }
}

impl Refusal {
    /// The settings a user should look at.
    pub(crate) fn settings(&self) -> &'static str {
        match self {
            Refusal::Login { .. } => {
                "check sasl.username, sasl.password and sasl.mechanism under `properties`"
            }
            Refusal::Tls => {
                "check ssl.ca.location (or ssl.ca.pem), the broker's name in `brokers`, and \
                 ssl.certificate.location and ssl.key.location when the broker wants a client \
                 certificate, under `properties`"
            }
        }
    }
}

/// What a client needs to say a refusal: its settings, read once.
#[derive(Clone, Debug)]
pub(crate) struct Security {
    /// `consumer` or `producer`.
    client: &'static str,
    /// The SASL mechanism, when the client logs in with SASL.
    mechanism: Option<String>,
    /// The configured bootstrap servers, for a reason that names none.
    brokers: String,
    /// The client's properties, whose secret values are taken out of
    /// librdkafka's reason (it names none, but nothing relies on that).
    properties: KafkaProperties,
}

impl Security {
    pub(crate) fn new(client: &'static str, brokers: &str, properties: &KafkaProperties) -> Self {
        let protocol = properties
            .expose_value("security.protocol")
            .unwrap_or("plaintext")
            .to_ascii_lowercase();
        let mechanism = protocol.starts_with("sasl").then(|| {
            properties
                .expose_value("sasl.mechanism")
                .or_else(|| properties.expose_value("sasl.mechanisms"))
                // librdkafka's default.
                .unwrap_or("GSSAPI")
                .to_owned()
        });
        Security {
            client,
            mechanism,
            brokers: brokers.to_owned(),
            properties: properties.clone(),
        }
    }

    /// A client with no security settings.
    #[cfg(test)]
    pub(crate) fn none(client: &'static str) -> Self {
        Security::new(client, "", &KafkaProperties::default())
    }

    pub(crate) fn client(&self) -> &'static str {
        self.client
    }

    /// The refusal librdkafka reported with `code` and `reason`, if it is
    /// one.
    pub(crate) fn refusal(
        &self,
        code: rdkafka::types::RDKafkaErrorCode,
        reason: &str,
    ) -> Option<KafkaError> {
        use rdkafka::types::RDKafkaErrorCode as C;
        let refusal = match code {
            C::Authentication | C::SaslAuthenticationFailed => Refusal::Login {
                mechanism: self.mechanism.clone().unwrap_or_else(|| "none".to_owned()),
            },
            C::SSL => Refusal::Tls,
            // The broker's TLS stack refused the client's certificate (or
            // its absence) with a fatal alert; librdkafka sees the
            // connection close and calls it a transport failure.
            C::BrokerTransportFailure if is_certificate_alert(reason) => Refusal::Tls,
            _ => return None,
        };
        let (broker, reason) = split_broker(reason);
        Some(KafkaError::Refused {
            client: self.client,
            broker: broker.map_or_else(|| self.brokers.clone(), str::to_owned),
            refusal,
            reason: self.properties.redact(&without_timing(reason)),
        })
    }
}

/// Whether `reason` is a fatal TLS alert by which a broker refuses the
/// client's certificate: OpenSSL's `SSL routines::tlsv13 alert
/// certificate required` and its kin (RFC 8446, section 6.2); or the
/// client's own check of the broker's certificate failed (`SSL
/// routines::certificate verify failed`), which librdkafka may report as
/// a transport failure before its SSL error. A connection merely closed
/// during the handshake is no such alert.
fn is_certificate_alert(reason: &str) -> bool {
    const ALERTS: &[&str] = &[
        "certificate verify failed",
        "alert certificate required",
        "alert bad certificate",
        "alert unknown ca",
        "alert certificate unknown",
        "alert certificate expired",
        "alert certificate revoked",
        "alert unsupported certificate",
        "alert access denied",
    ];
    reason.contains("SSL routines") && ALERTS.iter().any(|a| reason.contains(a))
}

/// librdkafka's reason is `proto://host:port/id: text`; the broker's
/// `host:port`, if named, and the text.
fn split_broker(reason: &str) -> (Option<&str>, &str) {
    let Some((name, text)) = reason.split_once(": ") else {
        return (None, reason);
    };
    let Some((_, address)) = name.split_once("://") else {
        return (None, reason);
    };
    let address = address.rsplit_once('/').map_or(address, |(a, _)| a);
    (Some(address), text)
}

/// The reason without librdkafka's `(after 12ms in state SSL_HANDSHAKE)`.
fn without_timing(reason: &str) -> String {
    match reason.rfind(" (after ") {
        Some(i) if reason.ends_with(')') => reason[..i].to_owned(),
        _ => reason.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::types::RDKafkaErrorCode as C;

    use super::*;

    fn properties(items: &[(&str, &str)]) -> KafkaProperties {
        items
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_refused_login_names_the_broker_and_the_mechanism_but_no_password() {
        let security = Security::new(
            "consumer",
            "b:1",
            &properties(&[
                ("security.protocol", "SASL_SSL"),
                ("sasl.mechanism", "SCRAM-SHA-512"),
                ("sasl.password", "Zq9Sec-ret"),
            ]),
        );
        let e = security
            .refusal(
                C::Authentication,
                "sasl_ssl://127.0.0.1:4242/bootstrap: SASL authentication error: Authentication \
                 failed Zq9Sec-ret (after 3ms in state AUTH_REQ)",
            )
            .expect("a refusal");
        let shown = e.to_string();
        assert!(shown.contains("127.0.0.1:4242"), "{shown}");
        assert!(shown.contains("SCRAM-SHA-512"), "{shown}");
        assert!(shown.contains("Authentication failed"), "{shown}");
        assert!(!shown.contains("Zq9Sec-ret"), "{shown}");
        assert!(!shown.contains("after 3ms"), "{shown}");
        assert!(e.is_configuration());
    }

    #[test]
    fn only_logins_and_handshakes_are_refusals() {
        let security = Security::none("producer");
        let tls = security
            .refusal(
                C::SSL,
                "ssl://h:9/1: SSL handshake failed: certificate verify failed",
            )
            .expect("a refusal");
        assert!(tls.to_string().contains("h:9"), "{tls}");
        assert!(tls.to_string().contains("TLS handshake"), "{tls}");
        for code in [C::AllBrokersDown, C::BrokerTransportFailure, C::Resolve] {
            assert!(security.refusal(code, "down").is_none(), "{code:?}");
        }
        let alert = "ssl://h:9/bootstrap: Receive failed: error:0A00045C:SSL routines::tlsv13 \
                     alert certificate required: SSL alert number 116";
        assert!(
            security
                .refusal(C::BrokerTransportFailure, alert)
                .is_some_and(|e| e.to_string().contains("failed the TLS handshake")),
            "a refused client certificate"
        );
        // The client's own check of the broker's certificate, reported as
        // a transport failure before (or instead of) the SSL error.
        let unverified = "sasl_ssl://127.0.0.1:9/bootstrap: error:0A000086:SSL \
                          routines::certificate verify failed (after 3ms in state SSL_HANDSHAKE)";
        assert!(
            security
                .refusal(C::BrokerTransportFailure, unverified)
                .is_some_and(|e| e.to_string().contains("failed the TLS handshake")),
            "a broker certificate the client cannot verify"
        );
        let closed = "ssl://h:9/bootstrap: SSL handshake failed: Disconnected: connecting to a \
                      PLAINTEXT broker listener?";
        assert!(
            security
                .refusal(C::BrokerTransportFailure, closed)
                .is_none()
        );
    }
}
