//! The object-store sink against real stores: a local folder and moto's
//! S3 server, every object read back by pyarrow.

// Test helpers may unwrap: a panic there is a failed test.
#![allow(clippy::unwrap_used)]

mod faults;
mod local;
mod pipeline;
mod s3;
mod support;
mod throttle;
