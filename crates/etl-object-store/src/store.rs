//! The object store a configuration names, with its credentials and its
//! request retries.

use std::sync::Arc;

use object_store::aws::AmazonS3Builder;
use object_store::aws::AmazonS3ConfigKey;
use object_store::azure::AzureConfigKey;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::gcp::GoogleConfigKey;
use object_store::local::LocalFileSystem;
use object_store::{BackoffConfig, ClientConfigKey, ObjectStore, RetryConfig};
use secrecy::ExposeSecret;

use crate::{ObjectStoreSinkError, RequestConfig, StoreConfig};

/// Build the store `config` names. Credentials the table leaves out come
/// from the provider's environment (`from_env`) and, failing that, its
/// usual providers (instance metadata, web identity, a key file); so do
/// the client's options the table does not set (a proxy in
/// `AWS_PROXY_URL`, `AZURE_PROXY_URL` or `GOOGLE_PROXY_URL`, ...): the
/// table's own are set one by one over the environment's, never in place
/// of them all.
pub(crate) fn build_store(
    config: &StoreConfig,
    requests: &RequestConfig,
) -> Result<Arc<dyn ObjectStore>, ObjectStoreSinkError> {
    install_crypto_provider();
    let location = format!("{}://{}", config.scheme(), config.bucket());
    let failed = |source| ObjectStoreSinkError::Store {
        location: location.clone(),
        source,
    };
    let retry = RetryConfig {
        backoff: BackoffConfig {
            init_backoff: requests.initial_backoff,
            max_backoff: requests.max_backoff,
            base: 2.0,
        },
        max_retries: requests.max_retries,
        retry_timeout: requests.retry_timeout,
    };
    // As object_store reads a duration from its environment, exactly.
    let timeout = format!("{}ns", requests.timeout.as_nanos());
    Ok(match config {
        StoreConfig::S3 {
            bucket,
            region,
            endpoint,
            path_style,
            allow_http,
            access_key_id,
            secret_access_key,
            session_token,
        } => {
            let mut b = AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .with_retry(retry)
                .with_config(AmazonS3ConfigKey::Client(ClientConfigKey::Timeout), timeout);
            if let Some(allow) = allow_http_for(*allow_http, endpoint.as_deref()) {
                b = b.with_allow_http(allow);
            }
            if let Some(region) = region {
                b = b.with_region(region);
            }
            if let Some(endpoint) = endpoint {
                b = b.with_endpoint(endpoint);
            }
            b = b.with_virtual_hosted_style_request(!path_style.unwrap_or(endpoint.is_some()));
            if let Some(key) = access_key_id {
                b = b.with_access_key_id(key.expose_secret());
            }
            if let Some(secret) = secret_access_key {
                b = b.with_secret_access_key(secret.expose_secret());
            }
            if let Some(token) = session_token {
                b = b.with_token(token.expose_secret());
            }
            Arc::new(b.build().map_err(failed)?)
        }
        StoreConfig::Gcs {
            bucket,
            service_account_path,
            service_account_key,
        } => {
            let mut b = GoogleCloudStorageBuilder::from_env()
                .with_bucket_name(bucket)
                .with_retry(retry)
                .with_config(GoogleConfigKey::Client(ClientConfigKey::Timeout), timeout);
            // Unlike the others, GCS's builder allows plain HTTP by
            // default: HTTPS only, unless the environment says otherwise.
            if std::env::var_os("GOOGLE_ALLOW_HTTP").is_none() {
                b = b.with_config(GoogleConfigKey::Client(ClientConfigKey::AllowHttp), "false");
            }
            if let Some(path) = service_account_path {
                b = b.with_service_account_path(path);
            }
            if let Some(key) = service_account_key {
                b = b.with_service_account_key(key.expose_secret());
            }
            Arc::new(b.build().map_err(failed)?)
        }
        StoreConfig::Azure {
            account,
            container,
            endpoint,
            allow_http,
            access_key,
        } => {
            let mut b = MicrosoftAzureBuilder::from_env()
                .with_account(account)
                .with_container_name(container)
                .with_retry(retry)
                .with_config(AzureConfigKey::Client(ClientConfigKey::Timeout), timeout);
            if let Some(allow) = allow_http_for(*allow_http, endpoint.as_deref()) {
                b = b.with_allow_http(allow);
            }
            if let Some(endpoint) = endpoint {
                b = b.with_endpoint(endpoint.clone());
            }
            if let Some(key) = access_key {
                b = b.with_access_key(key.expose_secret());
            }
            Arc::new(b.build().map_err(failed)?)
        }
        StoreConfig::Local { path } => {
            std::fs::create_dir_all(path).map_err(|e| {
                failed(object_store::Error::Generic {
                    store: "LocalFileSystem",
                    source: Box::new(e),
                })
            })?;
            remove_partial_writes(std::path::Path::new(path)).map_err(|e| {
                failed(object_store::Error::Generic {
                    store: "LocalFileSystem",
                    source: Box::new(e),
                })
            })?;
            // Every object and the folders above it fsynced before a
            // write returns: durable means an fsync covered it.
            Arc::new(
                LocalFileSystem::new_with_prefix(path)
                    .map_err(failed)?
                    .with_fsync(true),
            )
        }
    })
}

/// Whether plain HTTP is allowed, if the table says: as configured, else
/// for an `http://` endpoint; otherwise as the environment says
/// (`AWS_ALLOW_HTTP`, ...), by default not.
fn allow_http_for(configured: Option<bool>, endpoint: Option<&str>) -> Option<bool> {
    configured.or_else(|| {
        endpoint
            .is_some_and(|e| e.starts_with("http://"))
            .then_some(true)
    })
}

/// Remove, under `root`, the files a local write cut short left: the
/// store writes an object to `KEY#N` and renames it to `KEY` once
/// complete, so a writer killed in between leaves `KEY#N`. The store's
/// own listing skips those files, but a reader of the folder (pyarrow,
/// Spark) would take one for an object, a torn one. One writer per
/// folder: nothing else writes there while the sink opens. Symbolic
/// links are not followed.
fn remove_partial_writes(root: &std::path::Path) -> std::io::Result<()> {
    let mut folders = vec![root.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                folders.push(entry.path());
            } else if kind.is_file() && is_partial_write(&entry.file_name().to_string_lossy()) {
                let path = entry.path();
                std::fs::remove_file(&path).map_err(|e| {
                    std::io::Error::new(e.kind(), format!("cannot remove {}: {e}", path.display()))
                })?;
                tracing::info!(path = %path.display(), "removed the partial write of a stopped writer");
            }
        }
    }
    Ok(())
}

/// Whether `name` is a local store's staging name, `NAME#DIGITS`.
fn is_partial_write(name: &str) -> bool {
    name.rsplit_once('#').is_some_and(|(stem, suffix)| {
        !stem.is_empty() && !suffix.is_empty() && suffix.bytes().all(|b| b.is_ascii_digit())
    })
}

/// reqwest takes rustls without a crypto provider of its own: the
/// process's default, ring, as the rest of the workspace uses. Installing
/// it again (another connector did first) is not an error.
fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_is_allowed_for_an_http_endpoint_or_when_asked_else_as_the_environment_says() {
        assert_eq!(
            allow_http_for(None, Some("http://127.0.0.1:10000/acct")),
            Some(true)
        );
        // Left to the environment, whose default is not.
        assert_eq!(
            allow_http_for(None, Some("https://acct.blob.core.windows.net")),
            None
        );
        assert_eq!(allow_http_for(None, None), None);
        assert_eq!(allow_http_for(Some(true), Some("https://host")), Some(true));
        assert_eq!(
            allow_http_for(Some(false), Some("http://127.0.0.1:3900")),
            Some(false)
        );
    }

    #[test]
    fn an_azure_endpoint_that_is_no_url_is_refused_when_the_store_is_built() {
        let config: crate::ObjectStoreSinkConfig = toml::from_str(
            "key = \"{partition}-{first_offset}.ndjson\"\n[store]\nkind = \"azure\"\n\
             account = \"acct\"\ncontainer = \"lake\"\n\
             endpoint = \"127.0.0.1 port 10000\"\naccess_key = \"c2VjcmV0\"\n",
        )
        .unwrap();
        // Not `expect_err`: the store's `Debug` would show the key.
        let Err(err) = build_store(&config.store, &config.requests) else {
            panic!("an endpoint that is no URL was taken");
        };
        let shown = err.to_string();
        assert!(shown.contains("az://lake"), "{shown}");
        assert!(shown.contains("127.0.0.1 port 10000"), "{shown}");
        assert!(!shown.contains("c2VjcmV0"), "{shown}");
    }
}
