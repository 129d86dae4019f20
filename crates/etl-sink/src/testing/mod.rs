//! Sinks for tests: an in-memory sink, fault injectors (fail every Nth
//! write, fail the writes holding chosen records, fail every write, fail
//! a seeded fraction transiently, reject chosen records, hang, panic, run
//! slow, wait behind a gate) and a recording wrapper that journals every
//! call. Each wrapper passes on what its sink does besides writing
//! (`flush`, `settle_time`, `settle`), so a sink stops wrapped as it
//! would alone.
//!
//! The wrappers take an inner sink, so faults compose:
//! `Slow::new(Flaky::new(MemorySink::new(), 0.3, 7), delay)`.

mod faults;
mod gate;
mod memory;
mod recording;

pub use faults::{Broken, FailEveryNth, FailWhere, Flaky, Hang, Panic, Rejecting, Slow};
pub use gate::{Gate, Gated};
pub use memory::MemorySink;
pub use recording::{Event, Journal, Recording};
