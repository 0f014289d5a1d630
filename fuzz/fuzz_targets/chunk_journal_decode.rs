//! A chunking job's resume record lives at the target, where anything may have changed
//! it: whatever bytes its `job.json` and an upload marker hold, resuming reads them
//! through the journal into a job (that survives a round trip) or a clear error, and
//! into markers that parse or are skipped (costing a re-upload), never a panic.
#![no_main]

use std::sync::{Arc, OnceLock};

use futures::TryStreamExt;
use libfuzzer_sys::fuzz_target;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use scdlfs::chunker::journal::{JobIdentity, Journal, Uploaded};

const MARKED_KEY: &str = "chunk_00000/data.npy";

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    })
}

fn round_trips<T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug>(
    value: &T,
) {
    let bytes = serde_json::to_vec(value).unwrap();
    assert_eq!(&serde_json::from_slice::<T>(&bytes).unwrap(), value);
}

fuzz_target!(|input: &[u8]| {
    // The first byte says where the rest splits into job.json and the marker.
    let Some((&split, rest)) = input.split_first() else {
        return;
    };
    let (job_bytes, marker_bytes) = rest.split_at(usize::from(split) * rest.len() / 255);
    runtime().block_on(async {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let journal = Journal::new(store.clone(), &Path::from("target"));
        let job = JobIdentity {
            format: scdlfs::chunker::journal::FORMAT_VERSION,
            chunk_rows: 1024,
            source_header_crc32c: 7,
            source_array_bytes: [1, 2, 3],
            source_e_tags: [("data.npy".to_owned(), "\"source\"".to_owned())].into(),
        };
        let uploaded = Uploaded {
            size: 5,
            crc32c: 9,
            e_tag: Some("\"etag\"".into()),
        };
        journal.begin(&job).await.unwrap();
        journal.record(MARKED_KEY, &uploaded).await.unwrap();
        // The journal's own files, written over with the input.
        let files: Vec<_> = store.list(None).try_collect().await.unwrap();
        assert_eq!(files.len(), 2);
        for file in files {
            let marker = file.location.as_ref().contains(MARKED_KEY);
            let bytes = if marker { marker_bytes } else { job_bytes };
            store
                .put(&file.location, bytes.to_vec().into())
                .await
                .unwrap();
        }
        match journal.job().await {
            Ok(Some(job)) => round_trips(&job),
            Ok(None) => panic!("the record is there"),
            Err(error) => assert!(!error.to_string().is_empty()),
        }
        let markers = journal
            .uploaded()
            .await
            .expect("an unreadable marker is skipped, not an error");
        for (key, uploaded) in markers {
            assert_eq!(key, MARKED_KEY);
            round_trips(&uploaded);
        }
    });
});
