//! Uploading one object: a single PUT, or a multipart upload that is
//! aborted if it fails or is abandoned, so it leaves no orphaned parts;
//! an abandoned one's abort is waited for before its drop returns.

use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{MultipartUpload, ObjectStore, PutMultipartOptions, PutOptions, PutPayload};
use tokio::runtime::RuntimeFlavor;

/// Parts uploaded at once.
const PARTS_AT_ONCE: usize = 4;

/// Upload `body` to `path`: in one PUT below `threshold` bytes, else in
/// parts of `part_size`. Returns once the store acknowledged the object
/// (the PUT or the completion returned). `Err` names the operation that
/// failed. A multipart upload dropped mid-way waits for its abort within
/// `window`.
pub(crate) async fn upload(
    store: &dyn ObjectStore,
    path: &Path,
    body: Bytes,
    threshold: usize,
    part_size: usize,
    window: &AbortWindow,
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
        window,
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

/// How long the drop of an abandoned multipart upload waits for its
/// abort, at most, for all the uploads a sink abandons at once.
const ABORT_WAIT: Duration = Duration::from_secs(1);

/// The window in which a sink's abandoned uploads wait for their aborts:
/// opened by the first one dropped, shared by those dropped while it is
/// open, so that a write abandoning many uploads to a store that no longer
/// answers holds the stop [`ABORT_WAIT`] at most, not that once per upload.
#[derive(Debug, Default)]
pub(crate) struct AbortWindow(Mutex<Option<Instant>>);

impl AbortWindow {
    /// Until when an upload dropped now waits for its abort.
    fn deadline(&self) -> Instant {
        let mut open = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        match *open {
            Some(until) if until > now => until,
            _ => *open.insert(now + ABORT_WAIT),
        }
    }
}

/// A multipart upload that is aborted unless it completed: explicitly
/// after a failure, or when the write is dropped mid-way (a write
/// timeout, a stop past its deadline) by a task of its own that the drop
/// waits for, within the sink's [`AbortWindow`].
///
/// The wait is what makes the abort happen at all when the write is
/// dropped because the run ends: the `etl` command shuts its runtime down
/// right after the stop, and a task merely spawned would be dropped with
/// it, its request never sent, the upload's parts left on the server. The
/// wait leaves the worker thread to the runtime's other tasks
/// (`block_in_place`), so the abort runs meanwhile. On a current-thread
/// runtime the drop cannot wait (the abort would need the very thread it
/// blocks): the abort is only spawned there.
struct AbortOnDrop<'a> {
    upload: Option<Box<dyn MultipartUpload>>,
    window: &'a AbortWindow,
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
        let Some(mut u) = self.upload.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                "a multipart upload abandoned outside a runtime cannot be aborted; its parts stay until the bucket's lifecycle rule removes them"
            );
            return;
        };
        // Answered when the abort is done, or dropped with its task (a
        // runtime shutting down): either ends the wait.
        let (done, aborted) = std::sync::mpsc::sync_channel::<()>(1);
        runtime.spawn(async move {
            if let Err(e) = u.abort().await {
                tracing::warn!(error = %e, "cannot abort an abandoned multipart upload; its parts stay until the bucket's lifecycle rule removes them");
            }
            let _ = done.send(());
        });
        if runtime.runtime_flavor() != RuntimeFlavor::MultiThread {
            return;
        }
        let deadline = self.window.deadline();
        tokio::task::block_in_place(|| {
            let left = deadline.saturating_duration_since(Instant::now());
            if let Err(RecvTimeoutError::Timeout) = aborted.recv_timeout(left) {
                tracing::warn!(waited = ?ABORT_WAIT, "the abort of an abandoned multipart upload did not answer in time; its parts may stay until the bucket's lifecycle rule removes them");
            }
        });
    }
}

impl std::fmt::Debug for AbortOnDrop<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AbortOnDrop")
    }
}
