//! Uploading one object: a single PUT, or a multipart upload that is
//! aborted if it fails or is abandoned, so it leaves no orphaned parts;
//! an abandoned one's abort runs as a task the sink owns and its stop
//! waits for.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{MultipartUpload, ObjectStore, PutMultipartOptions, PutOptions, PutPayload};
use tokio::sync::watch;

/// Parts uploaded at once.
const PARTS_AT_ONCE: usize = 4;

/// Upload `body` to `path`: in one PUT below `threshold` bytes, else in
/// parts of `part_size`. Returns once the store acknowledged the object
/// (the PUT or the completion returned). `Err` names the operation that
/// failed. A multipart upload dropped mid-way is aborted by a task handed
/// to `aborts`.
pub(crate) async fn upload(
    store: &dyn ObjectStore,
    path: &Path,
    body: Bytes,
    threshold: usize,
    part_size: usize,
    aborts: &Aborts,
) -> Result<(), (&'static str, object_store::Error)> {
    if body.len() < threshold {
        return store
            .put_opts(path, PutPayload::from(body), PutOptions::default())
            .await
            .map(drop)
            .map_err(|e| ("put", e));
    }
    let mut upload = AbortOnDrop {
        upload: Some(
            store
                .put_multipart_opts(path, PutMultipartOptions::default())
                .await
                .map_err(|e| ("start a multipart upload of", e))?,
        ),
        aborts,
    };
    let parts: Vec<_> = {
        let Some(u) = upload.upload.as_mut() else {
            return Ok(());
        };
        let mut parts = Vec::new();
        let mut at = 0;
        while at < body.len() {
            let end = (at + part_size.max(1)).min(body.len());
            parts.push(u.put_part(PutPayload::from(body.slice(at..end))));
            at = end;
        }
        parts
    };
    let sent = futures::stream::iter(parts)
        .buffer_unordered(PARTS_AT_ONCE)
        .try_collect::<Vec<()>>()
        .await;
    if let Err(e) = sent {
        upload.abort().await;
        return Err(("upload a part of", e));
    }
    let completed = match upload.upload.as_mut() {
        Some(u) => u.complete().await,
        None => return Ok(()),
    };
    match completed {
        Ok(_) => {
            upload.upload = None;
            Ok(())
        }
        Err(e) => {
            upload.abort().await;
            Err(("complete the multipart upload of", e))
        }
    }
}

/// How long a stop waits, at most, for the aborts of the multipart
/// uploads the sink gave up ([`Aborts::settle`]): the sink's
/// [`settle_time`](etl_sink::Sink::settle_time).
pub(crate) const ABORT_SETTLE: Duration = Duration::from_secs(1);

/// The aborts of the multipart uploads a sink's dropped writes gave up:
/// tasks the sink owns, counted until each ends (done, failed, or dropped
/// with its runtime), so that the sink's stop can wait for them all at
/// once ([`settle`](Self::settle)) before the runtime that runs them ends.
#[derive(Debug)]
pub(crate) struct Aborts {
    pending: Arc<watch::Sender<usize>>,
}

impl Default for Aborts {
    fn default() -> Self {
        Aborts {
            pending: Arc::new(watch::channel(0).0),
        }
    }
}

impl Aborts {
    /// Abort `upload` in a task of its own, counted while it runs; never
    /// waits. Outside a runtime there is nothing to run it on: the
    /// upload's parts stay until the bucket's lifecycle rule removes them.
    fn spawn(&self, mut upload: Box<dyn MultipartUpload>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                "a multipart upload abandoned outside a runtime cannot be aborted; its parts stay until the bucket's lifecycle rule removes them"
            );
            return;
        };
        let counted = Pending::new(self.pending.clone());
        runtime.spawn(async move {
            let _counted = counted;
            if let Err(e) = upload.abort().await {
                tracing::warn!(error = %e, "cannot abort an abandoned multipart upload; its parts stay until the bucket's lifecycle rule removes them");
            }
        });
    }

    /// Wait until no abort is under way.
    pub(crate) async fn settle(&self) {
        let mut pending = self.pending.subscribe();
        // `Err` only once the sender is gone, and `self` holds it.
        let _ = pending.wait_for(|&n| n == 0).await;
    }
}

/// One abort under way, counted in [`Aborts`] until it is dropped: by its
/// task's end, or with the task when the runtime drops it.
struct Pending(Arc<watch::Sender<usize>>);

impl Pending {
    fn new(pending: Arc<watch::Sender<usize>>) -> Self {
        pending.send_modify(|n| *n += 1);
        Pending(pending)
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// A multipart upload that is aborted unless it completed: explicitly
/// after a failure, or, when the write is dropped mid-way (a write
/// timeout, a stop past its deadline), by a task handed to the sink's
/// [`Aborts`]. The drop never waits: the sink's stop waits for the task
/// ([`Aborts::settle`]), within its own settle time.
struct AbortOnDrop<'a> {
    upload: Option<Box<dyn MultipartUpload>>,
    aborts: &'a Aborts,
}

impl AbortOnDrop<'_> {
    async fn abort(&mut self) {
        if let Some(mut u) = self.upload.take()
            && let Err(e) = u.abort().await
        {
            tracing::warn!(error = %e, "cannot abort a failed multipart upload; its parts stay until the bucket's lifecycle rule removes them");
        }
    }
}

impl Drop for AbortOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(upload) = self.upload.take() {
            self.aborts.spawn(upload);
        }
    }
}

impl std::fmt::Debug for AbortOnDrop<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AbortOnDrop")
    }
}
