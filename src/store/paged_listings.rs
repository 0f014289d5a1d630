//! Delimited listings read a page at a time, no further than the catalog takes.
//!
//! object_store's `list_with_delimiter` gathers every page of a listing before it
//! returns: a store that pages a listing without end, or lists millions of entries,
//! grows the daemon by each page for as long as the operation's deadline lets it. Where
//! the store lists a page at a time (`PaginatedListStore`: S3 and GCS), the hook
//! [`PagedListings`] walks the pages itself and stops once it holds more than
//! [`MAX_LISTED_ENTRIES`]: a result longer than the cap, which the catalog refuses
//! (EIO), so that no more than the cap and one page is ever held. A local folder and HTTP (WebDAV) list through
//! object_store's gathering, bounded by the deadline only: object_store 0.14 pages
//! neither. Each page that brings entries ticks the listing's watch
//! ([`super::listing_progress`]): its waiters wait as long as pages keep coming.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use object_store::list::{PaginatedListOptions, PaginatedListStore};
use object_store::path::{Path, DELIMITER};
use object_store::{ListResult, ObjectStore, Result};

use super::listing_progress::ListingProgress;
use super::wrapper::StoreHook;

/// The most entries one listing may hold: a directory's objects and subdirectories, or
/// the objects under a chunked dataset's prefix. The catalog keeps a node per entry for
/// the mount's life, so a store that lists without end, or lists more than any dataset
/// holds (a chunked dataset of 300,000 chunks lists 900,000 objects), gets EIO.
pub const MAX_LISTED_ENTRIES: usize = 1 << 20;

/// The hook that walks a store's delimited listings page by page, up to just past
/// [`MAX_LISTED_ENTRIES`], through the store's own `PaginatedListStore`.
pub struct PagedListings {
    pages: Arc<dyn PaginatedListStore>,
}

impl PagedListings {
    pub fn new(pages: Arc<dyn PaginatedListStore>) -> Self {
        PagedListings { pages }
    }
}

impl fmt::Debug for PagedListings {
    // The store's name in messages, not the client's configuration.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Paged")
    }
}

#[async_trait]
impl StoreHook for PagedListings {
    async fn list_with_delimiter(
        &self,
        _inner: &dyn ObjectStore,
        prefix: Option<&Path>,
    ) -> Result<ListResult> {
        // As object_store's own gathering asks: the prefix as a directory.
        let prefix = prefix
            .filter(|p| !p.as_ref().is_empty())
            .map(|p| format!("{p}{DELIMITER}"));
        let mut common_prefixes = BTreeSet::new();
        let mut objects = Vec::new();
        let mut extensions = http::Extensions::new();
        let mut page_token = None;
        loop {
            let page = self
                .pages
                .list_paginated(
                    prefix.as_deref(),
                    PaginatedListOptions {
                        delimiter: Some(DELIMITER.into()),
                        page_token,
                        ..Default::default()
                    },
                )
                .await?;
            if !(page.result.common_prefixes.is_empty() && page.result.objects.is_empty()) {
                ListingProgress::advanced();
            }
            common_prefixes.extend(page.result.common_prefixes);
            objects.extend(page.result.objects);
            extensions.extend(page.result.extensions);
            page_token = page.page_token;
            if page_token.is_none() || common_prefixes.len() + objects.len() > MAX_LISTED_ENTRIES {
                return Ok(ListResult {
                    common_prefixes: common_prefixes.into_iter().collect(),
                    objects,
                    extensions,
                });
            }
        }
    }
}
