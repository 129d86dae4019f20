//! Dead letters: their NDJSON form, and the driver that writes them.

use std::fmt::Write as _;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use etl_ack::Acked;
use etl_record::{DeadLetter, Record};

use crate::batch::BatchBuilder;
use crate::{
    EncodedBatch, PermanentErrorPolicy, RawLinesEncoder, SendError, Sink, SinkDriver,
    SinkDriverConfig, SinkDriverError, SinkHandle, SinkMetrics,
};

/// Append `letter` as one NDJSON line:
///
/// ```text
/// {"key":"<source/partition/offset>","reason":"...","value":"...","value_encoding":"utf8"}
/// ```
///
/// `value` is the record's value as text when it is valid UTF-8
/// (`"value_encoding":"utf8"`), otherwise its bytes in lowercase hex
/// (`"value_encoding":"hex"`).
pub fn encode_dead_letter(letter: &DeadLetter, out: &mut BytesMut) {
    let record = &letter.record;
    let (value, encoding) = match std::str::from_utf8(&record.value) {
        Ok(text) => (serde_json::Value::from(text), "utf8"),
        Err(_) => {
            let mut hex = String::with_capacity(record.value.len() * 2);
            for b in &record.value[..] {
                // Writing to a String cannot fail.
                let _ = write!(hex, "{b:02x}");
            }
            (serde_json::Value::from(hex), "hex")
        }
    };
    let line = serde_json::json!({
        "key": record.idempotency_key().to_string(),
        "reason": letter.reason,
        "value": value,
        "value_encoding": encoding,
    });
    // Serializing a `Value` into memory cannot fail.
    let _ = serde_json::to_writer((&mut *out).writer(), &line);
    out.put_u8(b'\n');
}

/// Encode dead letters into a batch for a dead-letter sink; the batch's
/// records are the original records.
pub(crate) fn dead_letter_batch(letters: Vec<DeadLetter>) -> EncodedBatch {
    let mut builder = BatchBuilder::default();
    for letter in letters {
        // Dead letters are rare: a line buffer per letter is fine here.
        let mut line = BytesMut::new();
        encode_dead_letter(&letter, &mut line);
        builder.push_with(letter.record, |out| out.extend_from_slice(&line));
    }
    builder.finish()
}

/// The driver of a dead-letter sink: takes dead letters from upstream
/// (bad input, poison records) with their handles, writes them as NDJSON
/// lines (see [`encode_dead_letter`]) and delivers each only after its
/// write is durable. A dead-letter write that fails for good fails the
/// handle: the partition replays rather than losing the letter.
#[derive(Debug)]
pub struct DeadLetterHandle {
    inner: SinkHandle,
}

fn letter_record(letter: &DeadLetter) -> Record {
    let mut line = BytesMut::new();
    encode_dead_letter(letter, &mut line);
    // The raw-lines encoder adds the line break back.
    line.truncate(line.len().saturating_sub(1));
    let mut record = letter.record.clone();
    record.value = line.freeze();
    record
}

impl DeadLetterHandle {
    /// Start a dead-letter driver writing to `sink` (in a tokio runtime).
    /// `config.on_permanent_error` is ignored: dead letters have no
    /// dead-letter sink of their own, so a failed write fails.
    pub fn spawn(sink: impl Sink + 'static, config: SinkDriverConfig) -> Self {
        Self::start(Self::driver(sink, config))
    }

    /// As [`spawn`](Self::spawn), and call `on_halt` once if the driver
    /// halts (its sink cannot write, whatever the letters), before
    /// anything it holds fails, as [`SinkDriver::on_halt`] does: a
    /// pipeline whose dead-letter sink halts ends, and the failures
    /// that follow are not taken for ones to replay.
    pub fn spawn_with_halt(
        sink: impl Sink + 'static,
        config: SinkDriverConfig,
        on_halt: impl FnOnce() + Send + 'static,
    ) -> Self {
        Self::start(Self::driver(sink, config).on_halt(on_halt))
    }

    fn driver(sink: impl Sink + 'static, config: SinkDriverConfig) -> SinkDriver {
        let config = SinkDriverConfig {
            on_permanent_error: PermanentErrorPolicy::Fail,
            ..config
        };
        SinkDriver::new(sink, RawLinesEncoder::new()).config(config)
    }

    fn start(driver: SinkDriver) -> Self {
        DeadLetterHandle {
            inner: driver.spawn(),
        }
    }

    /// Queue a dead letter, waiting while the driver is full.
    ///
    /// # Errors
    ///
    /// The driver is gone: the letter is handed back with its handle
    /// already failed.
    pub async fn send(
        &self,
        letter: Acked<DeadLetter>,
    ) -> Result<(), SendError<Acked<DeadLetter>>> {
        let record = letter_record(letter.value());
        let (letter, ack) = letter.into_parts();
        self.inner
            .send(Acked::new(vec![record], ack))
            .await
            .map_err(|SendError(back)| SendError(Acked::new(letter, back.into_parts().1)))
    }

    /// As [`SinkHandle::source_waiting`]: while the source waits for
    /// credit, which letters lingering in this driver's batch may be
    /// keeping, they are written as soon as the input is idle.
    pub fn source_waiting(&self, waiting: bool) {
        self.inner.source_waiting(waiting);
    }

    /// What the driver has done so far.
    #[must_use]
    pub fn metrics(&self) -> SinkMetrics {
        self.inner.metrics()
    }

    /// Stop taking letters, write what is queued, flush.
    ///
    /// # Errors
    ///
    /// As [`SinkHandle::close`].
    pub async fn close(self) -> Result<SinkMetrics, SinkDriverError> {
        self.inner.close().await
    }

    /// As [`close`](Self::close), but give up after `deadline`.
    ///
    /// # Errors
    ///
    /// As [`SinkHandle::shutdown`].
    pub async fn shutdown(self, deadline: Duration) -> Result<SinkMetrics, SinkDriverError> {
        self.inner.shutdown(deadline).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etl_record::{Offset, PartitionId, Position, SourceId};

    fn letter(value: &'static [u8]) -> DeadLetter {
        DeadLetter::new(
            Record::new(
                Position::new(SourceId::new("in"), PartitionId(2), Offset(7)),
                value,
            ),
            "bad \"input\"",
        )
    }

    #[test]
    fn utf8_values_are_text_and_others_hex() {
        let mut out = BytesMut::new();
        encode_dead_letter(&letter(b"{\"a\":1}"), &mut out);
        encode_dead_letter(&letter(b"\xff\x00"), &mut out);
        let text = String::from_utf8(out.to_vec()).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[0]["key"], "in/2/7");
        assert_eq!(lines[0]["reason"], "bad \"input\"");
        assert_eq!(lines[0]["value"], "{\"a\":1}");
        assert_eq!(lines[0]["value_encoding"], "utf8");
        assert_eq!(lines[1]["value"], "ff00");
        assert_eq!(lines[1]["value_encoding"], "hex");
    }

    #[test]
    fn letter_records_keep_the_position() {
        let r = letter_record(&letter(b"x"));
        assert_eq!(r.position.offset, Offset(7));
        assert!(!r.value.ends_with(b"\n"));
        let batch = dead_letter_batch(vec![letter(b"x")]);
        assert_eq!(batch.len(), 1);
        assert!(batch.bytes().ends_with(b"\n"));
    }
}
