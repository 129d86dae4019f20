//! Exactly-once progress, stored in the object store after the data.
//!
//! One small JSON object per partition, `PREFIX/partition-N.json`, says
//! where the partition's next object starts. It is written after the data
//! objects of each write, so the store always holds at least what its
//! progress says; at most the objects of one write lie past it, and the
//! replay that follows a crash there writes them again under the same keys
//! (see `docs/object-storage.md`).

use std::sync::Arc;

use bytes::Bytes;
use etl_record::{Offset, PartitionId};
use etl_sink::{Progress, SinkError};
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{GetOptions, ObjectStore, PutOptions};
use serde::{Deserialize, Serialize};

use crate::error::classify;

/// What a progress object holds.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    partition: u32,
    next_offset: i64,
    /// The key of the last object written, for a human.
    last_object: String,
    /// The key template of the sink that wrote it: another template's
    /// objects are not this sink's, whatever the offsets say.
    #[serde(default)]
    key: Option<String>,
}

/// Where the progress objects of one sink live. `Debug` by hand: the
/// store's own prints its credentials.
pub(crate) struct ProgressStore {
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) prefix: Path,
    /// The sink's key template, as configured.
    pub(crate) key: String,
    pub(crate) sink: String,
    pub(crate) location: String,
}

impl std::fmt::Debug for ProgressStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProgressStore")
            .field("prefix", &self.prefix)
            .field("sink", &self.sink)
            .field("location", &self.location)
            .finish_non_exhaustive()
    }
}

impl ProgressStore {
    fn path(&self, partition: PartitionId) -> Path {
        self.prefix
            .clone()
            .join(format!("partition-{}.json", partition.0))
    }

    /// Store that `partition`'s next object starts at `next`.
    pub(crate) async fn store(
        &self,
        partition: PartitionId,
        next: Offset,
        last_object: &str,
    ) -> Result<(), SinkError> {
        let path = self.path(partition);
        let body = serde_json::to_vec(&Stored {
            partition: partition.0,
            next_offset: next.0,
            last_object: last_object.to_owned(),
            key: Some(self.key.clone()),
        })
        .map_err(SinkError::permanent)?;
        self.store
            .put_opts(&path, Bytes::from(body).into(), PutOptions::default())
            .await
            .map(drop)
            .map_err(|e| classify("put", &self.sink, &self.location, path.as_ref(), e))
    }

    /// Every partition's stored progress.
    pub(crate) async fn load(&self) -> Result<Progress, SinkError> {
        let metas: Vec<_> = self
            .store
            .list(Some(&self.prefix))
            .try_collect()
            .await
            .map_err(|e| classify("list", &self.sink, &self.location, self.prefix.as_ref(), e))?;
        let mut progress = Progress::new();
        for meta in metas {
            let key = meta.location.to_string();
            let bytes = self
                .store
                .get_opts(&meta.location, GetOptions::default())
                .await
                .map_err(|e| classify("read", &self.sink, &self.location, &key, e))?
                .bytes()
                .await
                .map_err(|e| classify("read", &self.sink, &self.location, &key, e))?;
            let stored: Stored =
                serde_json::from_slice(&bytes).map_err(|e| SinkError::CorruptProgress {
                    path: format!("{}/{key}", self.location).into(),
                    reason: format!("not a progress object of this sink: {e}"),
                })?;
            if meta.location != self.path(PartitionId(stored.partition)) {
                return Err(SinkError::CorruptProgress {
                    path: format!("{}/{key}", self.location).into(),
                    reason: format!("it holds partition {}'s progress", stored.partition),
                });
            }
            if let Some(theirs) = stored.key.as_ref().filter(|k| **k != self.key) {
                return Err(SinkError::CorruptProgress {
                    path: format!("{}/{key}", self.location).into(),
                    reason: format!(
                        "it is the progress of a sink whose key is {theirs:?}, not {:?}: its \
                         offsets say nothing of this sink's objects; give this sink its own \
                         `progress_prefix`",
                        self.key
                    ),
                });
            }
            progress.advance(PartitionId(stored.partition), Offset(stored.next_offset));
        }
        Ok(progress)
    }
}
