//! A cache directory's source record (`source.json`) is read back from disk, where
//! anything may have changed it: any bytes decode to a record or to nothing (the cache
//! then says "an unreadable source record"), never a panic, and a decoded record
//! survives a round trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use scdlfs::cache::adopt::SourceRecord;

fuzz_target!(|bytes: &[u8]| {
    if let Some(record) = SourceRecord::decode(bytes) {
        let again = SourceRecord::decode(&record.encode()).expect("an encoded record decodes");
        assert_eq!(again, record);
        let _ = record.to_string();
    }
});
