//! A part's bytes while its download is under way. Readers that need only some of a
//! part are answered as soon as the body has passed their bytes, not when the whole
//! part has arrived: a reader at the start of an 8 MiB part that shares the link with
//! fifteen others waits for a few pieces of its body, not for all of it.
//!
//! The body goes where the download sends it: into the part's cache file as it comes
//! ([`Arriving::spool_into`]: the usual case, which holds up to [`WRITE_BATCH`] of the
//! body in memory, the bytes not yet written, so that each blocking write is at least
//! that long), or into memory ([`Arriving::keep_in_memory`])
//! when the cache cannot take the part, then swapped for the whole part
//! ([`Arriving::finish`]). The download appends what it receives ([`Arriving::push`],
//! flushed at the end with [`Arriving::end`]); readers wait for the count of bytes
//! received to pass the end of their range, each woken once when it does (not at every
//! piece of the body), and take their range ([`Arriving::read`]): from the file what is
//! written, from memory the rest; a download that starts over takes back what it had
//! received, and its readers wait again. Whether the request is on the wire yet (it holds a
//! download slot) tells a reader whether waiting can pay at all, and the first reader
//! that asks for its own bytes beside the download claims it
//! ([`Arriving::claim_direct_read`]).

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::PartBytes;
use crate::cache::part_file::BLOCK_LEN;
use crate::cache::spool::Spool;
use crate::error::{FsError, FsResult};

/// The least a spooled body gathers in memory before writing it (whole blocks): a
/// body arrives in pieces of a few KiB, and a write per block was a round trip to the
/// blocking pool every 64 KiB.
pub const WRITE_BATCH: usize = 1 << 20;

pub struct Arriving {
    received: Mutex<Received>,
    body: Mutex<Body>,
    sent: AtomicBool,
    /// A reader has asked for its own bytes beside this download.
    direct_read_claimed: AtomicBool,
}

/// How many bytes of the part are readable, from its start, and the readers waiting
/// for more: each for the count to reach the end of its range.
#[derive(Default)]
struct Received {
    count: u64,
    waiting: Vec<(u64, oneshot::Sender<()>)>,
}

impl Received {
    /// Sets the count and wakes the readers whose bytes it reaches (and forgets those
    /// that stopped waiting).
    fn set(&mut self, count: u64) {
        self.count = count;
        for (_, arrived) in self.waiting.extract_if(.., |(end, _)| *end <= count) {
            // A reader that gave up is not there to tell.
            let _ = arrived.send(());
        }
        self.waiting.retain(|(_, arrived)| !arrived.is_closed());
    }
}

enum Body {
    /// The download has not chosen where the body goes yet.
    Unplaced,
    /// Into the part's cache file.
    Spooled(Spooling),
    Memory(BytesMut),
    Whole(Bytes),
}

/// A body on its way into the part's cache file: bytes `..on_disk` are written; then
/// come the bytes being written (`writing`), then those waiting for a whole block
/// (`pending`).
struct Spooling {
    spool: Arc<Spool>,
    on_disk: u64,
    writing: Bytes,
    pending: BytesMut,
    /// The buffer of the last batch written, taken back for the next one: a body is
    /// gathered in two buffers (one filling while the other is written), not in one
    /// allocation per batch.
    spare: Option<BytesMut>,
}

/// Where the bytes of a range of a spooled body are: all written to the file, or
/// copied from memory into `copy` but for its first `from_disk` bytes, to be read from
/// the file.
enum HeldBytes {
    Written(Arc<Spool>),
    PartlyInMemory {
        spool: Arc<Spool>,
        copy: Vec<u8>,
        from_disk: usize,
    },
}

impl Spooling {
    /// Bytes received so far, written or not.
    fn received(&self) -> u64 {
        self.on_disk + (self.writing.len() + self.pending.len()) as u64
    }

    /// Takes the next piece: returns the bytes received, and the whole blocks to write
    /// now (if any: once at least [`WRITE_BATCH`] are held), from the piece itself when
    /// it is that long and starts at a block boundary.
    fn take(&mut self, piece: Bytes) -> (u64, Option<(Arc<Spool>, Bytes)>) {
        debug_assert!(self.writing.is_empty(), "one write at a time");
        let block_len = BLOCK_LEN as usize;
        let received = self.received() + piece.len() as u64;
        if self.pending.is_empty() && piece.len() >= WRITE_BATCH {
            let whole = piece.len() / block_len * block_len;
            self.writing = piece.slice(..whole);
            self.pending.extend_from_slice(&piece[whole..]);
        } else {
            if self.pending.capacity() < self.batch_room() {
                // Into a batch's buffer, with what the body held before.
                let mut batch = self.batch_buffer();
                batch.extend_from_slice(&self.pending);
                self.pending = batch;
            }
            self.pending.extend_from_slice(&piece);
            if self.pending.len() >= WRITE_BATCH {
                let whole = self.pending.len() / block_len * block_len;
                // The bytes past the last whole block go on in the other buffer, so
                // that the batch's comes back whole, as the spare.
                let rest = self.pending.split_off(whole);
                let next = self.batch_buffer();
                let batch = std::mem::replace(&mut self.pending, next);
                self.pending.extend_from_slice(&rest);
                self.writing = batch.freeze();
            }
        }
        let blocks = (!self.writing.is_empty()).then(|| (self.spool.clone(), self.writing.clone()));
        (received, blocks)
    }

    /// The room a batch's buffer needs: a batch and the piece that completes it, or
    /// the rest of the part when that is less. A part of row offsets is 32 KiB for a
    /// chunk of 4,096 rows: with a batch's room each, the downloads of eight ranks'
    /// row offsets held 31 MB of buffers, nearly all of it never written.
    fn batch_room(&self) -> usize {
        let rest = self.spool.data_len().saturating_sub(self.on_disk) as usize;
        (WRITE_BATCH + BLOCK_LEN as usize).min(rest)
    }

    /// An empty buffer with room for a batch and the piece that completes it (or the
    /// rest of the part): the spare if there is one.
    fn batch_buffer(&mut self) -> BytesMut {
        let room = self.batch_room();
        let mut buffer = self.spare.take().unwrap_or_default();
        // No allocation when the spare is there: its room is reclaimed.
        buffer.reserve(room);
        buffer
    }

    /// The batch being written is on disk: its buffer becomes the spare, if nothing
    /// else holds it and it is a batch's (not a piece of the body written as it came).
    fn written(&mut self) {
        self.on_disk += self.writing.len() as u64;
        if let Ok(mut buffer) = std::mem::take(&mut self.writing).try_into_mut() {
            if buffer.capacity() <= WRITE_BATCH + BLOCK_LEN as usize {
                buffer.clear();
                self.spare = Some(buffer);
            }
        }
    }

    /// Bytes `range` as held now; `None` if they have not all arrived.
    fn bytes(&self, range: &Range<u64>) -> Option<HeldBytes> {
        if range.end <= self.on_disk {
            return Some(HeldBytes::Written(self.spool.clone()));
        }
        if range.end > self.received() {
            return None;
        }
        let mut copy = vec![0; (range.end - range.start) as usize];
        let from_disk = self.on_disk.saturating_sub(range.start) as usize;
        // From memory: `writing`, then `pending`, from `skip` bytes past the disk.
        let mut skip = (range.start.max(self.on_disk) - self.on_disk) as usize;
        let mut dest = &mut copy[from_disk..];
        for held in [&self.writing[..], &self.pending[..]] {
            if skip >= held.len() {
                skip -= held.len();
                continue;
            }
            let n = dest.len().min(held.len() - skip);
            dest[..n].copy_from_slice(&held[skip..skip + n]);
            dest = &mut dest[n..];
            skip = 0;
        }
        debug_assert!(dest.is_empty(), "the bytes held were counted");
        Some(HeldBytes::PartlyInMemory {
            spool: self.spool.clone(),
            copy,
            from_disk,
        })
    }
}

impl Default for Arriving {
    fn default() -> Self {
        Arriving {
            received: Mutex::default(),
            body: Mutex::new(Body::Unplaced),
            sent: AtomicBool::new(false),
            direct_read_claimed: AtomicBool::new(false),
        }
    }
}

impl Arriving {
    /// The request holds a download slot: its bytes are coming.
    pub fn mark_sent(&self) {
        self.sent.store(true, Ordering::Relaxed);
    }

    pub fn is_sent(&self) -> bool {
        self.sent.load(Ordering::Relaxed)
    }

    /// Whether the caller is the first to ask for its own bytes beside this download
    /// (and the only one that may).
    pub fn claim_direct_read(&self) -> bool {
        !self.direct_read_claimed.swap(true, Ordering::Relaxed)
    }

    pub fn received(&self) -> u64 {
        self.received.lock().count
    }

    /// Whether the body goes into a part file that failed a read of its written bytes
    /// ([`Spool::has_failed_a_read`]): readers ask the store for theirs instead.
    pub fn spool_failed_a_read(&self) -> bool {
        matches!(&*self.body.lock(), Body::Spooled(body) if body.spool.has_failed_a_read())
    }

    /// The body goes into `spool`, the part's cache file.
    pub fn spool_into(&self, spool: Arc<Spool>) {
        self.place(Body::Spooled(Spooling {
            spool,
            on_disk: 0,
            writing: Bytes::new(),
            pending: BytesMut::new(),
            spare: None,
        }));
    }

    /// The body of `len` bytes goes into memory, in one buffer that appending never
    /// moves.
    pub fn keep_in_memory(&self, len: usize) {
        self.place(Body::Memory(BytesMut::with_capacity(len)));
    }

    /// Starts the body over (a download that restarts elsewhere): readers wait for
    /// bytes from the start again. The count goes back to 0 under the body's lock, so
    /// a reader that finds its bytes gone ([`Arriving::bytes`]) finds the count reset
    /// too, and its next wait waits.
    fn place(&self, body: Body) {
        let mut held = self.body.lock();
        *held = body;
        self.received.lock().set(0);
    }

    /// Appends the next bytes of the body; returns how many have been received. A
    /// spooled body is written whole blocks at a time, at least [`WRITE_BATCH`] per
    /// write, off the runtime's threads; the whole blocks of a piece that long that
    /// starts at a block boundary are written from it without a copy.
    pub async fn push(&self, piece: Bytes) -> FsResult<u64> {
        let (received, blocks) = match &mut *self.body.lock() {
            Body::Spooled(body) => body.take(piece),
            Body::Memory(buffer) => {
                buffer.extend_from_slice(&piece);
                (buffer.len() as u64, None)
            }
            Body::Unplaced | Body::Whole(_) => unreachable!("a push before the body was placed"),
        };
        self.received.lock().set(received);
        if let Some((spool, blocks)) = blocks {
            self.write(spool, blocks).await?;
        }
        Ok(received)
    }

    /// Writes what a spooled body still holds in memory: the part's last bytes.
    pub async fn end(&self) -> FsResult<()> {
        let rest = match &mut *self.body.lock() {
            Body::Spooled(body) if !body.pending.is_empty() => {
                body.writing = body.pending.split().freeze();
                (body.spool.clone(), body.writing.clone())
            }
            _ => return Ok(()),
        };
        self.write(rest.0, rest.1).await
    }

    /// Writes `bytes`, the body's `writing`, into the spool; then they are read from
    /// there.
    async fn write(&self, spool: Arc<Spool>, bytes: Bytes) -> FsResult<()> {
        tokio::task::spawn_blocking(move || spool.write_next(&bytes))
            .await
            .map_err(|error| {
                FsError::CorruptData(format!("a part file write failed: {error}"))
            })??;
        if let Body::Spooled(body) = &mut *self.body.lock() {
            body.written();
        }
        Ok(())
    }

    /// The body received in memory as one buffer, handed to `keep` (which may wrap it,
    /// e.g. to count it against a budget); what `keep` returns is what readers slice
    /// from now.
    pub fn finish(&self, keep: impl FnOnce(Bytes) -> Bytes) -> Bytes {
        let mut body = self.body.lock();
        let whole = match std::mem::replace(&mut *body, Body::Unplaced) {
            Body::Memory(buffer) => keep(buffer.freeze()),
            Body::Whole(bytes) => bytes,
            Body::Unplaced | Body::Spooled(_) => unreachable!("finish of a body in memory"),
        };
        *body = Body::Whole(whole.clone());
        whole
    }

    /// Bytes `range` of the part, once they have been received. Never returns if the
    /// download fails first: wait for the download's end beside it. A download that
    /// starts over (its part file failed) takes back what it had received; the reader
    /// then waits for its bytes again.
    pub async fn read(&self, range: Range<u64>) -> FsResult<PartBytes> {
        loop {
            self.wait_for(range.end).await;
            if let Some(bytes) = self.bytes(range.clone())? {
                return Ok(bytes);
            }
        }
    }

    /// Waits until the first `end` bytes are readable.
    async fn wait_for(&self, end: u64) {
        let arrived = {
            let mut received = self.received.lock();
            if received.count >= end {
                return;
            }
            let (arrived, wait) = oneshot::channel();
            received.waiting.push((end, arrived));
            wait
        };
        // The sender is dropped only when sent (or with `self`, which outlives this).
        let _ = arrived.await;
    }

    /// Bytes `range` of the part if the body holds them now (`None` if it does not,
    /// or no longer does): the part's file, to be read from (checked) by the reader,
    /// if they are all written; otherwise a copy of them, from memory and the file.
    fn bytes(&self, range: Range<u64>) -> FsResult<Option<PartBytes>> {
        let offset = range.start;
        let (spool, mut copy, from_disk) = match &*self.body.lock() {
            Body::Spooled(body) => match body.bytes(&range) {
                None => return Ok(None),
                Some(HeldBytes::Written(spool)) => return Ok(Some(PartBytes::Spooled(spool))),
                Some(HeldBytes::PartlyInMemory {
                    spool,
                    copy,
                    from_disk,
                }) => (spool, copy, from_disk),
            },
            Body::Memory(buffer) if range.end <= buffer.len() as u64 => {
                return Ok(Some(PartBytes::InMemory {
                    offset,
                    bytes: Bytes::copy_from_slice(
                        &buffer[range.start as usize..range.end as usize],
                    ),
                }))
            }
            Body::Whole(bytes) if range.end <= bytes.len() as u64 => {
                return Ok(Some(PartBytes::InMemory {
                    offset,
                    bytes: bytes.slice(range.start as usize..range.end as usize),
                }))
            }
            Body::Unplaced | Body::Memory(_) | Body::Whole(_) => return Ok(None),
        };
        // The written bytes stay written: read outside the body's lock, which the
        // download takes for every piece.
        spool.read_exact_at(&mut copy[..from_disk], range.start)?;
        Ok(Some(PartBytes::InMemory {
            offset,
            bytes: copy.into(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn in_memory(bytes: PartBytes) -> Bytes {
        match bytes {
            PartBytes::InMemory { bytes, .. } => bytes,
            _ => panic!("bytes of a body in memory are in memory"),
        }
    }

    #[tokio::test]
    async fn a_reader_is_answered_once_its_bytes_have_arrived() {
        let arriving = Arc::new(Arriving::default());
        arriving.keep_in_memory(10);
        let reader = tokio::spawn({
            let arriving = arriving.clone();
            async move { in_memory(arriving.read(2..6).await.unwrap()) }
        });
        arriving.push(Bytes::from_static(&[0, 1, 2])).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!reader.is_finished(), "answered before its bytes arrived");
        assert_eq!(
            arriving
                .push(Bytes::from_static(&[3, 4, 5, 6]))
                .await
                .unwrap(),
            7
        );
        assert_eq!(&reader.await.unwrap()[..], &[2, 3, 4, 5]);
    }

    #[tokio::test]
    async fn after_the_finish_readers_slice_the_kept_whole() {
        let arriving = Arriving::default();
        arriving.keep_in_memory(3);
        arriving.push(Bytes::from_static(&[9, 8, 7])).await.unwrap();
        let whole = arriving.finish(|bytes| {
            assert_eq!(&bytes[..], &[9, 8, 7]);
            Bytes::from_static(&[1, 2, 3])
        });
        assert_eq!(&whole[..], &[1, 2, 3]);
        assert_eq!(&in_memory(arriving.read(1..3).await.unwrap())[..], &[2, 3]);
        arriving.wait_for(3).await;
    }

    /// A body of `len` bytes on its way into its part file in a fresh cache (which
    /// lives as long as the directory returned).
    fn spooled(len: usize) -> (tempfile::TempDir, Arc<Spool>, Arc<Arriving>) {
        use crate::cache::{CacheOwner, DiskCache, PartOrigin};
        use crate::parts::{ObjectId, PartKey};
        let dir = tempfile::tempdir().unwrap();
        let owner = CacheOwner {
            source: "s3://bucket/atlas".into(),
            endpoint: None,
            reset: false,
        };
        let cache = Arc::new(
            DiskCache::open(
                &crate::cache_dir_check::prepare(dir.path()).unwrap(),
                &owner,
                1 << 30,
                None,
            )
            .unwrap(),
        );
        let key = PartKey {
            object: ObjectId(1),
            index: 0,
        };
        let origin = PartOrigin {
            key: "k",
            etag: "e",
            object_offset: 0,
        };
        let spool = Arc::new(
            cache
                .spool(
                    key,
                    None,
                    origin,
                    len as u64,
                    crate::cache::Admission::Demand,
                )
                .unwrap(),
        );
        let arriving = Arc::new(Arriving::default());
        arriving.spool_into(spool.clone());
        (dir, spool, arriving)
    }

    #[tokio::test]
    async fn a_spooled_body_is_written_a_batch_of_blocks_at_a_time_and_read_from_the_part_file() {
        let block = BLOCK_LEN as usize;
        let batch = WRITE_BATCH;
        let data: Bytes = (0..batch + 2 * block + 300)
            .map(|i| (i % 241) as u8)
            .collect();
        let (_dir, spool, arriving) = spooled(data.len());
        let read = |range: Range<u64>| {
            let mut out = vec![0; (range.end - range.start) as usize];
            let bytes = arriving.bytes(range.clone()).unwrap().expect("received");
            bytes.copy_to(&mut out, range.start).unwrap();
            (matches!(bytes, PartBytes::Spooled(_)), out)
        };
        assert_eq!(arriving.push(data.slice(..1000)).await.unwrap(), 1000);
        assert_eq!(spool.written(), 0, "less than a batch is not written yet");
        assert_eq!(read(10..20), (false, data[10..20].to_vec()), "from memory");
        arriving.push(data.slice(1000..batch + 10)).await.unwrap();
        assert_eq!(
            spool.written(),
            batch as u64,
            "a batch of whole blocks is written"
        );
        assert_eq!(read(10..20), (true, data[10..20].to_vec()), "from the file");
        let across = batch as u64 - 5..batch as u64 + 5;
        assert_eq!(
            read(across),
            (false, data[batch - 5..batch + 5].to_vec()),
            "from both"
        );
        arriving.push(data.slice(batch + 10..)).await.unwrap();
        assert_eq!(
            spool.written(),
            batch as u64,
            "the rest, less than a batch, waits"
        );
        arriving.end().await.unwrap();
        assert_eq!(arriving.received(), data.len() as u64);
        assert_eq!(spool.written(), data.len() as u64);
        let tail = batch as u64..data.len() as u64;
        assert_eq!(read(tail), (true, data[batch..].to_vec()));
    }

    /// A part shorter than a batch is gathered in a buffer of its own length, not a
    /// batch's: the row offsets of a chunk of 4,096 rows are 32 KiB, and eight ranks'
    /// downloads of them held 31 MB in buffers of a batch each.
    #[tokio::test]
    async fn a_part_shorter_than_a_batch_is_gathered_in_a_buffer_of_its_length() {
        let len = 32 << 10;
        let data: Bytes = (0..len).map(|i| (i % 251) as u8).collect();
        let (_dir, spool, arriving) = spooled(len);
        for piece in data.chunks(5000) {
            arriving.push(data.slice_ref(piece)).await.unwrap();
            let Body::Spooled(body) = &*arriving.body.lock() else {
                unreachable!("spooled")
            };
            assert!(
                body.pending.capacity() <= len,
                "a buffer of {} bytes for a part of {len}",
                body.pending.capacity()
            );
        }
        arriving.end().await.unwrap();
        assert_eq!(spool.written(), len as u64);
    }

    /// A reader is told once, when the count reaches the end of its range; a count
    /// short of it does not wake it, and a count taken back (a restart) does not either.
    #[test]
    fn a_waiting_reader_is_woken_only_when_its_bytes_have_arrived() {
        let mut received = Received::default();
        let (arrived, mut wait) = oneshot::channel();
        received.waiting.push((100, arrived));
        received.set(99);
        assert!(matches!(
            wait.try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        ));
        received.set(0);
        assert!(matches!(
            wait.try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        ));
        received.set(100);
        assert!(wait.try_recv().is_ok());
        assert!(received.waiting.is_empty(), "a woken reader is forgotten");
        let (gave_up, wait) = oneshot::channel();
        received.waiting.push((500, gave_up));
        drop(wait);
        received.set(200);
        assert!(
            received.waiting.is_empty(),
            "a reader that gave up is forgotten"
        );
    }

    /// A download whose part file failed starts over into memory, taking back what it
    /// had received: a reader whose wait had just ended then finds an empty body. It
    /// waits for its bytes again (it used to slice the empty buffer, and panic).
    #[tokio::test]
    async fn a_reader_whose_bytes_a_restart_took_back_waits_for_them_again() {
        let arriving = Arc::new(Arriving::default());
        arriving.keep_in_memory(10);
        arriving
            .push(Bytes::from_static(&[0, 1, 2, 3, 4, 5]))
            .await
            .unwrap();
        arriving.wait_for(6).await;
        // The restart, between the reader's wait and its taking of the bytes.
        arriving.keep_in_memory(10);
        assert!(arriving.bytes(2..6).unwrap().is_none(), "no bytes held now");
        let reader = tokio::spawn({
            let arriving = arriving.clone();
            async move { in_memory(arriving.read(2..6).await.unwrap()) }
        });
        arriving.push(Bytes::from_static(&[9, 8, 7])).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !reader.is_finished(),
            "answered before its bytes arrived again"
        );
        arriving.push(Bytes::from_static(&[6, 5, 4])).await.unwrap();
        assert_eq!(&reader.await.unwrap()[..], &[7, 6, 5, 4]);
    }
}
