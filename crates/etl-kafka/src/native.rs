//! The librdkafka calls the `rdkafka` crate offers no safe form of: the
//! assigned partitions' fetch queues, consumed in batches, and messages
//! kept past the call that returned them.
//!
//! `BaseConsumer::poll` hands out one message per call, each through an
//! event allocated for it (and a clock read), and a `BorrowedMessage`
//! lives no longer than the borrow of the consumer, so its payload has to
//! be copied out. That per-message work kept the poll thread busy for
//! about half of a run's CPU time (see `docs/benchmarks.md`). Here every
//! assigned partition's fetch queue is forwarded to one queue of the
//! application's ([`FetchQueue`]) rather than to the consumer queue, which
//! is left with rebalance and error events, and drained with
//! `rd_kafka_consume_batch_queue`; the messages of a batch stay owned
//! until the last record whose value or key points into them is dropped.
//!
//! Unsafe code lives here alone; every block says what it relies on.

// The measured need: zero-copy payloads and batch consumption exist only
// in librdkafka's C API (see the module documentation).
#![allow(unsafe_code)]

use std::ffi::CString;
use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use etl_record::{Header, HeaderSource, Headers};
use rdkafka::bindings as rd;
use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::context::GroupContext;

/// The consumer, shared: queues and messages hold it, so librdkafka's
/// handle is destroyed only after the last of them (librdkafka requires
/// every queue and message to be released before its handle).
pub(crate) type SharedConsumer = Arc<BaseConsumer<GroupContext>>;

/// The application's fetch queue: every assigned partition's fetch queue
/// is forwarded here ([`FetchQueue::attach`], on every assignment) instead
/// of to the consumer queue, which is left with rebalance and error
/// events. Forwarding set by the application also marks a partition's
/// queue as the application's, so librdkafka does not forward it back to
/// the consumer queue when the partition's fetch (re)starts; stopping the
/// fetch (a revocation) clears the forwarding, hence the attach on every
/// assignment, and again every second (the stop is served on librdkafka's
/// thread and may come after the next assignment's attach).
pub(crate) struct FetchQueue {
    queue: NonNull<rd::rd_kafka_queue_t>,
    _consumer: SharedConsumer,
}

// SAFETY: a librdkafka queue handle is a reference count on a queue whose
// every operation takes the queue's own lock; it may be used and released
// from any thread.
unsafe impl Send for FetchQueue {}
// SAFETY: as above; `&self` methods only call thread-safe queue functions.
unsafe impl Sync for FetchQueue {}

impl fmt::Debug for FetchQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FetchQueue").finish_non_exhaustive()
    }
}

impl FetchQueue {
    /// A new, empty queue of `consumer`'s.
    pub(crate) fn new(consumer: &SharedConsumer) -> Option<Self> {
        // SAFETY: the client pointer is valid while `consumer` lives; the
        // call returns a new queue reference (or null).
        let queue = unsafe { rd::rd_kafka_queue_new(consumer.client().native_ptr()) };
        Some(FetchQueue {
            queue: NonNull::new(queue)?,
            _consumer: Arc::clone(consumer),
        })
    }

    /// Forward `topic`'s `partition` here; `false` when librdkafka does not
    /// know the partition (or the topic name holds a NUL).
    pub(crate) fn attach(
        &self,
        consumer: &BaseConsumer<GroupContext>,
        topic: &str,
        partition: i32,
    ) -> bool {
        forward(consumer, topic, partition, self.queue.as_ptr())
    }

    /// Clear `topic`'s `partition` forwarding, as librdkafka does when it
    /// stops the partition's fetch, leaving the queue marked as the
    /// application's; `false` when librdkafka does not know the partition.
    #[cfg(test)]
    pub(crate) fn detach(
        consumer: &BaseConsumer<GroupContext>,
        topic: &str,
        partition: i32,
    ) -> bool {
        forward(consumer, topic, partition, std::ptr::null_mut())
    }

    /// Take up to `max` messages, waiting up to `wait` for the first.
    /// Messages of an error (a fetch error, a partition's end) are
    /// released and counted in [`Consumed::errors`].
    pub(crate) fn consume(
        &self,
        consumer: &SharedConsumer,
        max: usize,
        wait: Duration,
    ) -> Consumed {
        let mut pointers: Vec<*mut rd::rd_kafka_message_t> = Vec::with_capacity(max);
        let wait = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: `pointers` has room for `max` message pointers; the call
        // writes at most that many and returns how many (or -1). Each
        // written pointer is a message the caller now owns.
        let n = unsafe {
            rd::rd_kafka_consume_batch_queue(self.queue.as_ptr(), wait, pointers.as_mut_ptr(), max)
        };
        let n = usize::try_from(n).unwrap_or(0).min(max);
        // SAFETY: the call initialised the first `n` entries.
        unsafe { pointers.set_len(n) };
        let mut errors = 0;
        pointers.retain(|m| {
            // SAFETY: every pointer is a valid message owned here; one that
            // carries an error is released and dropped from the batch.
            unsafe {
                if (**m).err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                    true
                } else {
                    errors += 1;
                    rd::rd_kafka_message_destroy(*m);
                    false
                }
            }
        });
        let headers = pointers.iter().map(|_| OnceLock::new()).collect();
        Consumed {
            batch: Arc::new(MessageBatch {
                messages: pointers,
                headers,
                _consumer: Arc::clone(consumer),
            }),
            errors,
        }
    }
}

impl Drop for FetchQueue {
    fn drop(&mut self) {
        // SAFETY: the reference was returned by `rd_kafka_queue_new` and is
        // released once, while the consumer (held) is alive.
        unsafe { rd::rd_kafka_queue_destroy(self.queue.as_ptr()) };
    }
}

/// What one [`FetchQueue::consume`] took.
#[derive(Debug)]
pub(crate) struct Consumed {
    /// The messages, in offset order.
    pub(crate) batch: Arc<MessageBatch>,
    /// Error messages released.
    pub(crate) errors: usize,
}

/// Messages owned until the last view into them is dropped. Records of
/// one batch travel together, so they are released together, on whatever
/// thread drops the last one.
pub(crate) struct MessageBatch {
    messages: Vec<*mut rd::rd_kafka_message_t>,
    /// Each message's headers, parsed when a record first reads them
    /// (see [`HeaderSource`]): asking librdkafka costs a parse buffer
    /// allocated and freed even for a message without headers, and most
    /// pipelines never read them.
    headers: Vec<OnceLock<Vec<Header>>>,
    _consumer: SharedConsumer,
}

// SAFETY: a consumed message is immutable until it is destroyed, and
// librdkafka allows destroying it from any thread.
unsafe impl Send for MessageBatch {}
// SAFETY: shared access only reads the messages, except for the parse of
// a message's headers (the one thing librdkafka caches in a message on
// request), which runs inside that message's `OnceLock`: once, and never
// on two threads at a time.
unsafe impl Sync for MessageBatch {}

impl fmt::Debug for MessageBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MessageBatch")
            .field("messages", &self.messages.len())
            .finish_non_exhaustive()
    }
}

impl MessageBatch {
    /// Number of messages.
    pub(crate) fn len(&self) -> usize {
        self.messages.len()
    }

    /// What a message holds, by index.
    pub(crate) fn get(self: &Arc<Self>, index: usize) -> Option<MessageView> {
        let m = *self.messages.get(index)?;
        // SAFETY: `m` is a valid message owned by this batch, alive while
        // `self` is.
        let m = unsafe { &*m };
        let mut kind = rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
        // SAFETY: as above; `kind` is a valid place for the type.
        let timestamp = unsafe { rd::rd_kafka_message_timestamp(m, &mut kind) };
        let timestamp = (kind != rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE
            && timestamp >= 0)
            .then_some(timestamp);
        Some(MessageView {
            topic: m.rkt as usize,
            partition: m.partition,
            offset: m.offset,
            value: self.slice(m.payload, m.len),
            key: (!m.key.is_null()).then(|| self.slice(m.key, m.key_len)),
            timestamp,
            headers: Headers::deferred(Arc::clone(self) as Arc<dyn HeaderSource>, index),
        })
    }

    /// The name of the topic of message `index`.
    pub(crate) fn topic_name(&self, index: usize) -> Option<&str> {
        let m = *self.messages.get(index)?;
        // SAFETY: `m` is a valid message owned by this batch; its topic
        // handle and the handle's name live at least as long.
        let name = unsafe { rd::rd_kafka_topic_name((*m).rkt) };
        if name.is_null() {
            return None;
        }
        // SAFETY: as above; the name is NUL-terminated.
        unsafe { std::ffi::CStr::from_ptr(name) }.to_str().ok()
    }

    /// `len` bytes at `at`, inside a message of this batch, kept alive by
    /// the batch.
    fn slice(self: &Arc<Self>, at: *mut std::ffi::c_void, len: usize) -> Bytes {
        if at.is_null() || len == 0 {
            return Bytes::new();
        }
        Bytes::from_owner(Span {
            _batch: Arc::clone(self),
            at: at.cast::<u8>().cast_const(),
            len,
        })
    }
}

impl HeaderSource for MessageBatch {
    fn headers(&self, index: usize) -> &[Header] {
        let (Some(cell), Some(m)) = (self.headers.get(index), self.messages.get(index)) else {
            return &[];
        };
        cell.get_or_init(|| parse_headers(*m))
    }

    /// Known once parsed; 0 before (the header section is part of the
    /// fetched message, which the record's value keeps alive anyway).
    fn byte_len(&self, index: usize) -> usize {
        self.headers
            .get(index)
            .and_then(OnceLock::get)
            .map_or(0, |list| {
                list.iter()
                    .map(|h| h.key.len() + h.value.as_ref().map_or(0, Bytes::len))
                    .sum()
            })
    }
}

/// A message's headers, in order, copied out of it: values pointing into
/// the batch would keep it alive from its own cache.
fn parse_headers(m: *mut rd::rd_kafka_message_t) -> Vec<Header> {
    let mut headers: *mut rd::rd_kafka_headers_t = std::ptr::null_mut();
    // SAFETY: `m` is a valid message of a live batch, and this runs at
    // most once per message, on one thread (the caller's `OnceLock`); the
    // headers found stay owned by the message.
    let found = unsafe { rd::rd_kafka_message_headers(m, &mut headers) }
        == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR;
    let mut out = Vec::new();
    if !found || headers.is_null() {
        return out;
    }
    for i in 0.. {
        let mut name: *const std::ffi::c_char = std::ptr::null();
        let mut value: *const std::ffi::c_void = std::ptr::null();
        let mut size = 0usize;
        // SAFETY: `headers` belongs to the message; the call fills the
        // three places for index `i` or says there is none. The name is
        // NUL-terminated and owned by the headers.
        let found =
            unsafe { rd::rd_kafka_header_get_all(headers, i, &mut name, &mut value, &mut size) }
                == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR;
        if !found || name.is_null() {
            break;
        }
        // SAFETY: as above.
        let key = unsafe { std::ffi::CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned();
        let value = (!value.is_null()).then(|| {
            // SAFETY: `value..value + size` lies inside the message's
            // header section, alive while the message is.
            Bytes::copy_from_slice(unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) })
        });
        out.push(Header { key, value });
    }
    out
}

impl Drop for MessageBatch {
    fn drop(&mut self) {
        for m in self.messages.drain(..) {
            // SAFETY: each message is owned by this batch and released
            // once, before the consumer it holds.
            unsafe { rd::rd_kafka_message_destroy(m) };
        }
    }
}

/// Bytes inside a message, with the batch that keeps them alive.
struct Span {
    _batch: Arc<MessageBatch>,
    at: *const u8,
    len: usize,
}

// SAFETY: the bytes are immutable and live as long as the batch held.
unsafe impl Send for Span {}

impl AsRef<[u8]> for Span {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `at..at + len` lies inside a message of `_batch`, which
        // is neither changed nor released while this span holds it.
        unsafe { std::slice::from_raw_parts(self.at, self.len) }
    }
}

/// One message of a [`MessageBatch`].
#[derive(Debug)]
pub(crate) struct MessageView {
    /// The topic, as librdkafka's handle: equal for messages of one topic
    /// (see [`MessageBatch::topic_name`]).
    pub(crate) topic: usize,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) value: Bytes,
    pub(crate) key: Option<Bytes>,
    /// Milliseconds since the epoch, when the message has a timestamp.
    pub(crate) timestamp: Option<i64>,
    /// Parsed when first read.
    pub(crate) headers: Headers,
}

/// The high watermark of `topic`/`partition` as the consumer last heard
/// it (from a fetch response), without asking the broker; `None` before
/// the first fetch or when the topic is unknown.
pub(crate) fn cached_high_watermark(
    consumer: &BaseConsumer<GroupContext>,
    topic: &str,
    partition: i32,
) -> Option<i64> {
    let topic = CString::new(topic).ok()?;
    let (mut low, mut high) = (-1_i64, -1_i64);
    // SAFETY: the handle is alive (borrowed from the consumer), the topic
    // name is a NUL-terminated string that outlives the call, and the two
    // out-pointers are valid for writes. The call only reads librdkafka's
    // cached partition state under its locks; it never blocks on I/O.
    let err = unsafe {
        rd::rd_kafka_get_watermark_offsets(
            consumer.client().native_ptr(),
            topic.as_ptr(),
            partition,
            &raw mut low,
            &raw mut high,
        )
    };
    (err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0).then_some(high)
}

/// Forward `topic`'s `partition` fetch queue to `to` (null: clear the
/// forwarding); `false` when librdkafka does not know the partition (or
/// the topic name holds a NUL).
fn forward(
    consumer: &BaseConsumer<GroupContext>,
    topic: &str,
    partition: i32,
    to: *mut rd::rd_kafka_queue_t,
) -> bool {
    let Ok(topic) = CString::new(topic) else {
        return false;
    };
    // SAFETY: the client pointer is valid while `consumer` is borrowed,
    // and `topic` is NUL-terminated and outlives the call, which returns a
    // new reference to the partition's fetch queue, or null.
    let partition_queue = unsafe {
        rd::rd_kafka_queue_get_partition(consumer.client().native_ptr(), topic.as_ptr(), partition)
    };
    let Some(partition_queue) = NonNull::new(partition_queue) else {
        return false;
    };
    // SAFETY: `partition_queue` is a valid reference and `to` a valid queue
    // of the caller's or null. The forwarding lives on the partition's
    // queue itself, so the reference taken above is released at once.
    unsafe {
        rd::rd_kafka_queue_forward(partition_queue.as_ptr(), to);
        rd::rd_kafka_queue_destroy(partition_queue.as_ptr());
    }
    true
}
