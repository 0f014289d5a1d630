//! `header.sch` from a bucket is untrusted: decoding any bytes returns a header or an
//! error (no panic, no huge allocation), and a decoded header survives a round trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use scdl_format::Header;

fuzz_target!(|bytes: &[u8]| {
    if let Ok(header) = Header::decode(bytes) {
        let again = Header::decode(&header.encode()).expect("an encoded header decodes");
        assert_eq!(again, header);
    }
});
