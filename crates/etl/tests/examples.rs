//! The examples run as tests, so they stay correct.

#[path = "../examples/custom_pipeline.rs"]
#[allow(dead_code)]
mod custom_pipeline;

#[path = "../examples/file_to_file.rs"]
#[allow(dead_code)]
mod file_to_file;

#[tokio::test]
async fn custom_source_and_sink_pipeline() {
    let lines = custom_pipeline::run().await.unwrap();
    assert_eq!(lines.len(), 300);
    assert!(lines.iter().all(|l| l.starts_with("SENSOR-")));
}

#[tokio::test]
async fn file_to_file_resumes_from_its_store() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.ndjson");
    std::fs::write(
        &input,
        "{\"id\":1,\"amount\":5}\n{\"id\":2,\"amount\":50}\n{\"id\":3,\"amount\":500}\n",
    )
    .unwrap();
    let out = dir.path().join("out");
    assert_eq!(file_to_file::run(&input, &out).await.unwrap(), (3, 2));
    assert_eq!(
        file_to_file::run(&input, &out).await.unwrap(),
        (0, 0),
        "resumed"
    );
    let text = std::fs::read_to_string(out.join("orders.ndjson")).unwrap();
    assert_eq!(text.lines().count(), 2);
    assert!(text.contains("\"pipeline\":\"rust\""));
}
