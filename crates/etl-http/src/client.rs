//! The HTTP client: TLS through rustls (a custom CA, a client
//! certificate), HTTP/1.1 and HTTP/2, no redirects.

use std::path::{Path, PathBuf};

use crate::{HttpSinkConfig, HttpSinkError};

/// The client of the sink `name`; relative TLS paths are read from
/// `base_dir`.
pub(crate) fn build(
    name: &str,
    base_dir: &Path,
    config: &HttpSinkConfig,
) -> Result<reqwest::Client, HttpSinkError> {
    // reqwest takes rustls without a crypto provider of its own: the
    // process's (ring, as everywhere in this workspace), installed once.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tls_error = |what: &'static str, path: &Path, reason: String| HttpSinkError::Tls {
        sink: name.to_owned(),
        what,
        path: path.display().to_string(),
        reason,
    };
    let read = |what: &'static str, path: &PathBuf| {
        let path = base_dir.join(path);
        std::fs::read(&path)
            .map(|bytes| (path.clone(), bytes))
            .map_err(|e| tls_error(what, &path, e.to_string()))
    };
    let mut builder = reqwest::Client::builder()
        .timeout(config.timeout)
        // A redirect would send the body again elsewhere: the status is
        // reported instead (see `classify`).
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy();
    if config.http2_prior_knowledge {
        builder = builder.http2_prior_knowledge();
    }
    if let Some(tls) = &config.tls {
        if let Some(ca) = &tls.ca_file {
            let (path, pem) = read("CA file", ca)?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| tls_error("CA file", &path, e.to_string()))?;
            if certs.is_empty() {
                return Err(tls_error(
                    "CA file",
                    &path,
                    "it holds no PEM certificate".to_owned(),
                ));
            }
            builder = builder.tls_certs_only(certs);
        }
        match (&tls.client_cert_file, &tls.client_key_file) {
            (Some(cert), Some(key)) => {
                let (cert_path, mut pem) = read("client certificate", cert)?;
                let (key_path, key) = read("client key", key)?;
                pem.push(b'\n');
                pem.extend_from_slice(&key);
                let identity = reqwest::Identity::from_pem(&pem).map_err(|e| {
                    tls_error(
                        "client certificate",
                        &cert_path,
                        format!("with key {}: {e}", key_path.display()),
                    )
                })?;
                builder = builder.identity(identity);
            }
            (None, None) => {}
            _ => {
                return Err(HttpSinkError::Config {
                    sink: name.to_owned(),
                    reason: "tls: client_cert_file and client_key_file go together".to_owned(),
                });
            }
        }
    }
    builder.build().map_err(|e| HttpSinkError::Config {
        sink: name.to_owned(),
        reason: format!("cannot build the HTTP client: {e}"),
    })
}

/// What rustls said, if a request failed in the TLS handshake (an
/// unknown issuer, a name mismatch, a refused client certificate).
pub(crate) fn tls_failure(err: &reqwest::Error) -> Option<String> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = current {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls.to_string());
        }
        // An I/O error's `source` skips the error it wraps (here an I/O
        // error of the TLS stream wrapping rustls' own): step into it.
        current = match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    None
}
