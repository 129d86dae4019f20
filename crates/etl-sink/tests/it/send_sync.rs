//! What the crate promises about `Send` and `Sync`, checked at compile time.

use std::time::Duration;

use etl_ack::Acked;
use etl_record::{DeadLetter, Record};
use etl_sink::{
    BoxSink, DeadLetterHandle, EncodedBatch, FileSink, FileSinkConfig, Progress, SinkDriver,
    SinkError, SinkHandle, SinkMetrics, SinkSender,
};

fn send<T: Send>() {}
fn sync<T: Sync>() {}
fn send_value<T: Send>(_: &T) {}

#[test]
fn handles_sinks_and_futures_cross_threads() {
    send::<SinkHandle>();
    sync::<SinkHandle>();
    send::<SinkSender>();
    sync::<SinkSender>();
    send::<DeadLetterHandle>();
    send::<SinkDriver>();
    send::<BoxSink>();
    sync::<BoxSink>();
    send::<FileSink>();
    sync::<FileSink>();
    send::<EncodedBatch>();
    sync::<EncodedBatch>();
    send::<SinkError>();
    sync::<SinkError>();
    send::<Progress>();
    send::<SinkMetrics>();
}

#[tokio::test]
async fn public_futures_are_send() {
    let handle = SinkDriver::new(
        etl_sink::BlackholeSink::new(),
        etl_sink::RawLinesEncoder::new(),
    )
    .spawn();
    let (acker, _receiver) = etl_ack::channel();
    let ack = acker
        .open(etl_ack::BatchMeta {
            id: etl_ack::BatchId {
                partition: etl_record::PartitionId(0),
                epoch: 0,
                seq: 0,
            },
            first_offset: etl_record::Offset(0),
            last_offset: etl_record::Offset(0),
            records: 0,
            bytes: 0,
        })
        .expect("the receiver is alive");
    let send_fut = handle.send(etl_ack::Acked::new(Vec::new(), ack));
    send_value(&send_fut);
    let _ = send_fut.await;
    let close = handle.close();
    send_value(&close);
    let _ = close.await;
}

// Every other future of the handles, and opening a file sink, is awaited
// in tasks a multi-threaded runtime may move between threads.
const _: fn() = || {
    fn futures_are_send(
        sender: &SinkSender,
        handle: SinkHandle,
        other: SinkHandle,
        dead_letters: DeadLetterHandle,
        more_dead_letters: DeadLetterHandle,
        record: Acked<Vec<Record>>,
        letter: Acked<DeadLetter>,
    ) {
        send_value(&sender.send(record));
        send_value(&dead_letters.send(letter));
        send_value(&handle.shutdown(Duration::ZERO));
        send_value(&other.abort());
        send_value(&dead_letters.close());
        send_value(&more_dead_letters.shutdown(Duration::ZERO));
        send_value(&FileSink::open("out.ndjson", FileSinkConfig::default()));
    }
    let _ = futures_are_send;
};
