//! A store that fails on request, around a real one.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, UploadPart,
};

/// Fails the PUTs of keys starting with a prefix, or the parts of
/// multipart uploads, or holds those parts unanswered; counts aborted
/// uploads, and is slow to abort on request.
#[derive(Debug)]
pub(crate) struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    pub(crate) fail_puts_under: Mutex<Option<String>>,
    /// PUTs under `fail_puts_under` that still succeed before they fail.
    pub(crate) puts_before_failing: AtomicUsize,
    pub(crate) fail_parts: Arc<AtomicBool>,
    /// Parts that never get an answer (a store that stopped answering).
    pub(crate) hang_parts: Arc<AtomicBool>,
    /// Parts still answered before `hang_parts` takes effect.
    pub(crate) parts_before_hanging: Arc<AtomicUsize>,
    /// Parts held unanswered so far.
    pub(crate) hung: Arc<AtomicUsize>,
    pub(crate) aborted: Arc<AtomicUsize>,
    /// How long an abort waits before it is sent (a slow store).
    pub(crate) abort_delay: Arc<Mutex<Duration>>,
    /// The most aborts under way at one time.
    pub(crate) most_aborting: Arc<AtomicUsize>,
    /// Aborts under way now.
    pub(crate) aborting: Arc<AtomicUsize>,
    /// How long a PUT takes on its way to the store (a slow network).
    pub(crate) put_delay: Mutex<Duration>,
    /// PUTs slowed so far (counted as their delay begins).
    pub(crate) puts_slowed: AtomicUsize,
}

impl FaultyStore {
    pub(crate) fn new(inner: Arc<dyn ObjectStore>) -> Self {
        FaultyStore {
            inner,
            fail_puts_under: Mutex::new(None),
            puts_before_failing: AtomicUsize::new(0),
            fail_parts: Arc::new(AtomicBool::new(false)),
            hang_parts: Arc::new(AtomicBool::new(false)),
            parts_before_hanging: Arc::new(AtomicUsize::new(0)),
            hung: Arc::new(AtomicUsize::new(0)),
            aborted: Arc::new(AtomicUsize::new(0)),
            abort_delay: Arc::new(Mutex::new(Duration::ZERO)),
            most_aborting: Arc::new(AtomicUsize::new(0)),
            aborting: Arc::new(AtomicUsize::new(0)),
            put_delay: Mutex::new(Duration::ZERO),
            puts_slowed: AtomicUsize::new(0),
        }
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

fn injected(path: &Path) -> object_store::Error {
    object_store::Error::Generic {
        store: "FaultyStore",
        source: format!("injected failure writing {path}").into(),
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let fail = self
            .fail_puts_under
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(|p| location.as_ref().starts_with(p.as_str()));
        let spared = fail
            && self
                .puts_before_failing
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if fail && !spared {
            return Err(injected(location));
        }
        let delay = *self.put_delay.lock().unwrap();
        if !delay.is_zero() {
            self.puts_slowed.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(delay).await;
        }
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        let inner = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(FaultyUpload {
            inner,
            location: location.clone(),
            fail_parts: self.fail_parts.clone(),
            hang_parts: self.hang_parts.clone(),
            parts_before_hanging: self.parts_before_hanging.clone(),
            hung: self.hung.clone(),
            aborted: self.aborted.clone(),
            abort_delay: self.abort_delay.clone(),
            most_aborting: self.most_aborting.clone(),
            aborting: self.aborting.clone(),
        }))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

#[derive(Debug)]
struct FaultyUpload {
    inner: Box<dyn MultipartUpload>,
    location: Path,
    fail_parts: Arc<AtomicBool>,
    hang_parts: Arc<AtomicBool>,
    parts_before_hanging: Arc<AtomicUsize>,
    hung: Arc<AtomicUsize>,
    aborted: Arc<AtomicUsize>,
    abort_delay: Arc<Mutex<Duration>>,
    most_aborting: Arc<AtomicUsize>,
    aborting: Arc<AtomicUsize>,
}

#[async_trait]
impl MultipartUpload for FaultyUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        if self.fail_parts.load(Ordering::SeqCst) {
            let err = injected(&self.location);
            return Box::pin(async move { Err(err) });
        }
        let spared = || {
            self.parts_before_hanging
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        };
        if self.hang_parts.load(Ordering::SeqCst) && !spared() {
            self.hung.fetch_add(1, Ordering::SeqCst);
            return Box::pin(futures::future::pending());
        }
        self.inner.put_part(data)
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        self.inner.complete().await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.aborted.fetch_add(1, Ordering::SeqCst);
        let now = self.aborting.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_aborting.fetch_max(now, Ordering::SeqCst);
        let delay = *self.abort_delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        let aborted = self.inner.abort().await;
        self.aborting.fetch_sub(1, Ordering::SeqCst);
        aborted
    }
}
