//! A test double that injects failures into reads (errors, truncated bodies, requests
//! that never answer, panics), chosen per read by a rule the test supplies.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use object_store::path::Path;
use object_store::{GetOptions, GetResult, Result};

use super::wrapper::{buffer_body, with_body, GetRequest, StoreHook};

/// What happens to one read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The request fails with a generic store error.
    Fail,
    /// The body stops after this many bytes.
    Truncate(usize),
    /// The request never answers.
    Stall,
    /// The task making the request panics.
    Panic,
}

type Rule = dyn Fn(&Path, &GetOptions) -> Option<Fault> + Send + Sync;

/// Applies `rule` to every read; `None` lets the read through untouched.
#[derive(Clone)]
pub struct InjectFaults {
    rule: Arc<Rule>,
}

impl InjectFaults {
    pub fn new(rule: impl Fn(&Path, &GetOptions) -> Option<Fault> + Send + Sync + 'static) -> Self {
        InjectFaults {
            rule: Arc::new(rule),
        }
    }
}

impl fmt::Debug for InjectFaults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("InjectFaults")
    }
}

#[async_trait]
impl StoreHook for InjectFaults {
    async fn get(&self, request: GetRequest<'_>) -> Result<GetResult> {
        let location = request.location;
        let fault = (self.rule)(location, &request.options);
        match fault {
            Some(Fault::Stall) => return futures::future::pending().await,
            Some(Fault::Panic) => panic!("injected panic reading {location}"),
            _ => {}
        }
        let result = request.send().await?;
        let Some(fault) = fault else {
            return Ok(result);
        };
        let (body, head) = buffer_body(result).await?;
        match fault {
            Fault::Fail => Err(object_store::Error::Generic {
                store: "InjectFaults",
                source: format!("injected failure reading {location}").into(),
            }),
            Fault::Truncate(len) => Ok(with_body(head, body.slice(..len.min(body.len())))),
            Fault::Stall | Fault::Panic => unreachable!("handled before the request"),
        }
    }
}
