//! How far a listing under way has come, so that whoever waits for it can tell a long
//! listing from a stalled one.
//!
//! A listing of many pages (a chunked dataset of 10,000 chunks lists 30,000 objects in
//! 30 pages and more) takes as long as its pages together, longer than one operation's
//! deadline: a caller that gave up at the deadline while the pages kept coming made a
//! large dataset's first `ls` fail with EIO every time. The catalog runs each listing
//! inside [`ListingProgress::watching`], and whatever brings entries of it ticks the
//! watch ([`ListingProgress::advanced`]): the paged delimited listings
//! ([`super::paged_listings`]) once per page, the catalog's recursive listings once per
//! entry. A page without entries (a store that pages without end) is no progress.
//!
//! The watch is the listing task's own (a task-local), so that the store's hooks, which
//! know nothing of the catalog's tasks, tick the listing they work for and no other.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

tokio::task_local! {
    static WATCH: Arc<ListingProgress>;
}

/// When a listing under way last brought entries.
#[derive(Debug)]
pub struct ListingProgress {
    started: Instant,
    /// Milliseconds from `started` to the last entries brought.
    last: AtomicU64,
}

impl ListingProgress {
    /// The watch of a listing starting now.
    pub fn new() -> Arc<ListingProgress> {
        Arc::new(ListingProgress {
            started: Instant::now(),
            last: AtomicU64::new(0),
        })
    }

    /// Runs `listing` with this watch as the one its ticks go to.
    pub async fn watching<F: Future>(self: Arc<Self>, listing: F) -> F::Output {
        WATCH.scope(self, listing).await
    }

    /// Tells the listing the current task runs, if it runs one, that entries came.
    pub fn advanced() {
        let _ = WATCH.try_with(|watch| {
            let since = watch.started.elapsed().as_millis() as u64;
            watch.last.fetch_max(since, Ordering::Relaxed);
        });
    }

    /// When the listing last brought entries (when it started, if it brought none yet).
    pub fn last_advance(&self) -> Instant {
        self.started + Duration::from_millis(self.last.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_tick_reaches_the_watch_of_its_own_task_only() {
        let watched = ListingProgress::new();
        let other = ListingProgress::new();
        tokio::time::advance(Duration::from_secs(3)).await;
        ListingProgress::advanced(); // outside any listing: no watch to tick
        watched
            .clone()
            .watching(async { ListingProgress::advanced() })
            .await;
        assert_eq!(
            watched.last_advance(),
            watched.started + Duration::from_secs(3)
        );
        assert_eq!(
            other.last_advance(),
            other.started,
            "another listing's watch is left alone"
        );
    }
}
