//! The PostgreSQL connection-string parser on any text: it never panics,
//! what it hands tokio-postgres reads back as the same parameters, and
//! no value it read shows in its `Debug`.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| etl_fuzz::conninfo(data));
