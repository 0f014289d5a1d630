//! A test double that counts ranged reads per object and range, to prove that each part
//! is downloaded once however many readers want it. A GET answered "no such object"
//! reads nothing and is not counted, nor is one abandoned before its answer: a
//! directory's look for a manifest it does not have (`catalog/tree/manifest.rs`) is no
//! read of the objects a test counts, and neither is a HEAD (the version of one object
//! the manifest's mount compares with the store's).

use std::collections::HashMap;
use std::ops::Range;

use async_trait::async_trait;
use object_store::{GetRange, GetResult, Result};
use parking_lot::Mutex;

use super::wrapper::{GetRequest, StoreHook};

/// An object key and the byte range asked for (`None`: the whole object).
pub type ReadKey = (String, Option<Range<u64>>);

/// Counts reads by (object, requested range).
#[derive(Debug, Default)]
pub struct CountReads {
    counts: Mutex<HashMap<ReadKey, u64>>,
}

impl CountReads {
    /// Every (object, range) read so far with its count.
    pub fn snapshot(&self) -> HashMap<ReadKey, u64> {
        self.counts.lock().clone()
    }

    pub fn total(&self) -> u64 {
        self.counts.lock().values().sum()
    }
}

#[async_trait]
impl StoreHook for CountReads {
    async fn get(&self, request: GetRequest<'_>) -> Result<GetResult> {
        if request.options.head {
            return request.send().await;
        }
        let range = match &request.options.range {
            Some(GetRange::Bounded(r)) => Some(r.clone()),
            _ => None,
        };
        // Counted as it is sent (a test may wait for a request the store holds back),
        // and taken back if it reads nothing.
        let key = (request.location.to_string(), range);
        *self.counts.lock().entry(key.clone()).or_default() += 1;
        let mut unread = Unread {
            counts: &self.counts,
            key: Some(key),
        };
        let answer = request.send().await;
        if !matches!(answer, Err(object_store::Error::NotFound { .. })) {
            unread.key = None;
        }
        answer
    }
}

/// A read counted as sent, taken back when dropped unless it read something
/// (`key` cleared).
struct Unread<'a> {
    counts: &'a Mutex<HashMap<ReadKey, u64>>,
    key: Option<ReadKey>,
}

impl Drop for Unread<'_> {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else {
            return;
        };
        let mut counts = self.counts.lock();
        if let Some(count) = counts.get_mut(&key) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&key);
            }
        }
    }
}
