//! A sink around a blocking client: `std::fs::File`, standing in for any
//! client library without async support (a vendor SDK, a synchronous
//! database driver).
//!
//! The blocking calls run on tokio's blocking thread pool through
//! `tokio::task::spawn_blocking`, never on the async worker threads (a
//! blocking call there stalls every task scheduled on that thread: other
//! sinks, the source, the checkpointer).
//!
//! Run it with `cargo run -p etl-sink --example blocking_sink`.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use etl_ack::{Acked, BatchId, BatchMeta};
use etl_record::{Offset, PartitionId, Position, Record, SourceId};
use etl_sink::{EncodedBatch, RawLinesEncoder, Sink, SinkDriver, SinkError};

// ANCHOR: sink
/// Appends each batch's bytes to a file with blocking calls, and makes
/// them durable (`sync_data`) before returning `Ok`.
#[derive(Debug, Clone)]
pub struct BlockingFileSink {
    path: PathBuf,
    // The blocking client, shared with the blocking threads. One lock:
    // the driver may run several writes at once, and appends must not
    // interleave.
    file: Arc<Mutex<File>>,
}

impl BlockingFileSink {
    /// Open (or create) `path` for appending.
    ///
    /// # Errors
    ///
    /// The file cannot be opened.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, SinkError> {
        let path = path.into();
        let file = File::options()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| SinkError::io("open", &path, e))?;
        Ok(BlockingFileSink {
            path,
            file: Arc::new(Mutex::new(file)),
        })
    }
}

#[async_trait]
impl Sink for BlockingFileSink {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        // What the blocking thread needs, owned: `Bytes` clones share the
        // buffer, they do not copy it.
        let bytes = batch.bytes().clone();
        let file = Arc::clone(&self.file);
        let path = self.path.clone();
        let written = tokio::task::spawn_blocking(move || {
            let mut file = file.lock().unwrap_or_else(PoisonError::into_inner);
            file.write_all(&bytes)
                .map_err(|e| SinkError::io("write", &path, e))?;
            // Durable before `Ok`: this is what lets the pipeline commit.
            file.sync_data()
                .map_err(|e| SinkError::io("fsync", &path, e))
        })
        .await;
        match written {
            Ok(result) => result,
            // The blocking closure panicked: nothing says what was written.
            Err(join) => Err(SinkError::permanent(format!(
                "writing {} panicked: {join}",
                self.path.display()
            ))),
        }
    }
}
// ANCHOR_END: sink

// If the driver drops the `write` future (a timeout, an abort), the
// blocking closure still runs to its end: its bytes may land while the
// batch counts as failed and is written again by the replay. That is the
// at-least-once duplicate rule 6 of docs/writing-a-sink.md allows; the
// sink stays usable (rule 8), since the lock is released when the closure
// ends.

/// Write three records through the driver into `dir/out.log`; returns
/// the file's text.
pub async fn run(dir: &Path) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    let (acker, _events) = etl_ack::channel();
    let ack = acker.open(BatchMeta {
        id: BatchId {
            partition: PartitionId(0),
            epoch: 1,
            seq: 0,
        },
        first_offset: Offset(0),
        last_offset: Offset(2),
        records: 3,
        bytes: 15,
    })?;
    let records = ["one", "two", "three"]
        .iter()
        .zip(0..)
        .map(|(v, o)| {
            let at = Position::new(SourceId::new("demo"), PartitionId(0), Offset(o));
            Record::new(at, *v)
        })
        .collect();

    let path = dir.join("out.log");
    let sink = SinkDriver::new(BlockingFileSink::open(&path)?, RawLinesEncoder::new()).spawn();
    sink.send(Acked::new(records, ack)).await?;
    sink.close().await?;
    Ok(std::fs::read_to_string(path)?)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let dir = std::env::temp_dir().join(format!("blocking_sink-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    print!("{}", run(&dir).await?);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
