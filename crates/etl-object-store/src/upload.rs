//! Uploading one object: a single PUT, or a multipart upload that is
//! aborted if it fails or is abandoned, so it leaves no orphaned parts.

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{MultipartUpload, ObjectStore, PutMultipartOptions, PutOptions, PutPayload};

/// Parts uploaded at once.
const PARTS_AT_ONCE: usize = 4;

/// Upload `body` to `path`: in one PUT below `threshold` bytes, else in
/// parts of `part_size`. Returns once the store acknowledged the object
/// (the PUT or the completion returned). `Err` names the operation that
/// failed.
pub(crate) async fn upload(
    store: &dyn ObjectStore,
    path: &Path,
    body: Bytes,
    threshold: usize,
    part_size: usize,
) -> Result<(), (&'static str, object_store::Error)> {
    if body.len() < threshold {
        return store
            .put_opts(path, PutPayload::from(body), PutOptions::default())
            .await
            .map(drop)
            .map_err(|e| ("put", e));
    }
    let mut upload = AbortOnDrop(Some(
        store
            .put_multipart_opts(path, PutMultipartOptions::default())
            .await
            .map_err(|e| ("start a multipart upload of", e))?,
    ));
    let parts: Vec<_> = {
        let Some(u) = upload.0.as_mut() else {
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
    let completed = match upload.0.as_mut() {
        Some(u) => u.complete().await,
        None => return Ok(()),
    };
    match completed {
        Ok(_) => {
            upload.0 = None;
            Ok(())
        }
        Err(e) => {
            upload.abort().await;
            Err(("complete the multipart upload of", e))
        }
    }
}

/// A multipart upload that is aborted unless it completed: explicitly
/// after a failure, or from a spawned task when the write is dropped
/// mid-way (a write timeout, a shutdown).
struct AbortOnDrop(Option<Box<dyn MultipartUpload>>);

impl AbortOnDrop {
    async fn abort(&mut self) {
        if let Some(mut u) = self.0.take()
            && let Err(e) = u.abort().await
        {
            tracing::warn!(error = %e, "cannot abort a failed multipart upload; its parts stay until the bucket's lifecycle rule removes them");
        }
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(mut u) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move {
                if let Err(e) = u.abort().await {
                    tracing::warn!(error = %e, "cannot abort an abandoned multipart upload");
                }
            });
        }
    }
}

impl std::fmt::Debug for AbortOnDrop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AbortOnDrop")
    }
}
