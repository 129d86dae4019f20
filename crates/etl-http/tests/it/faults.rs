//! The sink against the fault-injecting server: every fault retried or
//! narrowed down, nothing lost, nothing dead-lettered wrongly.

use std::time::{Duration, SystemTime};

use etl_ack::AckStatus;
use etl_test_support::http::{Fault, FaultServer};

use crate::support::{batches, deliver, drive, driver_config, ids, record, sink};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_record_is_lost_or_dead_lettered_across_every_retryable_fault() {
    let server = FaultServer::start().unwrap();
    server.script([
        Fault::Status {
            status: 429,
            retry_after: Some("1".to_owned()),
        },
        Fault::status(503),
        Fault::status(503),
        Fault::status(503),
        Fault::Slow(Duration::from_millis(100)),
        Fault::Hang,
        Fault::Reset,
        Fault::status(408),
        Fault::status(500),
        Fault::status(502),
    ]);
    let sink = sink(&format!(
        "uri = \"{}\"\ntimeout = \"500ms\"\ncompression = \"gzip\"",
        server.uri("/in")
    ));
    let (driver, letters) = drive(sink, driver_config(3, 2));
    let (statuses, closed) = deliver(driver, batches(60, 3)).await;
    closed.unwrap();
    assert_eq!(statuses.len(), 20);
    assert!(
        statuses.iter().all(|s| *s == AckStatus::Delivered),
        "{statuses:?}"
    );
    assert!(letters.records().is_empty(), "{:?}", letters.bytes());
    assert_eq!(
        ids(&server.accepted_lines()),
        (0..60).collect(),
        "a record is missing from what the server accepted"
    );
    // Every scripted fault was met, and each failed request was sent again.
    let log = server.log();
    let failed = log
        .iter()
        .filter(|l| l.status.is_none_or(|s| s != 200))
        .count();
    assert!(failed >= 9, "{failed} failed requests in {log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_of_a_429_or_a_5xx_in_seconds_or_as_a_date_holds_back_the_next_request() {
    for as_date in [false, true] {
        // A date is written to the second: three seconds ahead is at least
        // two when the request is answered.
        let retry_after = if as_date {
            httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(3))
        } else {
            "1".to_owned()
        };
        let at_least = 1000;
        let server = FaultServer::start().unwrap();
        // Throttling (429) with seconds, a bad gateway (502) with a date.
        server.script([Fault::Status {
            status: if as_date { 502 } else { 429 },
            retry_after: Some(retry_after.clone()),
        }]);
        let sink = sink(&format!("uri = \"{}\"", server.uri("/")));
        let (driver, _letters) = drive(sink, driver_config(10, 1));
        let (statuses, closed) = deliver(driver, batches(10, 10)).await;
        closed.unwrap();
        assert_eq!(statuses, [AckStatus::Delivered]);
        let log = server.log();
        assert_eq!(log.len(), 2, "{log:?}");
        let waited = log[1].at - log[0].at;
        // The driver's own backoff is at most 10 ms here.
        assert!(
            waited >= Duration::from_millis(at_least),
            "Retry-After {retry_after}: the retry came after {waited:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_record_answered_400_is_narrowed_down_and_alone_dead_lettered() {
    let server = FaultServer::start().unwrap();
    server.reject_marked("\"bad\":true");
    let sink = sink(&format!(
        "uri = \"{}\"\ncompression = \"zstd\"",
        server.uri("/")
    ));
    let (driver, letters) = drive(sink, driver_config(16, 1));
    let records: Vec<_> = (0..32)
        .map(|o| {
            let value = if o == 21 {
                format!("{{\"id\":{o},\"bad\":true}}")
            } else {
                format!("{{\"id\":{o}}}")
            };
            record(o, &value)
        })
        .collect();
    let (statuses, closed) = deliver(driver, records.chunks(8).map(<[_]>::to_vec).collect()).await;
    closed.unwrap();
    assert!(
        statuses.iter().all(|s| *s == AckStatus::Delivered),
        "{statuses:?}"
    );
    let dead = letters.records();
    assert_eq!(
        dead.len(),
        1,
        "{:?}",
        String::from_utf8_lossy(&letters.bytes())
    );
    let letter = String::from_utf8_lossy(&letters.bytes()).into_owned();
    assert!(letter.contains("21") && letter.contains("400"), "{letter}");
    let accepted = ids(&server.accepted_lines());
    assert_eq!(accepted, (0..32).filter(|&o| o != 21).collect());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_uri_template_sends_one_request_per_uri_and_rejects_a_record_without_the_field() {
    let server = FaultServer::start().unwrap();
    let sink = sink(&format!(
        "uri = \"{}\"\nencoding = \"json_array\"",
        server.uri("/t/{tenant}")
    ));
    let (driver, letters) = drive(sink, driver_config(100, 1));
    let values = [
        r#"{"id":0,"tenant":"a"}"#,
        r#"{"id":1,"tenant":"b c"}"#,
        r#"{"id":2}"#,
        r#"{"id":3,"tenant":"a"}"#,
    ];
    let records: Vec<_> = (0..4).map(|o| record(o, values[o as usize])).collect();
    let (statuses, closed) = deliver(driver, vec![records]).await;
    closed.unwrap();
    assert_eq!(statuses, [AckStatus::Delivered]);
    let mut requests: Vec<(String, String)> = server
        .accepted()
        .iter()
        .map(|l| {
            (
                l.target.clone(),
                String::from_utf8_lossy(&l.body).into_owned(),
            )
        })
        .collect();
    requests.sort();
    assert_eq!(
        requests,
        [
            (
                "/t/a".to_owned(),
                r#"[{"id":0,"tenant":"a"},{"id":3,"tenant":"a"}]"#.to_owned()
            ),
            (
                "/t/b%20c".to_owned(),
                r#"[{"id":1,"tenant":"b c"}]"#.to_owned()
            ),
        ]
    );
    let letter = String::from_utf8_lossy(&letters.bytes()).into_owned();
    assert_eq!(letters.records().len(), 1, "{letter}");
    assert!(letter.contains("tenant"), "{letter}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_error_under_the_halt_policy_stops_the_driver_and_dead_letters_nothing() {
    let server = FaultServer::start().unwrap();
    server.reject_marked("\"bad\":true");
    let sink = sink(&format!(
        "uri = \"{}\"\non_client_error = \"halt\"",
        server.uri("/")
    ));
    let (driver, letters) = drive(sink, driver_config(10, 1));
    let records = vec![
        record(0, "{\"id\":0}"),
        record(1, "{\"id\":1,\"bad\":true}"),
    ];
    let (statuses, closed) = deliver(driver, vec![records]).await;
    let err = closed.unwrap_err();
    assert!(err.to_string().contains("400"), "{err}");
    assert!(letters.records().is_empty());
    assert!(!statuses.contains(&AckStatus::Delivered), "{statuses:?}");
}
