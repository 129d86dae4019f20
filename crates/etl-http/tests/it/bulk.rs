//! Elasticsearch's bulk API against the fault-injecting server answering
//! as it does, item by item: an action line before each document, a 200
//! whose `errors: true` is no delivery, failed items narrowed down to
//! their record.

use std::collections::BTreeMap;

use etl_ack::AckStatus;
use etl_test_support::http::FaultServer;

use crate::support::{batches, deliver, drive, driver_config, ids, record, sink};

/// The stored documents, by id, with how often each was stored.
fn counted(lines: &[String]) -> BTreeMap<i64, usize> {
    let mut counts = BTreeMap::new();
    for id in lines.iter().map(|l| ids(std::slice::from_ref(l))) {
        for id in id {
            *counts.entry(id).or_default() += 1;
        }
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_item_stored_delivers_each_record_under_its_action_line() {
    let server = FaultServer::start().unwrap();
    server.answer_bulk();
    server.require_authorization("Basic ZXRsOmJ1bGstU0VDUkVULTQ=");
    let sink = sink(&format!(
        "uri = \"{}\"\nencoding = \"elasticsearch_bulk\"\ncompression = \"gzip\"\n\
         bulk = {{ id_field = \"id\" }}\n\
         auth = {{ strategy = \"basic\", user = \"etl\", password = \"bulk-SECRET-4\" }}",
        server.uri("/orders/_bulk")
    ));
    let (driver, letters) = drive(sink, driver_config(10, 2));
    let (statuses, closed) = deliver(driver, batches(100, 10)).await;
    closed.unwrap();
    assert_eq!(statuses, vec![AckStatus::Delivered; 10]);
    assert!(letters.records().is_empty());
    let stored = server.bulk_stored();
    assert_eq!(counted(&stored), (0..100).map(|id| (id, 1)).collect());
    let log = server.log();
    assert_eq!(log.len(), 10, "one request a batch");
    for request in &log {
        assert_eq!(request.header("content-type"), Some("application/x-ndjson"));
        assert_eq!(request.header("content-encoding"), Some("gzip"));
        // Basic auth was sent as configured (the server answers 401
        // otherwise).
        assert_eq!(
            request.header("authorization"),
            Some("Basic ZXRsOmJ1bGstU0VDUkVULTQ=")
        );
        let body = String::from_utf8(request.body.clone()).unwrap();
        let lines: Vec<&str> = body.lines().collect();
        assert_eq!(lines.len(), 20, "{body}");
        for pair in lines.chunks(2) {
            let id = ids(&[pair[1].to_owned()]).pop_first().unwrap();
            assert_eq!(pair[0], format!("{{\"index\":{{\"_id\":\"{id}\"}}}}"));
            assert_eq!(pair[1], format!("{{\"id\":{id}}}"));
        }
        assert!(body.ends_with('\n'));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_item_refused_400_is_dead_lettered_alone_and_the_others_stored_once() {
    // `create` with an `_id`: a replayed item that was stored is answered
    // 409, which counts as delivered, so each document is stored once.
    let server = FaultServer::start().unwrap();
    server.answer_bulk();
    server.fail_bulk_item("\"id\":37}", 400, usize::MAX);
    let sink = sink(&format!(
        "uri = \"{}\"\nencoding = \"elasticsearch_bulk\"\n\
         bulk = {{ action = \"create\", id_field = \"id\" }}",
        server.uri("/orders/_bulk")
    ));
    let (driver, letters) = drive(sink, driver_config(10, 2));
    let (statuses, closed) = deliver(driver, batches(100, 10)).await;
    closed.unwrap();
    assert_eq!(statuses, vec![AckStatus::Delivered; 10]);
    let dead = letters.records();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(&dead[0].value[..], b"{\"id\":37}");
    let letter_text = String::from_utf8_lossy(&letters.bytes()).into_owned();
    assert!(letter_text.contains("400"), "{letter_text}");
    assert_eq!(
        counted(&server.bulk_stored()),
        (0..100).filter(|&id| id != 37).map(|id| (id, 1)).collect()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_answered_429_is_retried_and_nothing_is_lost() {
    let server = FaultServer::start().unwrap();
    server.answer_bulk();
    server.fail_bulk_item("\"id\":5}", 429, 3);
    server.fail_bulk_item("\"id\":52}", 503, 1);
    let sink = sink(&format!(
        "uri = \"{}\"\nencoding = \"elasticsearch_bulk\"",
        server.uri("/logs/_bulk")
    ));
    let (driver, letters) = drive(sink, driver_config(10, 2));
    let (statuses, closed) = deliver(driver, batches(100, 10)).await;
    closed.unwrap();
    assert_eq!(statuses, vec![AckStatus::Delivered; 10]);
    assert!(letters.records().is_empty(), "{:?}", letters.records());
    // Without an `_id`, the items of a request sent again are stored
    // again: at least once.
    let counts = counted(&server.bulk_stored());
    assert_eq!(
        counts.keys().copied().collect::<Vec<_>>(),
        (0..100).collect::<Vec<_>>()
    );
    assert!(counts[&5] == 1 && counts[&52] == 1, "{counts:?}");
    // Each bulk action line is bare.
    for request in server.log() {
        let body = String::from_utf8(request.body).unwrap();
        for action in body.lines().step_by(2) {
            assert_eq!(action, "{\"index\":{}}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_without_the_id_field_is_dead_lettered_and_its_batch_delivered() {
    let server = FaultServer::start().unwrap();
    server.answer_bulk();
    let sink = sink(&format!(
        "uri = \"{}\"\nencoding = \"elasticsearch_bulk\"\nbulk = {{ id_field = \"order.id\" }}",
        server.uri("/orders/_bulk")
    ));
    let (driver, letters) = drive(sink, driver_config(3, 1));
    let records = vec![vec![
        record(0, r#"{"order":{"id":"a\"1"},"n":0}"#),
        record(1, r#"{"order":{},"n":1}"#),
        record(2, r#"{"order":{"id":7.5},"n":2}"#),
    ]];
    let (statuses, closed) = deliver(driver, records).await;
    closed.unwrap();
    assert_eq!(statuses, [AckStatus::Delivered]);
    let dead = letters.records();
    // No id, and a decimal id (read as a float, it may have lost digits).
    assert_eq!(dead.len(), 2);
    assert_eq!(&dead[0].value[..], br#"{"order":{},"n":1}"#);
    assert_eq!(&dead[1].value[..], br#"{"order":{"id":7.5},"n":2}"#);
    let letter_text = String::from_utf8_lossy(&letters.bytes()).into_owned();
    assert!(letter_text.contains("order.id"), "{letter_text}");
    let log = server.log();
    assert_eq!(log.len(), 1);
    assert_eq!(
        String::from_utf8(log[0].body.clone()).unwrap(),
        "{\"index\":{\"_id\":\"a\\\"1\"}}\n{\"order\":{\"id\":\"a\\\"1\"},\"n\":0}\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_refused_403_halts_naming_the_sink_without_a_secret() {
    let server = FaultServer::start().unwrap();
    server.answer_bulk();
    server.fail_bulk_item("\"id\":3}", 403, usize::MAX);
    let sink = sink(&format!(
        "uri = \"{}\"\nencoding = \"elasticsearch_bulk\"\n\
         auth = {{ strategy = \"basic\", user = \"etl\", password = \"bulk-SECRET-4\" }}",
        server.uri("/orders/_bulk?key=QUERY-SECRET-6")
    ));
    let (driver, letters) = drive(sink, driver_config(10, 1));
    let (_statuses, closed) = deliver(driver, batches(10, 10)).await;
    let err = closed.unwrap_err();
    let text = format!("{err} {err:?}");
    assert!(text.contains("\"svc\"") && text.contains("403"), "{text}");
    assert!(
        !text.contains("SECRET") && !String::from_utf8_lossy(&letters.bytes()).contains("SECRET"),
        "{text}"
    );
    assert!(letters.records().is_empty());
}
