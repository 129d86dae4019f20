//! The JSON checking pass against serde_json: what it takes, serde_json
//! reads as an object with the same entries, and every nested object it
//! keeps is the text of an object the scanner reads the same way.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| etl_fuzz::json_check(data));
