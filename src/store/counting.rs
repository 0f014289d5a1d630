//! A test double that counts ranged reads per object and range, to prove that each part
//! is downloaded once however many readers want it.

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
        let range = match &request.options.range {
            Some(GetRange::Bounded(r)) => Some(r.clone()),
            _ => None,
        };
        *self
            .counts
            .lock()
            .entry((request.location.to_string(), range))
            .or_default() += 1;
        request.send().await
    }
}
