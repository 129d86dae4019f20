//! Whole pipelines: the `http` type through the registry.

use etl::{ErrorKind, Registry};
use etl_test_support::http::FaultServer;
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
            "uri = \"http://h/\"\nrate_limit = { requests_per_second = 0 }",
            "rate_limit",
            "above 0",
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
