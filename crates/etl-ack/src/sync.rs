//! The synchronization primitives this crate uses: `std`'s normally, loom's
//! under `--cfg etl_loom`, so the model checker sees every atomic access.
//! Nothing else in the crate imports `std::sync` directly.

#[cfg(etl_loom)]
pub(crate) use loom::sync::{
    Arc,
    atomic::{AtomicU8, Ordering},
};
#[cfg(not(etl_loom))]
pub(crate) use std::sync::{
    Arc,
    atomic::{AtomicU8, Ordering},
};
