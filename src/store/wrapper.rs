//! One delegating `ObjectStore` wrapper for all the test doubles, and for the daemon's
//! hooks (the timing of GETs in `mount::assemble`, [`super::short_answers`],
//! [`super::paged_listings`]): each is a [`StoreHook`] that sees (and may change) reads
//! and delimited listings, while every other call passes through. scdlfs only reads and
//! lists, so those are where they differ.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

/// What a test double (or one of the daemon's hooks) does to reads and listings; what
/// it leaves alone is sent on unchanged.
#[async_trait]
pub trait StoreHook: Send + Sync + fmt::Debug + 'static {
    /// Sends `request` on (or answers it itself), observing or altering it.
    async fn get(&self, request: GetRequest<'_>) -> Result<GetResult> {
        request.send().await
    }

    /// Lists every object of `inner` under `prefix`, as [`ObjectStore::list`].
    fn list(
        &self,
        inner: &dyn ObjectStore,
        prefix: Option<&Path>,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        inner.list(prefix)
    }

    /// Lists every object of `inner` under `prefix` after `offset`, as
    /// [`ObjectStore::list_with_offset`] (S3's `start-after`: the store skips what is
    /// before it, where the trait's default lists it and filters).
    fn list_with_offset(
        &self,
        inner: &dyn ObjectStore,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        inner.list_with_offset(prefix, offset)
    }

    /// Lists one directory level of `inner` under `prefix`, as
    /// [`ObjectStore::list_with_delimiter`].
    async fn list_with_delimiter(
        &self,
        inner: &dyn ObjectStore,
        prefix: Option<&Path>,
    ) -> Result<ListResult> {
        inner.list_with_delimiter(prefix).await
    }
}

/// One read on its way through a [`HookedStore`] to the store it wraps. A hook may
/// change `options` before it sends the read on, or send it more than once.
pub struct GetRequest<'a> {
    pub inner: &'a dyn ObjectStore,
    pub location: &'a Path,
    pub options: GetOptions,
}

impl GetRequest<'_> {
    /// Sends the read on to the wrapped store, as it now stands.
    pub async fn send(self) -> Result<GetResult> {
        self.inner.get_opts(self.location, self.options).await
    }
}

/// An `ObjectStore` that sends reads through a [`StoreHook`] and everything else straight on.
#[derive(Debug)]
pub struct HookedStore<H> {
    inner: Arc<dyn ObjectStore>,
    hook: H,
}

impl<H: StoreHook> HookedStore<H> {
    pub fn new(inner: Arc<dyn ObjectStore>, hook: H) -> Self {
        HookedStore { inner, hook }
    }

    pub fn hook(&self) -> &H {
        &self.hook
    }
}

impl<H: StoreHook> fmt::Display for HookedStore<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}({})", self.hook, self.inner)
    }
}

#[async_trait]
impl<H: StoreHook> ObjectStore for HookedStore<H> {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let request = GetRequest {
            inner: self.inner.as_ref(),
            location,
            options,
        };
        self.hook.get(request).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.hook.list(self.inner.as_ref(), prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.hook
            .list_with_offset(self.inner.as_ref(), prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.hook
            .list_with_delimiter(self.inner.as_ref(), prefix)
            .await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// Reads a result's whole body into memory, handing back the body and the result's
/// metadata (with an empty payload) so a double can delay, cut or re-emit it.
pub async fn buffer_body(result: GetResult) -> Result<(Bytes, GetResult)> {
    let GetResult {
        payload,
        meta,
        range,
        attributes,
        extensions,
    } = result;
    let body = GetResult {
        payload,
        meta: meta.clone(),
        range: range.clone(),
        attributes: attributes.clone(),
        extensions: Default::default(),
    }
    .bytes()
    .await?;
    let head = GetResult {
        payload: GetResultPayload::Stream(Box::pin(futures::stream::empty())),
        meta,
        range,
        attributes,
        extensions,
    };
    Ok((body, head))
}

/// Gives a buffered result its body back.
pub fn with_body(head: GetResult, body: Bytes) -> GetResult {
    let stream = futures::stream::once(async move { Ok(body) });
    GetResult {
        payload: GetResultPayload::Stream(Box::pin(stream)),
        ..head
    }
}
