//! The transform fast paths against the general paths: a `remap`
//! program and a `condition` from the fast subset's grammar, and
//! declarative JSON steps, on a record of any bytes, give the same
//! outcome byte for byte whichever path decides.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| etl_fuzz::fast_paths(data));
