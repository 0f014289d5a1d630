//! The monolithic archive being chunked, read through any store: its header, the sizes
//! of its arrays, the row offsets at every chunk boundary, and the global entries that
//! travel along.
//!
//! Everything the chunker needs to know about the source is learnt and checked here,
//! before a single byte is written at the target: a bad source is refused with the
//! target untouched. The row offsets are streamed once, in bounded pieces, so a source
//! of any size is checked in constant memory.
//!
//! Every source object is pinned to the ETag it was listed with: every read of it,
//! from the first (the header) to the last byte copied, carries `If-Match`, so a
//! source rewritten while the job runs fails the job ([`ChunkError::SourceChanged`])
//! instead of mixing two versions, and the ETags are part of the job's identity, so a
//! source rewritten between two runs is not resumed into the first run's objects.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, GetResult, ObjectMeta, ObjectStore, ObjectStoreExt};
use scdl_format::chunking::GLOBAL_ENTRIES;
use scdl_format::header::MAX_HEADER_BYTES;
use scdl_format::layout::HEADER_FILE;
use scdl_format::{ArrayInfo, ArrayKind, Backend, ChunkGeometry, Dtype, Header};

use super::{relative_key, ChunkError};

/// Row offsets are checked in pieces of this many bytes.
const ROW_OFFSET_PIECE: u64 = 1 << 20;

/// One CSR array of the source.
#[derive(Clone, Debug)]
pub struct SourceArray {
    pub location: ObjectPath,
    pub dtype: Dtype,
    /// Bytes per element.
    pub width: u64,
    /// Bytes of the whole array.
    pub bytes: u64,
}

/// A monolithic archive whose header, array sizes and row offsets were checked.
#[derive(Debug)]
pub struct MonolithicSource {
    pub store: Arc<dyn ObjectStore>,
    pub header: Header,
    pub header_bytes: Vec<u8>,
    /// Data, row offsets and column ids, in [`ArrayKind::ALL`] order.
    pub arrays: [SourceArray; 3],
    pub geometry: ChunkGeometry,
    /// The value offset at each chunk boundary: `num_chunks + 1` entries.
    pub boundaries: Vec<u64>,
    /// Global entries (`version.json`, features...) as (path below the archive, size).
    pub globals: Vec<(String, u64)>,
    /// The ETag every object read is pinned to, by path below the archive.
    pub e_tags: BTreeMap<String, String>,
    prefix: ObjectPath,
}

impl MonolithicSource {
    /// Reads and checks the archive under `prefix`, for chunks of `chunk_rows` rows.
    pub async fn open(
        store: Arc<dyn ObjectStore>,
        prefix: ObjectPath,
        chunk_rows: u32,
    ) -> Result<MonolithicSource, ChunkError> {
        let listed = Listed::of(store.as_ref(), prefix).await?;
        let (header, header_bytes, header_e_tag) = read_header(store.as_ref(), &listed).await?;
        let header_location = listed.prefix.clone().join(HEADER_FILE);
        let infos = header.csr_arrays().map_err(|source| ChunkError::Header {
            location: header_location.to_string(),
            source,
        })?;
        let arrays = sized_arrays(&listed, &header_location, infos)?;
        let (values, geometry) = counted_rows(&header_location, &arrays, infos, chunk_rows)?;
        let globals = listed.globals();
        let read_later = arrays.iter().map(|array| array.location.clone()).chain(
            globals
                .iter()
                .map(|(name, _)| location_below(&listed.prefix, name)),
        );
        let mut e_tags = BTreeMap::from([(HEADER_FILE.to_owned(), header_e_tag)]);
        for location in read_later {
            let e_tag = pinned_e_tag(store.as_ref(), &listed.objects, &location).await?;
            e_tags.insert(listed.relative(&location).unwrap_or_default(), e_tag);
        }
        let mut source = MonolithicSource {
            store,
            header,
            header_bytes,
            arrays,
            geometry,
            boundaries: Vec::new(),
            globals,
            e_tags,
            prefix: listed.prefix,
        };
        source.boundaries = source.check_row_offsets(values).await?;
        Ok(source)
    }

    pub fn array(&self, kind: ArrayKind) -> &SourceArray {
        &self.arrays[kind.index()]
    }

    pub fn location(&self, relative: &str) -> ObjectPath {
        location_below(&self.prefix, relative)
    }

    /// Reads `range` (or all) of a source object, pinned to the version the job is of.
    pub async fn get(
        &self,
        location: &ObjectPath,
        range: Option<Range<u64>>,
    ) -> Result<GetResult, ChunkError> {
        let e_tag = relative_key(location, &self.prefix)
            .and_then(|name| self.e_tags.get(&name))
            .unwrap_or_else(|| panic!("{location} is read but was never pinned"));
        get_pinned(self.store.as_ref(), location, e_tag, range).await
    }

    /// Streams the row offsets once: they must start at 0, never decrease and end at
    /// `values`. Returns the offset at every chunk boundary.
    async fn check_row_offsets(&self, values: u64) -> Result<Vec<u64>, ChunkError> {
        let array = self.array(ArrayKind::RowPtr);
        let entries = self.geometry.total_rows + 1;
        let chunk_rows = self.geometry.chunk_size;
        let mut boundaries = Vec::with_capacity(self.geometry.num_chunks() as usize + 1);
        let mut previous = 0u64;
        let mut index = 0u64;
        let piece_entries = (ROW_OFFSET_PIECE / array.width).max(1);
        while index < entries {
            let end = (index + piece_entries).min(entries);
            let bytes = self
                .read_range(&array.location, index * array.width..end * array.width)
                .await?;
            for (i, offset) in (index..end)
                .zip((0..(end - index) as usize).map(|k| array.dtype.read_uint(&bytes, k)))
            {
                let bad = if i == 0 && offset != 0 {
                    Some(format!("the first row offset is {offset}, not 0"))
                } else if offset < previous {
                    Some(format!(
                        "row offset {i} ({offset}) is below the one before it ({previous})"
                    ))
                } else if offset > values {
                    Some(format!(
                        "row offset {i} ({offset}) is past the {values} values"
                    ))
                } else {
                    None
                };
                if let Some(reason) = bad {
                    return Err(ChunkError::Inconsistent(format!(
                        "{}: {reason}",
                        array.location
                    )));
                }
                if i % chunk_rows == 0 || i == entries - 1 {
                    boundaries.push(offset);
                }
                previous = offset;
            }
            index = end;
        }
        if previous != values {
            return Err(ChunkError::Inconsistent(format!(
                "{}: the last row offset is {previous}, but the archive holds {values} values",
                array.location
            )));
        }
        Ok(boundaries)
    }

    /// Bytes `range` of the object at `location`, whole in memory (callers keep it small).
    pub async fn read_range(
        &self,
        location: &ObjectPath,
        range: Range<u64>,
    ) -> Result<Vec<u8>, ChunkError> {
        if range.is_empty() {
            return Ok(Vec::new());
        }
        let bytes = self
            .get(location, Some(range.clone()))
            .await?
            .bytes()
            .await
            .map_err(|source| ChunkError::store(location, source))?;
        if bytes.len() as u64 != range.end - range.start {
            return Err(ChunkError::Inconsistent(format!(
                "{location}: asked for {} bytes at {}, got {}",
                range.end - range.start,
                range.start,
                bytes.len()
            )));
        }
        Ok(bytes.to_vec())
    }
}

/// The source's objects as listed once under its prefix: their sizes and ETags are
/// what the job is of.
struct Listed {
    prefix: ObjectPath,
    objects: Vec<ObjectMeta>,
}

impl Listed {
    async fn of(store: &dyn ObjectStore, prefix: ObjectPath) -> Result<Listed, ChunkError> {
        let objects = store
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|source| ChunkError::store(&prefix, source))?;
        Ok(Listed { prefix, objects })
    }

    fn relative(&self, location: &ObjectPath) -> Option<String> {
        relative_key(location, &self.prefix)
    }

    /// The listed size of `name`, below the prefix.
    fn size_of(&self, name: &str) -> Option<u64> {
        self.objects
            .iter()
            .find(|m| self.relative(&m.location).as_deref() == Some(name))
            .map(|m| m.size)
    }

    /// The global entries (`version.json`, features...) as (path below the archive, size).
    fn globals(&self) -> Vec<(String, u64)> {
        self.objects
            .iter()
            .filter_map(|meta| {
                let name = self.relative(&meta.location)?;
                let top = name.split('/').next()?;
                GLOBAL_ENTRIES.contains(&top).then_some((name, meta.size))
            })
            .collect()
    }
}

/// The source's header, read pinned to its listed ETag: present, of a header's size,
/// read whole, and monolithic. Returns it with its bytes and its ETag.
async fn read_header(
    store: &dyn ObjectStore,
    listed: &Listed,
) -> Result<(Header, Vec<u8>, String), ChunkError> {
    let header_location = listed.prefix.clone().join(HEADER_FILE);
    let header_size = listed
        .size_of(HEADER_FILE)
        .ok_or_else(|| ChunkError::NotAnArchive(format!("{header_location} is missing")))?;
    if header_size > MAX_HEADER_BYTES {
        return Err(ChunkError::NotAnArchive(format!(
            "{header_location} holds {header_size} bytes, far more than an SCDL header"
        )));
    }
    let header_e_tag = pinned_e_tag(store, &listed.objects, &header_location).await?;
    let header_bytes = get_pinned(store, &header_location, &header_e_tag, None)
        .await?
        .bytes()
        .await
        .map_err(|source| ChunkError::store(&header_location, source))?
        .to_vec();
    if header_bytes.len() as u64 != header_size {
        return Err(ChunkError::SourceChanged(format!(
            "{header_location} was listed with {header_size} bytes and read with {}",
            header_bytes.len()
        )));
    }
    let header = Header::decode(&header_bytes).map_err(|source| ChunkError::Header {
        location: header_location.to_string(),
        source,
    })?;
    match header.backend {
        Backend::Monolithic => {}
        Backend::Chunked => {
            return Err(ChunkError::NotAnArchive(format!(
                "{header_location} describes a chunked archive already"
            )))
        }
    }
    Ok((header, header_bytes, header_e_tag))
}

/// The three CSR arrays the header describes (`infos`), each listed with the size its
/// element count and type make.
fn sized_arrays(
    listed: &Listed,
    header_location: &ObjectPath,
    infos: [&ArrayInfo; 3],
) -> Result<[SourceArray; 3], ChunkError> {
    let mut arrays = Vec::with_capacity(3);
    for (kind, info) in ArrayKind::ALL.into_iter().zip(infos) {
        let location = listed.prefix.clone().join(kind.file_name());
        let width = info.dtype.size().ok_or_else(|| {
            ChunkError::Inconsistent(format!(
                "{header_location}: {} has no fixed element size",
                kind.header_name()
            ))
        })?;
        let expected = info.length.checked_mul(width).ok_or_else(|| {
            ChunkError::Inconsistent(format!(
                "{header_location}: {} length {} overflows",
                kind.header_name(),
                info.length
            ))
        })?;
        let actual = listed
            .size_of(kind.file_name())
            .ok_or_else(|| ChunkError::NotAnArchive(format!("{location} is missing")))?;
        if actual != expected {
            return Err(ChunkError::Inconsistent(format!(
                "{location} holds {actual} bytes; the header says {} elements of {} = {expected} bytes",
                info.length, info.dtype
            )));
        }
        arrays.push(SourceArray {
            location,
            dtype: info.dtype,
            width,
            bytes: actual,
        });
    }
    Ok(arrays.try_into().expect("three CSR arrays"))
}

/// The value count and the chunk geometry of rows in chunks of `chunk_rows`, once the
/// arrays agree: row offsets of an unsigned type, one column id per value, at least the
/// one row offset of no rows, and no more chunks than a header can count.
fn counted_rows(
    header_location: &ObjectPath,
    arrays: &[SourceArray; 3],
    infos: [&ArrayInfo; 3],
    chunk_rows: u32,
) -> Result<(u64, ChunkGeometry), ChunkError> {
    if !arrays[ArrayKind::RowPtr.index()].dtype.is_unsigned_int() {
        return Err(ChunkError::Inconsistent(format!(
            "{header_location}: row offsets of type {} are not unsigned integers",
            arrays[ArrayKind::RowPtr.index()].dtype
        )));
    }
    let values = infos[ArrayKind::Data.index()].length;
    if infos[ArrayKind::ColPtr.index()].length != values {
        return Err(ChunkError::Inconsistent(format!(
            "{header_location}: {} values but {} column ids",
            values,
            infos[ArrayKind::ColPtr.index()].length
        )));
    }
    let rows = infos[ArrayKind::RowPtr.index()]
        .length
        .checked_sub(1)
        .ok_or_else(|| ChunkError::Inconsistent(format!("{header_location}: ROWPTR is empty")))?;
    let geometry = ChunkGeometry::new(rows, chunk_rows as u64)
        .ok_or_else(|| ChunkError::Usage("--chunk-rows must be positive".into()))?;
    if geometry.num_chunks() > u32::MAX as u64 {
        return Err(ChunkError::Usage(format!(
            "{rows} rows in chunks of {chunk_rows} make more chunks than a header can count"
        )));
    }
    Ok((values, geometry))
}

fn location_below(prefix: &ObjectPath, relative: &str) -> ObjectPath {
    relative
        .split('/')
        .fold(prefix.clone(), |path, part| path.join(part))
}

/// The ETag of `location` as listed, else as a HEAD answers (some servers list none).
async fn pinned_e_tag(
    store: &dyn ObjectStore,
    listing: &[ObjectMeta],
    location: &ObjectPath,
) -> Result<String, ChunkError> {
    let listed = listing
        .iter()
        .find(|meta| &meta.location == location)
        .and_then(|meta| meta.e_tag.clone());
    let e_tag = match listed {
        Some(e_tag) => Some(e_tag),
        None => {
            store
                .head(location)
                .await
                .map_err(|source| ChunkError::store(location, source))?
                .e_tag
        }
    };
    e_tag.ok_or_else(|| {
        ChunkError::Usage(format!(
            "{location}: the store gives no ETag, so a change of the source during the job \
             could not be told from its own bytes; copy the source to a folder or an object \
             store first"
        ))
    })
}

/// One read of `location` that fails, rather than mixes versions, if the object is no
/// longer the one with `e_tag`.
async fn get_pinned(
    store: &dyn ObjectStore,
    location: &ObjectPath,
    e_tag: &str,
    range: Option<Range<u64>>,
) -> Result<GetResult, ChunkError> {
    let options = GetOptions {
        range: range.map(GetRange::Bounded),
        if_match: Some(e_tag.to_owned()),
        ..Default::default()
    };
    store
        .get_opts(location, options)
        .await
        .map_err(|source| match source {
            object_store::Error::Precondition { .. } => ChunkError::SourceChanged(format!(
                "{location} is no longer the version (ETag {e_tag}) the job started from"
            )),
            source => ChunkError::store(location, source),
        })
}
