//! The PostgreSQL connection-string parser on any text: it never panics,
//! what it hands tokio-postgres reads back as the same parameters, and a
//! secret it read is not in the redacted text.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| etl_fuzz::conninfo(data));
