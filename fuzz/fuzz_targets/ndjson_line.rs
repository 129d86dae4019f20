//! The file source's NDJSON line check against serde_json, on any bytes:
//! it never says "surely one JSON value" of a line serde_json refuses
//! (once the line is UTF-8), and says "ASCII" exactly when it is sure
//! and every byte is.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| etl_fuzz::ndjson_line(data));
