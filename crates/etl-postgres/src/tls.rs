//! TLS to the server: libpq's `sslmode` over rustls (ring provider, no
//! system OpenSSL), through tokio-postgres-rustls.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::PostgresError;

/// libpq's `sslmode`: whether and how the connection is encrypted and the
/// server checked. `allow` is not supported (use `prefer`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SslMode {
    /// Plaintext only.
    Disable,
    /// TLS if the server offers it, else plaintext (logged at WARN); the
    /// certificate is not checked. libpq's default.
    #[default]
    Prefer,
    /// TLS or no connection. The certificate is checked against
    /// `sslrootcert` when one is given (as libpq does), else not at all.
    Require,
    /// TLS, and the server's certificate must chain to `sslrootcert`.
    VerifyCa,
    /// As `verify-ca`, and the certificate must name the host connected to.
    VerifyFull,
}

impl SslMode {
    /// The libpq name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// Parse a libpq name.
    ///
    /// # Errors
    ///
    /// [`SslModeError`], whose message names the accepted values.
    pub fn parse(text: &str) -> Result<SslMode, SslModeError> {
        Ok(match text {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            "allow" => return Err(SslModeError::Allow),
            other => return Err(SslModeError::Unknown(other.to_owned())),
        })
    }
}

/// Why a text is not an [`SslMode`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SslModeError {
    /// libpq's `allow` (plain text first, TLS when refused), which this
    /// client does not offer.
    #[error("`allow` is not supported; use `prefer` or `disable`")]
    Allow,
    /// No libpq mode of that name.
    #[error("`{0}` is not an sslmode (disable, prefer, require, verify-ca, verify-full)")]
    Unknown(String),
}

/// The TLS settings of a connection, merged from the URL and the config.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TlsSettings {
    pub(crate) mode: SslMode,
    pub(crate) rootcert: Option<PathBuf>,
    pub(crate) cert: Option<PathBuf>,
    pub(crate) key: Option<PathBuf>,
}

fn config_error(field: &str, reason: String) -> PostgresError {
    PostgresError::Config {
        field: field.to_owned(),
        reason,
    }
}

/// The rustls connector for `settings`, checking the files now; `None` for
/// `disable`.
pub(crate) fn connector(
    settings: &TlsSettings,
) -> Result<Option<MakeRustlsConnect>, PostgresError> {
    if settings.mode == SslMode::Disable {
        return Ok(None);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| config_error("sslmode", e.to_string()))?;
    let roots = match &settings.rootcert {
        Some(path) => Some(Arc::new(root_store(path)?)),
        None => None,
    };
    let algorithms = provider.signature_verification_algorithms;
    let verifier: Arc<dyn ServerCertVerifier> = match (settings.mode, roots) {
        (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
            return Err(config_error(
                "sslrootcert",
                format!(
                    "sslmode {} checks the server's certificate and needs sslrootcert, \
                     the CA certificate(s) to check it against",
                    settings.mode.as_str()
                ),
            ));
        }
        (SslMode::VerifyFull, Some(roots)) => webpki(roots, &provider)?,
        // libpq: `require` with a root certificate checks the chain.
        (SslMode::VerifyCa | SslMode::Require, Some(roots)) => Arc::new(AnyName {
            inner: webpki(roots, &provider)?,
        }),
        (_, _) => Arc::new(Unchecked { algorithms }),
    };
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let config = match (&settings.cert, &settings.key) {
        (Some(cert), Some(key)) => {
            let chain = certificates(cert, "sslcert")?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                config_error(
                    "sslkey",
                    format!("cannot read a PEM private key from {}: {e}", key.display()),
                )
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| config_error("sslkey", format!("does not fit sslcert: {e}")))?
        }
        (None, None) => builder.with_no_client_auth(),
        (Some(_), None) => {
            return Err(config_error(
                "sslkey",
                "sslcert is set but sslkey is not".into(),
            ));
        }
        (None, Some(_)) => {
            return Err(config_error(
                "sslcert",
                "sslkey is set but sslcert is not".into(),
            ));
        }
    };
    Ok(Some(MakeRustlsConnect::new(config)))
}

fn webpki(
    roots: Arc<RootCertStore>,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>, PostgresError> {
    WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
        .build()
        .map_err(|e| config_error("sslrootcert", e.to_string()))
}

fn certificates(path: &Path, field: &str) -> Result<Vec<CertificateDer<'static>>, PostgresError> {
    let unreadable = |e: &dyn std::fmt::Display| {
        config_error(field, format!("cannot read {}: {e}", path.display()))
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| unreadable(&e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| unreadable(&e))?;
    if certs.is_empty() {
        return Err(config_error(
            field,
            format!("{} holds no PEM certificate", path.display()),
        ));
    }
    Ok(certs)
}

fn root_store(path: &Path) -> Result<RootCertStore, PostgresError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(path, "sslrootcert")? {
        roots.add(cert).map_err(|e| {
            config_error(
                "sslrootcert",
                format!("{} holds a certificate rustls refuses: {e}", path.display()),
            )
        })?;
    }
    Ok(roots)
}

/// `verify-ca`: the chain must be valid, the name may be any.
#[derive(Debug)]
struct AnyName {
    inner: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // The name is checked after the chain: a name error means the
        // chain was good.
        match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// `prefer` and `require` without a root certificate: encrypted, but the
/// certificate is not checked (the handshake's signatures still are).
#[derive(Debug)]
struct Unchecked {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// A connector that records whether the TLS handshake ran (tokio-postgres
/// starts it only when the server accepted TLS), so a `prefer` connection
/// that fell back to plaintext can say so.
#[derive(Clone)]
pub(crate) struct Tracked {
    inner: MakeRustlsConnect,
    pub(crate) used: Arc<AtomicBool>,
}

impl std::fmt::Debug for Tracked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracked")
            .field("used", &self.used)
            .finish_non_exhaustive()
    }
}

impl Tracked {
    pub(crate) fn new(inner: MakeRustlsConnect) -> Tracked {
        Tracked {
            inner,
            used: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The rustls connector it wraps.
    pub(crate) fn inner(&self) -> MakeRustlsConnect {
        self.inner.clone()
    }

    /// The same TLS configuration with a flag of its own (one per
    /// connection attempt).
    pub(crate) fn new_sharing(other: &Tracked) -> Tracked {
        Tracked::new(other.inner.clone())
    }
}

impl<S> MakeTlsConnect<S> for Tracked
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = <MakeRustlsConnect as MakeTlsConnect<S>>::Stream;
    type TlsConnect = TrackedConnect<<MakeRustlsConnect as MakeTlsConnect<S>>::TlsConnect>;
    type Error = <MakeRustlsConnect as MakeTlsConnect<S>>::Error;

    fn make_tls_connect(&mut self, hostname: &str) -> Result<Self::TlsConnect, Self::Error> {
        Ok(TrackedConnect {
            inner: MakeTlsConnect::<S>::make_tls_connect(&mut self.inner, hostname)?,
            used: self.used.clone(),
        })
    }
}

/// See [`Tracked`].
pub(crate) struct TrackedConnect<T> {
    inner: T,
    used: Arc<AtomicBool>,
}

impl<S, T: TlsConnect<S>> TlsConnect<S> for TrackedConnect<T> {
    type Stream = T::Stream;
    type Error = T::Error;
    type Future = T::Future;

    fn connect(self, stream: S) -> Self::Future {
        self.used.store(true, Ordering::Relaxed);
        self.inner.connect(stream)
    }
}

/// Whether `err` (or its cause) is a TLS failure retrying cannot fix: a
/// certificate refused, a handshake refused.
pub(crate) fn is_tls_failure(err: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(err), |e| e.source()).any(|e| {
        // tokio-rustls reports a refused handshake as an I/O error holding
        // the rustls error (which `source` skips).
        let inside_io = e
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
            .is_some_and(|inner| inner.is::<rustls::Error>());
        inside_io
            || e.is::<rustls::Error>()
            || e.to_string().contains("server does not support TLS")
    })
}

#[cfg(test)]
mod sslmode_tests {
    use super::*;

    #[test]
    fn an_sslmode_is_read_by_its_libpq_name_and_allow_is_refused_apart() {
        for mode in [
            SslMode::Disable,
            SslMode::Prefer,
            SslMode::Require,
            SslMode::VerifyCa,
            SslMode::VerifyFull,
        ] {
            assert_eq!(SslMode::parse(mode.as_str()), Ok(mode));
        }
        assert_eq!(SslMode::parse("allow"), Err(SslModeError::Allow));
        let e = SslMode::parse("verify").unwrap_err();
        assert_eq!(e, SslModeError::Unknown("verify".to_owned()));
        assert!(e.to_string().contains("verify-full"), "{e}");
    }
}
