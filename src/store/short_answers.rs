//! Short answers asked for again: part of the store's one retry layer.
//!
//! A store may answer a ranged GET with a 206 whose `Content-Range` covers less than
//! the range asked, every header consistent with that smaller body. object_store
//! refuses such an answer before its body is read (`Requested a..b, got a..c`, a
//! generic error it does not retry) and drops the bytes that came, so the read's part
//! failed with EIO although one more request would have brought it: at one short answer
//! in ten, 2 of 222 reads of a fault run. [`AskAgainWhenShort`] asks for the same range
//! again (the bytes that came are gone with object_store's error), up to
//! [`SHORT_ANSWER_TRIES`] requests in all; the fetcher's deadline per part and per read
//! bounds the whole, as it bounds object_store's own retries. Short answers are
//! independent of each other, so the tries are more than `--max-attempts` (4 by
//! default): a read fails only when every one of them is short, at one in ten about
//! once in 10^10. An answer that covers more than the range, or other bytes, is not
//! short and stays an error.

use std::fmt;
use std::ops::Range;

use async_trait::async_trait;
use object_store::{GetResult, Result};

use super::wrapper::{GetRequest, StoreHook};

/// Requests of one range, the first included, while the store answers them short.
pub const SHORT_ANSWER_TRIES: u32 = 10;

/// Sends a ranged GET answered short again, up to `tries` requests in all.
pub struct AskAgainWhenShort {
    pub tries: u32,
}

impl fmt::Debug for AskAgainWhenShort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AskAgainWhenShort")
    }
}

#[async_trait]
impl StoreHook for AskAgainWhenShort {
    async fn get(&self, request: GetRequest<'_>) -> Result<GetResult> {
        let mut tries = 1;
        loop {
            let options = request.options.clone();
            match request.inner.get_opts(request.location, options).await {
                Err(error) if tries < self.tries => match short_answer(&error) {
                    Some(ShortAnswer { asked, got }) => {
                        tracing::info!(object = %request.location, ?asked, ?got, "the store answered with fewer bytes than asked; asking again");
                        tries += 1;
                    }
                    None => return Err(error),
                },
                result => return result,
            }
        }
    }
}

/// A ranged GET answered with a part of the range asked.
#[derive(Debug, PartialEq, Eq)]
struct ShortAnswer {
    asked: Range<u64>,
    got: Range<u64>,
}

/// The short answer `error` reports, if it reports one: object_store 0.14 names it
/// only in its text, `Requested {asked:?}, got {got:?}` (client/get.rs,
/// `GetResultError::UnexpectedRange`).
fn short_answer(error: &object_store::Error) -> Option<ShortAnswer> {
    let object_store::Error::Generic { source, .. } = error else {
        return None;
    };
    let text = source.to_string();
    let (asked, got) = text.strip_prefix("Requested ")?.split_once(", got ")?;
    let range = |text: &str| -> Option<Range<u64>> {
        let (start, end) = text.split_once("..")?;
        Some(start.parse().ok()?..end.parse().ok()?)
    };
    let (asked, got) = (range(asked)?, range(got)?);
    let within = asked.start <= got.start && got.end <= asked.end;
    (within && got != asked).then_some(ShortAnswer { asked, got })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use bytes::Bytes;
    use object_store::memory::InMemory;
    use object_store::path::Path;
    use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutPayload};

    use super::*;
    use crate::store::wrapper::HookedStore;

    fn generic(text: &str) -> object_store::Error {
        object_store::Error::Generic {
            store: "test",
            source: text.into(),
        }
    }

    #[test]
    fn a_range_answered_in_part_is_short_and_nothing_else_is() {
        assert_eq!(
            short_answer(&generic("Requested 2..6, got 2..4")),
            Some(ShortAnswer {
                asked: 2..6,
                got: 2..4
            })
        );
        assert!(short_answer(&generic("Requested 2..6, got 3..6")).is_some());
        for not_short in [
            "Requested 2..3, got 2..4",
            "Requested 2..6, got 2..6",
            "Requested 2..6, got 7..9",
            "Received non-partial response when range requested",
        ] {
            assert_eq!(short_answer(&generic(not_short)), None, "{not_short}");
        }
        let not_found = object_store::Error::NotFound {
            path: "x".into(),
            source: "Requested 2..6, got 2..4".into(),
        };
        assert_eq!(short_answer(&not_found), None);
    }

    /// Answers the first `short` GETs short (as object_store reports it), then passes.
    #[derive(Debug)]
    struct ShortFirst {
        short: u32,
        seen: AtomicU32,
    }

    #[async_trait]
    impl StoreHook for ShortFirst {
        async fn get(&self, request: GetRequest<'_>) -> Result<GetResult> {
            if self.seen.fetch_add(1, Ordering::Relaxed) < self.short {
                return Err(generic("Requested 0..4, got 0..2"));
            }
            request.send().await
        }
    }

    async fn store_answering_short(short: u32) -> Arc<HookedStore<ShortFirst>> {
        let memory = Arc::new(InMemory::new());
        memory
            .put(
                &Path::from("a"),
                PutPayload::from(Bytes::from_static(b"abcd")),
            )
            .await
            .unwrap();
        Arc::new(HookedStore::new(
            memory,
            ShortFirst {
                short,
                seen: AtomicU32::new(0),
            },
        ))
    }

    fn first_four() -> GetOptions {
        GetOptions {
            range: Some(GetRange::Bounded(0..4)),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn short_answers_are_asked_again_up_to_the_tries_allowed() {
        let short_twice = store_answering_short(2).await;
        let asking = HookedStore::new(short_twice.clone(), AskAgainWhenShort { tries: 3 });
        let answer = asking.get_opts(&Path::from("a"), first_four()).await;
        assert_eq!(answer.unwrap().bytes().await.unwrap().as_ref(), b"abcd");
        assert_eq!(short_twice.hook().seen.load(Ordering::Relaxed), 3);

        let short_thrice = store_answering_short(3).await;
        let asking = HookedStore::new(short_thrice.clone(), AskAgainWhenShort { tries: 3 });
        let answer = asking.get_opts(&Path::from("a"), first_four()).await;
        assert!(answer.is_err(), "three short answers of three tries");
        assert_eq!(short_thrice.hook().seen.load(Ordering::Relaxed), 3);
    }
}
