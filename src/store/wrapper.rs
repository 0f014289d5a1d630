//! One delegating `ObjectStore` wrapper for all the test doubles, and for the daemon's
//! hooks (the timing of GETs in `mount::assemble`, [`super::short_answers`]): each is a
//! [`GetHook`] that sees (and may change)
//! reads, while every other call passes through. scdlfs only reads and lists, so reads
//! are where they differ.

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

/// What a test double does to reads.
#[async_trait]
pub trait GetHook: Send + Sync + fmt::Debug + 'static {
    /// Runs the read through `inner`, observing or altering it.
    async fn get(
        &self,
        inner: &dyn ObjectStore,
        location: &Path,
        options: GetOptions,
    ) -> Result<GetResult>;
}

/// An `ObjectStore` that sends reads through a [`GetHook`] and everything else straight on.
#[derive(Debug)]
pub struct HookedStore<H> {
    inner: Arc<dyn ObjectStore>,
    hook: H,
}

impl<H: GetHook> HookedStore<H> {
    pub fn new(inner: Arc<dyn ObjectStore>, hook: H) -> Self {
        HookedStore { inner, hook }
    }

    pub fn hook(&self) -> &H {
        &self.hook
    }
}

impl<H: GetHook> fmt::Display for HookedStore<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}({})", self.hook, self.inner)
    }
}

#[async_trait]
impl<H: GetHook> ObjectStore for HookedStore<H> {
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
        self.hook.get(self.inner.as_ref(), location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
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
