//! The hint writers' budgets: how much work one hint handle and one user may make the
//! prefetcher do, part of [`super`]'s defences of a mount shared by many users.
//!
//! A hint file is writable by whoever may read its dataset (0666 with `--allow-other`),
//! and what a line costs the daemon is not its length: a `rows` range is one entry of
//! the plan but one unit of work for every chunk it spans, in every rank computation,
//! every match of a read to a step and every top-up. So each step is weighed by its
//! *work* ([`super::plan::Step::work`]: the chunk reads it expands to); a step, the
//! plan of one handle and the plans of one user are each held to a bound of work
//! ([`MAX_STEP_WORK`], [`MAX_HANDLE_WORK`], [`MAX_USER_WORK`]); a user holds at most
//! [`MAX_HINT_HANDLES_PER_USER`] hint handles (EBUSY beyond them, since each may buffer
//! a partial line), and starts plans (`plan` lines, each of which prefetches ahead
//! before a byte is read) at a bounded rate (EAGAIN beyond it), of which at most one
//! per [`OPENINGS_APART`] opens the fetcher's opening for every user's prefetches. A writer over a bound of
//! work gets EINVAL; the plans of other users are untouched. Refusals are counted
//! per user for `status`, and logged at most once per [`REFUSAL_LOG_INTERVAL`] per user,
//! so a writer cannot fill the journal either.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// Work of one step, at most: a window of this many chunks, or row ranges spanning this
/// many chunks in all. A step is one fetch of a sampler; a real batch is far smaller.
pub const MAX_STEP_WORK: u64 = 1 << 14;
/// Work of the plan of one handle, at most: a whole epoch of single-row steps over
/// half a million rows, where a sampler announces 16 steps ahead by default.
pub const MAX_HANDLE_WORK: u64 = 1 << 19;
/// Work of the plans of all the hint handles of one user together, at most.
pub const MAX_USER_WORK: u64 = 1 << 20;
/// Hint handles one user may hold open at once (eight ranks with eight loaders each,
/// twice over).
pub const MAX_HINT_HANDLES_PER_USER: usize = 128;
/// Plans a user may start at once after a quiet spell: every rank of a node starting
/// its epoch together.
pub const PLAN_START_BURST: u32 = 32;
/// Plans a user may start per second, sustained.
pub const PLAN_STARTS_PER_SECOND: u32 = 4;
/// Refusals of one user are logged at most this often (the rest are counted).
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// One user's plan starts open the fetcher's opening (which holds every user's
/// prefetches to two for up to 250 ms) at most this often: restarting plans in a loop,
/// one user held the whole mount there.
pub const OPENINGS_APART: Duration = Duration::from_millis(2500);

/// A user holds [`MAX_HINT_HANDLES_PER_USER`] hint handles already.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("user {uid} holds {limit} hint handles already")]
pub struct HandlesExhausted {
    pub uid: u32,
    pub limit: usize,
}

impl From<HandlesExhausted> for crate::error::FsError {
    fn from(HandlesExhausted { uid, limit }: HandlesExhausted) -> Self {
        crate::error::FsError::TooManyHintHandles { uid, limit }
    }
}

/// What `status` shows of one user's refused hint writes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HintRefusals {
    pub uid: u32,
    pub refused: u64,
    pub last_reason: String,
}

/// Whether a refusal is logged: `Some(n)` with the refusals of the user not logged
/// since the last line.
pub type LogThis = Option<u64>;

/// A bucket of plan starts: full at [`PLAN_START_BURST`], refilled at
/// [`PLAN_STARTS_PER_SECOND`].
#[derive(Debug)]
struct StartBucket {
    tokens: f64,
    at: Instant,
}

impl StartBucket {
    fn full(now: Instant) -> StartBucket {
        StartBucket {
            tokens: PLAN_START_BURST as f64,
            at: now,
        }
    }

    fn take(&mut self, now: Instant) -> bool {
        let refill =
            now.saturating_duration_since(self.at).as_secs_f64() * PLAN_STARTS_PER_SECOND as f64;
        self.tokens = (self.tokens + refill).min(PLAN_START_BURST as f64);
        self.at = now;
        if self.tokens < 1.0 {
            return false;
        }
        self.tokens -= 1.0;
        true
    }
}

#[derive(Debug)]
struct UserLedger {
    handles: usize,
    starts: StartBucket,
    last_opening: Option<Instant>,
    refused: u64,
    last_reason: String,
    last_logged: Option<Instant>,
    unlogged: u64,
}

impl UserLedger {
    fn new(now: Instant) -> UserLedger {
        UserLedger {
            handles: 0,
            starts: StartBucket::full(now),
            last_opening: None,
            refused: 0,
            last_reason: String::new(),
            last_logged: None,
            unlogged: 0,
        }
    }
}

/// The per-user ledgers of hint handles, plan starts and refusals.
#[derive(Debug, Default)]
pub struct HintBudget {
    users: Mutex<HashMap<u32, UserLedger>>,
}

impl HintBudget {
    /// Counts a hint handle `uid` opens, unless it holds the most it may already.
    pub fn open_handle(&self, uid: u32, now: Instant) -> Result<(), HandlesExhausted> {
        let mut users = self.users.lock();
        let ledger = users.entry(uid).or_insert_with(|| UserLedger::new(now));
        if ledger.handles >= MAX_HINT_HANDLES_PER_USER {
            return Err(HandlesExhausted {
                uid,
                limit: MAX_HINT_HANDLES_PER_USER,
            });
        }
        ledger.handles += 1;
        Ok(())
    }

    /// Forgets a hint handle of `uid`.
    pub fn close_handle(&self, uid: u32) {
        if let Some(ledger) = self.users.lock().get_mut(&uid) {
            ledger.handles = ledger.handles.saturating_sub(1);
        }
    }

    /// Takes one plan start of `uid`'s, if its rate allows one now.
    pub fn start_plan(&self, uid: u32, now: Instant) -> bool {
        let mut users = self.users.lock();
        let ledger = users.entry(uid).or_insert_with(|| UserLedger::new(now));
        ledger.starts.take(now)
    }

    /// Whether a plan `uid` starts now may open the fetcher's opening: not within
    /// [`OPENINGS_APART`] of the last one it opened.
    pub fn may_open(&self, uid: u32, now: Instant) -> bool {
        let mut users = self.users.lock();
        let ledger = users.entry(uid).or_insert_with(|| UserLedger::new(now));
        let due = ledger
            .last_opening
            .is_none_or(|at| now.saturating_duration_since(at) >= OPENINGS_APART);
        if due {
            ledger.last_opening = Some(now);
        }
        due
    }

    /// Counts a refused write of `uid`'s; says whether to log it, and how many of its
    /// refusals went unlogged before it.
    pub fn note_refusal(&self, uid: u32, reason: &str, now: Instant) -> LogThis {
        let mut users = self.users.lock();
        let ledger = users.entry(uid).or_insert_with(|| UserLedger::new(now));
        ledger.refused += 1;
        ledger.last_reason = reason.to_owned();
        let due = ledger
            .last_logged
            .is_none_or(|at| now.saturating_duration_since(at) >= REFUSAL_LOG_INTERVAL);
        if !due {
            ledger.unlogged += 1;
            return None;
        }
        ledger.last_logged = Some(now);
        Some(std::mem::take(&mut ledger.unlogged))
    }

    /// The refusals of each user who had any, by uid.
    pub fn refusals(&self) -> Vec<HintRefusals> {
        let users = self.users.lock();
        let mut refusals: Vec<HintRefusals> = users
            .iter()
            .filter(|(_, ledger)| ledger.refused > 0)
            .map(|(&uid, ledger)| HintRefusals {
                uid,
                refused: ledger.refused,
                last_reason: ledger.last_reason.clone(),
            })
            .collect();
        refusals.sort_by_key(|r| r.uid);
        refusals
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_holds_a_bounded_number_of_hint_handles_and_others_are_unaffected() {
        let budget = HintBudget::default();
        let now = Instant::now();
        for _ in 0..MAX_HINT_HANDLES_PER_USER {
            budget.open_handle(7, now).unwrap();
        }
        assert_eq!(
            budget.open_handle(7, now),
            Err(HandlesExhausted {
                uid: 7,
                limit: MAX_HINT_HANDLES_PER_USER
            })
        );
        assert!(budget.open_handle(8, now).is_ok(), "another user");
        budget.close_handle(7);
        assert!(
            budget.open_handle(7, now).is_ok(),
            "a closed handle frees its place"
        );
    }

    #[test]
    fn plan_starts_are_allowed_in_a_burst_then_at_their_rate() {
        let budget = HintBudget::default();
        let start = Instant::now();
        let burst = PLAN_START_BURST as usize;
        assert!((0..burst).all(|_| budget.start_plan(7, start)));
        assert!(!budget.start_plan(7, start), "past the burst");
        assert!(
            budget.start_plan(8, start),
            "another user's starts are their own"
        );
        let one_start_later = start + Duration::from_secs_f64(1.0 / PLAN_STARTS_PER_SECOND as f64);
        assert!(budget.start_plan(7, one_start_later));
        assert!(!budget.start_plan(7, one_start_later));
        let long_after = start + Duration::from_secs(3600);
        assert!(
            (0..burst).all(|_| budget.start_plan(7, long_after)),
            "a quiet spell refills the burst, and no more"
        );
        assert!(!budget.start_plan(7, long_after));
    }

    /// One user's plan starts reopen the mount-wide opening at most once per interval,
    /// each user's on their own.
    #[test]
    fn a_users_plan_starts_open_the_opening_at_most_once_per_interval() {
        let budget = HintBudget::default();
        let start = Instant::now();
        assert!(budget.may_open(7, start));
        assert!(
            !budget.may_open(7, start + OPENINGS_APART / 2),
            "a restart soon after"
        );
        assert!(budget.may_open(8, start), "another user's first");
        assert!(budget.may_open(7, start + OPENINGS_APART));
    }

    #[test]
    fn refusals_are_counted_each_and_logged_once_per_interval_per_user() {
        let budget = HintBudget::default();
        let start = Instant::now();
        assert_eq!(budget.note_refusal(7, "first", start), Some(0));
        for _ in 0..5 {
            assert_eq!(budget.note_refusal(7, "again", start), None);
        }
        assert_eq!(
            budget.note_refusal(8, "other", start),
            Some(0),
            "another user's are logged on their own"
        );
        let later = start + REFUSAL_LOG_INTERVAL;
        assert_eq!(
            budget.note_refusal(7, "last", later),
            Some(5),
            "the line says how many went unlogged"
        );
        assert_eq!(
            budget.refusals(),
            vec![
                HintRefusals {
                    uid: 7,
                    refused: 7,
                    last_reason: "last".into()
                },
                HintRefusals {
                    uid: 8,
                    refused: 1,
                    last_reason: "other".into()
                },
            ]
        );
    }
}
