//! The synchronization primitives this crate uses: `std`'s normally, loom's
//! under `--cfg etl_loom`. Nothing else in the crate imports `std::sync`
//! directly.

#[cfg(etl_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, Ordering};
#[cfg(etl_loom)]
pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};
#[cfg(not(etl_loom))]
pub(crate) use std::sync::atomic::{AtomicBool, Ordering};
#[cfg(not(etl_loom))]
pub(crate) use std::sync::{Arc, Mutex, MutexGuard};

/// Lock, ignoring poisoning: every critical section here leaves the state
/// consistent before anything that could panic.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
