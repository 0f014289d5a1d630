//! A part file's header is read back from disk, where anything may have changed it:
//! any bytes decode to a header or an error (no panic, no huge allocation), and a
//! decoded header survives a round trip. The module is compiled from the daemon's own
//! source file, so the fuzz build need not instrument the whole daemon.
#![no_main]

#[allow(dead_code)]
#[path = "../../src/cache/part_file.rs"]
mod part_file;

use libfuzzer_sys::fuzz_target;
use part_file::PartHeader;

fuzz_target!(|bytes: &[u8]| {
    if let Ok(header) = PartHeader::decode(bytes) {
        let again = PartHeader::decode(&header.encode()).expect("an encoded header decodes");
        assert_eq!(again, header);
    }
});
