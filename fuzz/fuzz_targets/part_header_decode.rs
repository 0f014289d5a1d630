//! A part file's header is read back from disk, where anything may have changed it:
//! any bytes decode to a header or an error (no panic, no huge allocation), and a
//! decoded header survives a round trip. Each input is also decoded with its header
//! checksum made right, so the fuzzer reaches the field checks behind the CRC. The
//! module is compiled from the daemon's own source file, so the fuzz build need not
//! instrument the whole daemon.
#![no_main]

#[allow(dead_code)]
#[path = "../../src/cache/part_file.rs"]
mod part_file;

use libfuzzer_sys::fuzz_target;
use part_file::PartHeader;

fn check(bytes: &[u8]) {
    if let Ok(header) = PartHeader::decode(bytes) {
        let again = PartHeader::decode(&header.encode()).expect("an encoded header decodes");
        assert_eq!(again, header);
    }
}

fuzz_target!(|bytes: &[u8]| {
    check(bytes);
    // The declared header length is at bytes 12..16, its CRC32C in its last 4 bytes.
    let Some(declared) = bytes.get(12..16) else {
        return;
    };
    let len = u32::from_le_bytes(declared.try_into().unwrap()) as usize;
    if (4..=bytes.len()).contains(&len) {
        let mut fixed = bytes.to_vec();
        let crc = crc32c::crc32c(&fixed[..len - 4]);
        fixed[len - 4..len].copy_from_slice(&crc.to_le_bytes());
        check(&fixed);
    }
});
