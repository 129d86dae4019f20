//! The object-store sink against real stores: a local folder, Garage, a
//! real S3 server (built once per machine and started by the tests), and
//! Azurite, Microsoft's Azure Blob Storage emulator (installed once per
//! machine from npm and started by the tests), every object read back by
//! pyarrow.

// Test helpers may unwrap: a panic there is a failed test.
#![allow(clippy::unwrap_used)]

mod azure;
mod faults;
mod garage;
mod handover;
mod local;
mod outage;
mod pipeline;
mod process;
mod stop;
mod support;
mod throttle;
