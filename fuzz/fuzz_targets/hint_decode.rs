//! Hint files are written by any process that may open them: any bytes, written in
//! pieces of any size, are decoded to lines or refused (no panic), and a refused piece
//! leaves the decoder as it was.
#![no_main]

use libfuzzer_sys::fuzz_target;
use scdl_format::hint::HintDecoder;

fuzz_target!(|input: &[u8]| {
    // The first byte sets the write size, the rest is the written stream (in at most
    // 64 writes: a decoder keeps a partial line, so tiny writes of a long stream cost
    // quadratic time without finding more).
    let Some((&piece_len, stream)) = input.split_first() else {
        return;
    };
    let piece_len = usize::from(piece_len).max(stream.len() / 64).max(1);
    let mut decoder = HintDecoder::default();
    for piece in stream.chunks(piece_len) {
        let before = decoder.clone();
        if decoder.feed(piece).is_err() {
            assert_eq!(
                format!("{decoder:?}"),
                format!("{before:?}"),
                "a refused write changed the decoder"
            );
        }
    }
});
