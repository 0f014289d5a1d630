//! The flat view of a chunked dataset's directory: the synthesized monolithic archive
//! (`header.sch`, virtual arrays), the other entries passed through, and the stored
//! objects under `.chunked/`.

use std::sync::Arc;

use object_store::path::Path as ObjectPath;
use scdl_format::hint::HINT_FILE;
use scdl_format::layout::{parse_chunk_dir_name, CHUNKED_DIR, HEADER_FILE};
use scdl_format::manifest::MANIFEST_FILE;
use scdl_format::ArrayKind;

use super::{hint_file, Pending};
use super::{DirMode, FileContent, FileNode, Prelisted};
use crate::catalog::chunked::FlatDataset;
use crate::catalog::dataset::Dataset;

/// The flat view of a chunked dataset whose directory lists `raw` entries (`listed`,
/// also the first listing of the raw view, `.chunked/`, which shows the same prefix).
pub(super) fn flat_entries(
    prefix: &ObjectPath,
    dataset: Arc<FlatDataset>,
    raw: Vec<(String, Pending)>,
    listed: Prelisted,
) -> Vec<(String, Pending)> {
    let virtual_file = |content: FileContent, size: u64| {
        Pending::File(FileNode {
            content,
            size,
            mtime: dataset.mtime,
        })
    };
    let mut entries: Vec<(String, Pending)> = raw
        .into_iter()
        .filter(|(name, _)| {
            // The manifest, like the chunks, is of the chunked layout: the monolithic
            // archive the view stands for has none (`.chunked/` shows it).
            name != HEADER_FILE
                && name != MANIFEST_FILE
                && ArrayKind::from_file_name(name).is_none()
                && parse_chunk_dir_name(name).is_none()
        })
        .collect();
    entries.push((
        HEADER_FILE.to_owned(),
        virtual_file(
            FileContent::Bytes(dataset.flat_header.clone()),
            dataset.flat_header.len() as u64,
        ),
    ));
    for kind in ArrayKind::ALL {
        entries.push((
            kind.file_name().to_owned(),
            virtual_file(
                FileContent::FlatArray(dataset.clone(), kind),
                dataset.layout.file_len(kind),
            ),
        ));
    }
    entries.push((
        HINT_FILE.to_owned(),
        hint_file(Dataset::Chunked(dataset.clone())),
    ));
    entries.push((
        CHUNKED_DIR.to_owned(),
        Pending::Dir(prefix.clone(), DirMode::Raw, Some(listed)),
    ));
    entries
}
