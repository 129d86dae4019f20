//! Secrets never leave the request: not in `Debug`, errors or logs.

use std::io::Write;
use std::sync::{Arc, Mutex};

use etl_test_support::http::FaultServer;

use crate::support::{batches, deliver, drive, driver_config, sink};

const SECRETS: [&str; 3] = ["hdr-SECRET-1", "basic-SECRET-2", "bearer-SECRET-3"];

/// A log writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Run `work` on a runtime of its own with every log line captured: the
/// log, which must show a retry.
fn logs_of(work: impl std::future::Future<Output = ()>) -> String {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(work);
    });
    let logs = String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned();
    assert!(
        logs.contains("retrying sink write"),
        "no log captured: {logs}"
    );
    logs
}

#[test]
fn no_secret_shows_in_debug_errors_or_logs_of_refused_and_failed_requests() {
    let mut shown = Vec::new();
    let logs = logs_of(async {
        let server = FaultServer::start().unwrap();
        server.require_authorization("Bearer the-right-one");
        let refused_port = etl_test_support::free_port().unwrap();
        for (uri, auth) in [
            (
                server.uri("/in?key=q"),
                format!("{{ strategy = \"bearer\", token = \"{}\" }}", SECRETS[2]),
            ),
            (
                server.uri("/in"),
                format!(
                    "{{ strategy = \"basic\", user = \"u\", password = \"{}\" }}",
                    SECRETS[1]
                ),
            ),
            (
                format!("http://127.0.0.1:{refused_port}/"),
                format!("{{ strategy = \"bearer\", token = \"{}\" }}", SECRETS[2]),
            ),
        ] {
            let text = format!(
                "uri = \"{uri}\"\nheaders = {{ \"X-Api-Key\" = \"{}\" }}\nauth = {auth}",
                SECRETS[0]
            );
            let config: etl_http::HttpSinkConfig = toml::from_str(&text).unwrap();
            shown.push(format!("{config:?}"));
            let sink = sink(&text);
            shown.push(format!("{sink:?}"));
            let mut config = driver_config(5, 1);
            config.retry.max_elapsed = std::time::Duration::from_millis(300);
            let (driver, _letters) = drive(sink, config);
            let (_, closed) = deliver(driver, batches(5, 5)).await;
            let err = closed.unwrap_err();
            shown.push(err.to_string());
            shown.push(format!("{err:?}"));
        }
        // The secrets were sent: the header and the credentials.
        let log = server.log();
        assert_eq!(log[0].header("x-api-key"), Some(SECRETS[0]));
        assert!(
            log.iter()
                .any(|l| l.header("authorization") == Some(&format!("Bearer {}", SECRETS[2])))
        );
    });
    shown.push(logs);
    for text in &shown {
        for secret in SECRETS {
            assert!(!text.contains(secret), "{secret} in: {text}");
        }
        // A query may hold a key: messages leave it out.
        assert!(!text.contains("key=q"), "the query in: {text}");
    }
    assert!(
        shown[3].contains("401") && shown[3].contains("\"svc\""),
        "{}",
        shown[3]
    );
}

#[test]
fn no_secret_shows_when_bulk_items_fail() {
    let mut shown = Vec::new();
    let logs = logs_of(async {
        let server = FaultServer::start().unwrap();
        server.answer_bulk();
        // One item of the first batch refused (dead-lettered), one of
        // the second overloaded until the retries give up.
        server.fail_bulk_item("\"id\":1}", 400, usize::MAX);
        server.fail_bulk_item("\"id\":7}", 429, usize::MAX);
        let text = format!(
            "uri = \"{}\"\nencoding = \"elasticsearch_bulk\"\nbulk = {{ id_field = \"id\" }}\n\
                 headers = {{ \"X-Api-Key\" = \"{}\" }}\n\
                 auth = {{ strategy = \"basic\", user = \"u\", password = \"{}\" }}",
            server.uri("/in/_bulk?key=q"),
            SECRETS[0],
            SECRETS[1]
        );
        let sink = sink(&text);
        shown.push(format!("{sink:?}"));
        let mut config = driver_config(5, 1);
        config.retry.max_elapsed = std::time::Duration::from_millis(300);
        let (driver, letters) = drive(sink, config);
        let (_, closed) = deliver(driver, batches(10, 5)).await;
        let err = closed.unwrap_err();
        shown.push(err.to_string());
        shown.push(format!("{err:?}"));
        assert_eq!(letters.records().len(), 1);
        shown.push(String::from_utf8_lossy(&letters.bytes()).into_owned());
    });
    shown.push(logs);
    for text in &shown {
        for secret in SECRETS {
            assert!(!text.contains(secret), "{secret} in: {text}");
        }
        assert!(!text.contains("key=q"), "the query in: {text}");
    }
    assert!(
        shown[1].contains("429") && shown[1].contains("\"svc\""),
        "{}",
        shown[1]
    );
}
