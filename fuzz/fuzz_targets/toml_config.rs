//! The TOML configuration loader on any text: it gives a configuration
//! or problems, and never panics.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| etl_fuzz::toml_config(data));
