//! The group source alone (no pipeline): assignment events, seeks on fresh
//! assignments, and a clean leave that commits through the revoke handler.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use etl_kafka::KafkaSource;
use etl_record::{Offset, PartitionId, SourceId};
use etl_source::{Source, SourceEvent};

use support::{CommitSeen, TestBroker, produce, source_config, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_every_partition_and_commits_on_leave() {
    let broker = TestBroker::start();
    let topic = unique("src");
    let group = unique("src-group");
    broker.create_topic(&topic, 4).await;
    produce(&broker, &topic, 10, 4).await;

    let mut source = KafkaSource::new(SourceId::new("k"), source_config(&broker, &group, &topic))
        .expect("source");
    let store = source.offset_store();
    let handler = CommitSeen {
        store: store.clone(),
        seen: Arc::default(),
        revoked: Arc::default(),
    };
    source.start(handler.clone()).expect("start");

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut total = 0;
    while total < 40 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {total} of 40 records in 30 s"
        );
        match source.next().await.expect("next") {
            SourceEvent::Assigned(ids) => {
                let committed = store.load().expect("load");
                for id in ids {
                    let start = committed.get(&id).copied().unwrap_or(Offset(0));
                    source.seek(id, start).await.expect("seek");
                }
            }
            SourceEvent::Batch(batch) => {
                assert!(batch.records.len() <= 4);
                let last = batch.last_offset().expect("non-empty");
                let mut seen = handler.seen.lock().expect("lock");
                let expected = seen.get(&batch.partition).copied().unwrap_or(Offset(0));
                assert_eq!(batch.first_offset(), Some(expected), "no gap, no repeat");
                seen.insert(batch.partition, last.next());
                total += batch.records.len();
            }
            SourceEvent::Revoked(ids) => panic!("unexpected revoke of {ids:?}"),
            SourceEvent::Idle | SourceEvent::End => {}
        }
    }
    assert_eq!(total, 40);
    source.close().await;
    let mut revoked = handler.revoked.lock().expect("lock").clone();
    revoked.sort();
    let map = etl_kafka::PartitionMap::new(vec![topic.clone()]).expect("map");
    let mut all: Vec<PartitionId> = (0..4).map(|p| map.id(&topic, p).expect("mapped")).collect();
    all.sort();
    assert_eq!(revoked, all);
    assert_eq!(
        broker.committed(&group, &topic, 4),
        (0..4).map(|p| (p, 10)).collect()
    );
}

/// librdkafka keeps a paused partition paused across its revocation: a
/// partition paused (for backpressure, or by the pipeline's in-flight
/// limit) when the group took it away came back paused, and since its new
/// assignment starts with nothing paused in the pipeline's view, nothing
/// ever resumed it. Its records stopped flowing for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_paused_when_revoked_is_read_again_when_it_comes_back() {
    const PER_PARTITION: i32 = 10;
    let broker = TestBroker::start();
    let topic = unique("paused");
    let group = unique("paused-group");
    broker.create_topic(&topic, 2).await;
    produce(&broker, &topic, PER_PARTITION, 2).await;

    let start = |name: &str| {
        let mut source =
            KafkaSource::new(SourceId::new(name), source_config(&broker, &group, &topic))
                .expect("source");
        let handler = CommitSeen {
            store: source.offset_store(),
            seen: Arc::default(),
            revoked: Arc::default(),
        };
        source.start(handler).expect("start");
        source
    };

    // The first member gets both partitions and pauses them at once.
    let mut first = start("first");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut assigned = Vec::new();
    while assigned.len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no assignment in 60 s"
        );
        if let SourceEvent::Assigned(ids) = first.next().await.expect("next") {
            first.pause(&ids).await.expect("pause");
            for id in ids {
                first.seek(id, Offset(0)).await.expect("seek");
                assigned.push(id);
            }
        }
    }

    // A second member takes one of them (still paused) away...
    let second = start("second");
    let moved = loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no revocation in 60 s"
        );
        match first.next().await.expect("next") {
            SourceEvent::Revoked(ids) => break ids,
            SourceEvent::Batch(b) => panic!("a paused partition was read: {:?}", b.partition),
            _ => {}
        }
    };
    assert_eq!(moved.len(), 1, "one partition moves: {moved:?}");

    // ...and leaves: the partition comes back, and must be read.
    second.close().await;
    let mut read = 0;
    let mut back = false;
    while read < PER_PARTITION as usize {
        assert!(
            tokio::time::Instant::now() < deadline,
            "partition {moved:?} came back: {back}; {read} of {PER_PARTITION} records read in 60 s"
        );
        match first.next().await.expect("next") {
            SourceEvent::Assigned(ids) => {
                assert_eq!(ids, moved);
                back = true;
                first.seek(ids[0], Offset(0)).await.expect("seek");
            }
            SourceEvent::Batch(b) => {
                assert_eq!(b.partition, moved[0], "the partition still paused was read");
                read += b.records.len();
            }
            _ => {}
        }
    }
    first.close().await;
}

/// Records point into the fetched messages rather than copying them:
/// value, key, headers (one without a value among them) and timestamp
/// arrive exactly as produced, also once every other record of the batch
/// is gone and the source is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_keys_headers_and_timestamps_arrive_as_produced() {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};

    let broker = TestBroker::start();
    let topic = unique("faithful");
    let group = unique("faithful-group");
    broker.create_topic(&topic, 1).await;
    let producer: FutureProducer = broker.config().create().expect("producer");
    let value = |i: u8| {
        let mut v = vec![0u8, 0xff, b'\n', i];
        v.extend(std::iter::repeat_n(i, usize::from(i) * 100));
        v
    };
    for i in 0..5u8 {
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "h",
                value: Some(&[i, 0, 0xfe][..]),
            })
            .insert(Header::<&[u8]> {
                key: "empty",
                value: None,
            });
        let v = value(i);
        let k = [b'k', i];
        let mut record = FutureRecord::to(&topic)
            .payload(&v)
            .partition(0)
            .timestamp(1_700_000_000_000 + i64::from(i));
        if i.is_multiple_of(2) {
            record = record.key(&k).headers(headers);
        }
        producer
            .send(record, Duration::from_secs(10))
            .await
            .expect("delivery");
    }

    let mut source = KafkaSource::new(SourceId::new("k"), source_config(&broker, &group, &topic))
        .expect("source");
    let handler = CommitSeen {
        store: source.offset_store(),
        seen: Arc::default(),
        revoked: Arc::default(),
    };
    source.start(handler).expect("start");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut records = Vec::new();
    while records.len() < 5 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of 5 records in 30 s",
            records.len()
        );
        match source.next().await.expect("next") {
            SourceEvent::Assigned(ids) => {
                for id in ids {
                    source.seek(id, Offset(0)).await.expect("seek");
                }
            }
            SourceEvent::Batch(batch) => records.extend(batch.records),
            _ => {}
        }
    }
    source.close().await;
    let check = |i: u8, r: &etl_record::Record| {
        assert_eq!(r.position.offset, Offset(i64::from(i)));
        assert_eq!(&r.value[..], &value(i)[..], "value of {i}");
        assert_eq!(
            r.timestamp.map(|t| t.0),
            Some(1_700_000_000_000 + i64::from(i))
        );
        let headers: Vec<(String, Option<Vec<u8>>)> = r
            .headers
            .iter()
            .map(|h| (h.key.clone(), h.value.as_ref().map(|v| v.to_vec())))
            .collect();
        if i.is_multiple_of(2) {
            assert_eq!(r.key.as_deref(), Some(&[b'k', i][..]));
            assert_eq!(
                headers,
                vec![
                    ("h".to_owned(), Some(vec![i, 0, 0xfe])),
                    ("empty".to_owned(), None)
                ]
            );
        } else {
            assert_eq!(r.key, None);
            assert!(headers.is_empty());
        }
    };
    for (i, r) in (0u8..).zip(&records) {
        check(i, r);
    }
    // The others, and the batch of messages they came in, go; the last
    // record still holds its bytes.
    let kept = records.split_off(4);
    drop(records);
    check(4, &kept[0]);
}

/// Starts a member of `group` alone and waits for its assignment of
/// `partitions` partitions, each sought to offset 0 (and paused before,
/// with `paused`).
async fn assigned_member(
    broker: &TestBroker,
    group: &str,
    topic: &str,
    partitions: usize,
    paused: bool,
) -> (KafkaSource, Vec<PartitionId>) {
    let mut source =
        KafkaSource::new(SourceId::new("k"), source_config(broker, group, topic)).expect("source");
    let handler = CommitSeen {
        store: source.offset_store(),
        seen: Arc::default(),
        revoked: Arc::default(),
    };
    source.start(handler).expect("start");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut assigned = Vec::new();
    while assigned.len() < partitions {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no assignment in 60 s"
        );
        match source.next().await.expect("next") {
            SourceEvent::Assigned(ids) => {
                if paused {
                    source.pause(&ids).await.expect("pause");
                }
                for id in ids {
                    source.seek(id, Offset(0)).await.expect("seek");
                    assigned.push(id);
                }
            }
            SourceEvent::Batch(b) => panic!("a batch before the seek: {:?}", b.partition),
            _ => {}
        }
    }
    assigned.sort();
    (source, assigned)
}

/// Checks that `batch` continues its partition where the last one ended
/// (no gap, no repeat) and counts it.
fn in_order(
    next: &mut std::collections::BTreeMap<PartitionId, i64>,
    batch: &etl_source::PollBatch,
) {
    let expected = next.get(&batch.partition).copied().unwrap_or(0);
    assert_eq!(
        batch.first_offset(),
        Some(Offset(expected)),
        "partition {:?}: no gap, no repeat",
        batch.partition
    );
    next.insert(
        batch.partition,
        batch.last_offset().expect("non-empty").0 + 1,
    );
}

/// The pipeline's pause of a partition is held by the source itself
/// before librdkafka hears of it (a librdkafka pause drops what it
/// prefetched): while paused, whether for less or more than that grace,
/// none of the partition's records is returned; resumed, each comes
/// once, in order, and the other partition is read throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_partition_returns_nothing_until_resumed_then_every_record_once_in_order() {
    const PER_PARTITION: i32 = 10;
    let broker = TestBroker::start();
    let topic = unique("hold");
    let group = unique("hold-group");
    broker.create_topic(&topic, 2).await;
    produce(&broker, &topic, PER_PARTITION, 2).await;
    let (mut source, ids) = assigned_member(&broker, &group, &topic, 2, true).await;
    let (held, free) = (ids[0], ids[1]);
    source.resume(&[free]).await.expect("resume");

    // Past the grace: the other partition is read whole, this one not.
    let mut next = std::collections::BTreeMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let quiet_until = tokio::time::Instant::now() + Duration::from_millis(1_500);
    while next.get(&free).copied().unwrap_or(0) < i64::from(PER_PARTITION)
        || tokio::time::Instant::now() < quiet_until
    {
        assert!(tokio::time::Instant::now() < deadline, "{next:?} in 60 s");
        match source.next().await.expect("next") {
            SourceEvent::Batch(b) => {
                assert_eq!(b.partition, free, "the paused partition was read");
                in_order(&mut next, &b);
            }
            SourceEvent::Revoked(r) => panic!("unexpected revoke of {r:?}"),
            _ => {}
        }
    }

    // Resumed: every record of it, once, in order; nothing more.
    source.resume(&[held]).await.expect("resume");
    let quiet_until = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::Instant::now() < quiet_until {
        match source.next().await.expect("next") {
            SourceEvent::Batch(b) => in_order(&mut next, &b),
            SourceEvent::Revoked(r) => panic!("unexpected revoke of {r:?}"),
            SourceEvent::Idle if next.get(&held).copied() == Some(i64::from(PER_PARTITION)) => {
                break;
            }
            _ => {}
        }
    }
    let ends = [(held, 10), (free, 10)].into_iter().collect();
    assert_eq!(next, ends);
    source.close().await;
}

/// Paused and resumed again and again, mostly within the grace: each
/// record of both partitions comes once, in order.
///
/// A batch of the paused partition may still come during a pause: one
/// already on its way to the source when the pause was asked for, as
/// [`Source::pause`](etl_source::Source::pause) allows. That the pause
/// itself holds is the test above, whose seek after the pause drops what
/// was on its way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_paused_and_resumed_briefly_return_every_record_once_in_order() {
    const PER_PARTITION: i32 = 40;
    let broker = TestBroker::start();
    let topic = unique("blink");
    let group = unique("blink-group");
    broker.create_topic(&topic, 2).await;
    produce(&broker, &topic, PER_PARTITION, 2).await;
    let (mut source, ids) = assigned_member(&broker, &group, &topic, 2, false).await;

    let mut next = std::collections::BTreeMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut round = 0u32;
    let done = |next: &std::collections::BTreeMap<PartitionId, i64>| {
        ids.iter()
            .all(|id| next.get(id).copied() == Some(i64::from(PER_PARTITION)))
    };
    while !done(&next) {
        assert!(tokio::time::Instant::now() < deadline, "{next:?} in 60 s");
        // Every third round one partition stays paused past the grace.
        let id = ids[round as usize % 2];
        source.pause(&[id]).await.expect("pause");
        let pause = if round % 3 == 2 { 150 } else { 5 };
        let until = tokio::time::Instant::now() + Duration::from_millis(pause);
        while tokio::time::Instant::now() < until {
            match tokio::time::timeout_at(until, source.next()).await {
                Ok(Ok(SourceEvent::Batch(b))) => in_order(&mut next, &b),
                Ok(Ok(SourceEvent::Revoked(r))) => panic!("unexpected revoke of {r:?}"),
                Ok(Ok(_)) | Err(_) => {}
                Ok(Err(e)) => panic!("next: {e}"),
            }
        }
        source.resume(&[id]).await.expect("resume");
        if let Ok(Ok(SourceEvent::Batch(b))) =
            tokio::time::timeout(Duration::from_millis(20), source.next()).await
        {
            in_order(&mut next, &b);
        }
        round += 1;
    }
    source.close().await;
}
