//! The synchronization primitives this crate uses: `std`'s normally, loom's
//! under `--cfg etl_loom`, so the model checker sees every atomic access.
//! Nothing else in the crate imports `std::sync` directly.

#[cfg(etl_loom)]
pub(crate) use loom::sync::{
    Arc, Mutex, MutexGuard,
    atomic::{AtomicU8, Ordering},
};
#[cfg(not(etl_loom))]
pub(crate) use std::sync::{
    Arc, Mutex, MutexGuard,
    atomic::{AtomicU8, Ordering},
};

/// Lock `mutex`, taking the data of a poisoned one as it is: every
/// critical section of this crate leaves its data whole.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
