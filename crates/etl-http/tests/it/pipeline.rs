//! Whole pipelines: the `http` type through the registry.

use etl::{ErrorKind, Registry};
use etl_test_support::http::{Fault, FaultServer};
use tokio_util::sync::CancellationToken;

fn generated(uri: &str, extra: &str) -> String {
    format!(
        "[source]\ntype = \"generator\"\npartitions = 2\nrecords_per_partition = 500\n\n\
         [[sinks]]\ntype = \"http\"\nname = \"svc\"\nbatch_max_records = 100\nuri = \"{uri}\"\n{extra}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_type_runs_from_a_configuration_and_delivers_every_record() {
    let folder = tempfile::tempdir().unwrap();
    let server = FaultServer::start().unwrap();
    let registry = etl_http::register(Registry::new());
    let text = generated(&server.uri("/"), "compression = \"gzip\"");
    let config = registry.loader().text(&text, folder.path()).unwrap();
    let pipeline = etl::pipeline_from_config(&config).await.unwrap();
    pipeline.run(CancellationToken::new()).await.unwrap();
    assert_eq!(server.accepted_lines().len(), 1000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_credential_halts_the_pipeline_as_the_configurations_error() {
    let folder = tempfile::tempdir().unwrap();
    let server = FaultServer::start().unwrap();
    server.require_authorization("Bearer right");
    let registry = etl_http::register(Registry::new());
    let text = generated(
        &server.uri("/ingest"),
        "auth = { strategy = \"bearer\", token = \"wrong\" }",
    );
    let config = registry.loader().text(&text, folder.path()).unwrap();
    let pipeline = etl::pipeline_from_config(&config).await.unwrap();
    let err = pipeline.run(CancellationToken::new()).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("\"svc\"") && text.contains("/ingest") && text.contains("401"),
        "{text}"
    );
    // The `etl` binary exits 78 for this kind (docs/operations.md).
    assert_eq!(registry.classify(&err), Some(ErrorKind::Config));
    assert!(server.accepted().is_empty());
    // The first refusal halted it: no retries.
    assert!(server.log().len() <= 2, "{} requests", server.log().len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_rights_or_a_missing_uri_halt_the_pipeline_as_the_configurations_error() {
    for (status, says) in [(403, "403 Forbidden"), (404, "404 Not Found")] {
        let folder = tempfile::tempdir().unwrap();
        let server = FaultServer::start().unwrap();
        server.script(std::iter::repeat_n(Fault::status(status), 50));
        let registry = etl_http::register(Registry::new());
        let text = generated(
            &server.uri("/ingest?key=QUERY-SECRET"),
            "auth = { strategy = \"bearer\", token = \"TOKEN-SECRET\" }",
        );
        let config = registry.loader().text(&text, folder.path()).unwrap();
        let pipeline = etl::pipeline_from_config(&config).await.unwrap();
        let err = pipeline.run(CancellationToken::new()).await.unwrap_err();
        let text = format!("{err} {err:?}");
        assert!(
            text.contains("\"svc\"") && text.contains("/ingest") && text.contains(says),
            "{status}: {text}"
        );
        assert!(!text.contains("SECRET"), "{status}: {text}");
        assert_eq!(registry.classify(&err), Some(ErrorKind::Config), "{status}");
        assert!(server.accepted().is_empty());
        // The first refusal halted it: no retries.
        assert!(
            server.log().len() <= 2,
            "{status}: {} requests",
            server.log().len()
        );
    }
}

/// The Loki example of docs/http.md, its sink table as written there (the
/// URI and the password put in).
const LOKI_SINK: &str = r#"
[[sinks]]
type = "http"
name = "loki"
uri = "URI"
headers = { "Content-Type" = "application/json" }   # Loki reads JSON only under it
request_max_records = 1         # one `{"streams": [...]}` document a request
concurrency = 4
auth = { strategy = "basic", user = "tenant-1", password = "PASSWORD" }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loki_example_posts_one_json_document_a_request_with_basic_auth() {
    let folder = tempfile::tempdir().unwrap();
    let server = FaultServer::start().unwrap();
    // The server refuses (401) any other credentials.
    server.require_authorization("Basic dGVuYW50LTE6bG9raS1TRUNSRVQtNQ==");
    let registry = etl_http::register(Registry::new());
    let text = format!(
        "[source]\ntype = \"generator\"\npartitions = 2\nrecords_per_partition = 20\n{}",
        LOKI_SINK
            .replace("URI", &server.uri("/loki/api/v1/push"))
            .replace("PASSWORD", "loki-SECRET-5")
    );
    let config = registry.loader().text(&text, folder.path()).unwrap();
    let pipeline = etl::pipeline_from_config(&config).await.unwrap();
    pipeline.run(CancellationToken::new()).await.unwrap();
    let log = server.log();
    assert_eq!(log.len(), 40, "one record a request");
    for request in &log {
        assert_eq!(request.status, Some(200));
        assert_eq!(request.target, "/loki/api/v1/push");
        let types: Vec<_> = request
            .headers
            .iter()
            .filter(|(n, _)| n == "content-type")
            .collect();
        assert_eq!(types.len(), 1, "{types:?}");
        assert_eq!(types[0].1, "application/json");
        assert_eq!(
            request.header("authorization"),
            Some("Basic dGVuYW50LTE6bG9raS1TRUNSRVQtNQ==")
        );
        let body = String::from_utf8(request.body.clone()).unwrap();
        assert_eq!(body.lines().count(), 1, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap();
    }
}

#[test]
fn validation_places_what_the_sink_would_refuse_at_its_line_without_a_secret() {
    let registry = etl_http::register(Registry::new());
    let cases = [
        ("uri = \"ftp://h/\"", "uri", "not http"),
        (
            "uri = \"http://h/{tenant?api_key=top-secret\"",
            "uri",
            "not closed",
        ),
        ("uri = \"http://h/{labels[0]}\"", "uri", "field path"),
        ("uri = \"http://h/%{a}\"", "uri", "percent sign"),
        (
            "uri = \"http://h/\"\nheaders = { \"Content-Length\" = \"10\" }",
            "headers",
            "Content-Length",
        ),
        (
            "uri = \"http://h/\"\nheaders = { \"transfer-encoding\" = \"chunked\" }",
            "headers",
            "transfer-encoding",
        ),
        (
            "uri = \"http://h/\"\nheaders = { \"Content-Encoding\" = \"gzip\" }",
            "headers",
            "compression",
        ),
        (
            "uri = \"http://h/\"\nheaders = { \"Authorization\" = \"top-secret\" }\nauth = { strategy = \"bearer\", token = \"top-secret\" }",
            "headers",
            "auth",
        ),
        (
            "uri = \"http://h/\"\nrequest_concurrency = 0",
            "request_concurrency",
            "at least 1",
        ),
        (
            "uri = \"http://h/\"\nheaders = { \"X-Key\" = \"top-secret\\u0001\" }",
            "headers",
            "X-Key",
        ),
        (
            "uri = \"http://h/\"\nrequest_max_records = 0",
            "request_max_records",
            "at least 1",
        ),
        (
            "uri = \"http://h/\"\nrate_limit = { requests_per_second = 0 }",
            "rate_limit",
            "above 0",
        ),
        (
            "uri = \"https://etl:top-secret@h/\"",
            "uri",
            "user or password",
        ),
        ("uri = \"https://etl@h/\"", "uri", "use `auth`"),
        (
            "uri = \"https://h/\"\ntls = { client_cert_file = \"c.pem\" }",
            "tls",
            "go together",
        ),
        (
            "uri = \"https://h/\"\ntls = { client_key_file = \"top-secret.key\" }",
            "tls",
            "go together",
        ),
        (
            "uri = \"http://h/_bulk\"\nbulk = { id_field = \"id\" }",
            "bulk",
            "elasticsearch_bulk",
        ),
        (
            "uri = \"http://h/_bulk\"\nencoding = \"elasticsearch_bulk\"\nbulk = { id_field = \"a..b\" }",
            "bulk",
            "id_field",
        ),
        (
            "uri = \"http://h/_bulk\"\nencoding = \"elasticsearch_bulk\"\ncompression = \"zstd\"",
            "compression",
            "gzip",
        ),
    ];
    for (table, key, says) in cases {
        let text = format!(
            "[source]\ntype = \"generator\"\nrecords_per_partition = 1\n\n[[sinks]]\ntype = \"http\"\nname = \"svc\"\n{table}\n"
        );
        let problems = registry.loader().text(&text, ".".as_ref()).unwrap_err();
        let line = text
            .lines()
            .position(|l| l.starts_with(key))
            .map(|at| at + 1)
            .unwrap();
        assert!(
            problems
                .iter()
                .any(|p| p.line == line && p.message.contains(says)),
            "{key}: {problems:?}"
        );
        assert!(
            !format!("{problems:?}").contains("top-secret"),
            "{problems:?}"
        );
    }
}
