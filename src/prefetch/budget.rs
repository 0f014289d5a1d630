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
//!
//! A refusal costs the daemon little, but a writer that loops on them (the bench's
//! hostile writer made 110,000 to 142,000 an epoch, each a FUSE round trip and a pass
//! of its shell) takes CPU from everyone on a small node. So the answer to a refusal
//! waits ([`refusal_delay`]): not at all for a user's first [`PROMPT_REFUSALS`]
//! after a quiet spell, then longer the more the user was refused lately, up to
//! [`MAX_REFUSAL_DELAY`]. The writer sleeps in its write(2) instead of spinning.

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
/// Refusals of a user answered at once after a quiet spell: a writer whose one write
/// or open is refused (a sampler past the rate of plan starts, every rank of a node
/// at once) learns so without waiting.
pub const PROMPT_REFUSALS: f64 = 8.0;
/// What each recent refusal beyond [`PROMPT_REFUSALS`] adds to the wait of an answer.
pub const REFUSAL_DELAY_STEP: Duration = Duration::from_millis(1);
/// The longest an answer to a refusal waits. A hint file is one inode for all its
/// users, and the kernel holds that inode's lock over a write until it is answered:
/// another user's hint write may queue behind a writer's held refusal, so the bound
/// is small. At it, one thread looping on refusals makes at most 100 a second, where
/// the bench's writer made 3,000 to 4,000 answered at once.
pub const MAX_REFUSAL_DELAY: Duration = Duration::from_millis(10);
/// How fast a user's recent refusals fade: each counts for 1/e as much this long after.
pub const REFUSALS_FADE: Duration = Duration::from_secs(1);
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
    /// Of those, the refusals whose answers waited ([`refusal_delay`]).
    #[serde(default)]
    pub answered_late: u64,
    pub last_reason: String,
}

/// Whether a refusal is logged: `Some(n)` with the refusals of the user not logged
/// since the last line.
pub type LogThis = Option<u64>;

/// What becomes of one refusal: whether it is logged, and how long its answer waits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Noted {
    pub log: LogThis,
    pub answer_after: Duration,
}

/// How long the answer to a refusal waits, given the user's recent refusals, this one
/// included ([`RecentRefusals`]): none up to [`PROMPT_REFUSALS`], then
/// [`REFUSAL_DELAY_STEP`] for each one beyond, at most [`MAX_REFUSAL_DELAY`].
pub fn refusal_delay(recent: f64) -> Duration {
    let beyond = recent - PROMPT_REFUSALS;
    if beyond.is_nan() || beyond <= 0.0 {
        return Duration::ZERO;
    }
    let seconds = beyond * REFUSAL_DELAY_STEP.as_secs_f64();
    Duration::from_secs_f64(seconds.min(MAX_REFUSAL_DELAY.as_secs_f64()))
}

/// A user's refusals, each fading by 1/e every [`REFUSALS_FADE`].
#[derive(Debug)]
struct RecentRefusals {
    count: f64,
    at: Instant,
}

impl RecentRefusals {
    /// Adds one refusal at `now`; the recent refusals with it.
    fn add(&mut self, now: Instant) -> f64 {
        let faded = now.saturating_duration_since(self.at).as_secs_f64();
        self.count = self.count * (-faded / REFUSALS_FADE.as_secs_f64()).exp() + 1.0;
        self.at = now;
        self.count
    }
}

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
    recent_refusals: RecentRefusals,
    answered_late: u64,
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
            recent_refusals: RecentRefusals {
                count: 0.0,
                at: now,
            },
            answered_late: 0,
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

    /// Counts a refused write or open of `uid`'s; says whether to log it (and how many
    /// of its refusals went unlogged before it) and how long its answer waits.
    pub fn note_refusal(&self, uid: u32, reason: &str, now: Instant) -> Noted {
        let mut users = self.users.lock();
        let ledger = users.entry(uid).or_insert_with(|| UserLedger::new(now));
        ledger.refused += 1;
        ledger.last_reason = reason.to_owned();
        let answer_after = refusal_delay(ledger.recent_refusals.add(now));
        if !answer_after.is_zero() {
            ledger.answered_late += 1;
        }
        let due = ledger
            .last_logged
            .is_none_or(|at| now.saturating_duration_since(at) >= REFUSAL_LOG_INTERVAL);
        let log = if due {
            ledger.last_logged = Some(now);
            Some(std::mem::take(&mut ledger.unlogged))
        } else {
            ledger.unlogged += 1;
            None
        };
        Noted { log, answer_after }
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
                answered_late: ledger.answered_late,
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
    use proptest::prelude::*;

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
        assert_eq!(budget.note_refusal(7, "first", start).log, Some(0));
        for _ in 0..5 {
            assert_eq!(budget.note_refusal(7, "again", start).log, None);
        }
        assert_eq!(
            budget.note_refusal(8, "other", start).log,
            Some(0),
            "another user's are logged on their own"
        );
        let later = start + REFUSAL_LOG_INTERVAL;
        assert_eq!(
            budget.note_refusal(7, "last", later).log,
            Some(5),
            "the line says how many went unlogged"
        );
        assert_eq!(
            budget.refusals(),
            vec![
                HintRefusals {
                    uid: 7,
                    refused: 7,
                    answered_late: 0,
                    last_reason: "last".into()
                },
                HintRefusals {
                    uid: 8,
                    refused: 1,
                    answered_late: 0,
                    last_reason: "other".into()
                },
            ]
        );
    }

    /// A user's first refusals after a quiet spell are answered at once; a user who
    /// keeps being refused waits longer for each answer, up to the bound, and never
    /// makes another user wait.
    #[test]
    fn refusals_are_answered_at_once_then_later_up_to_the_bound() {
        let budget = HintBudget::default();
        let start = Instant::now();
        let prompt = PROMPT_REFUSALS as usize;
        for i in 0..prompt {
            let noted = budget.note_refusal(7, "refused", start);
            assert_eq!(noted.answer_after, Duration::ZERO, "refusal {i}");
        }
        let mut waits = Vec::new();
        for _ in 0..100 {
            waits.push(budget.note_refusal(7, "refused", start).answer_after);
        }
        assert!(
            waits[0] > Duration::ZERO,
            "the first refusal past the prompt ones"
        );
        assert!(waits.windows(2).all(|w| w[0] <= w[1]), "{waits:?}");
        assert_eq!(waits.last(), Some(&MAX_REFUSAL_DELAY));
        assert_eq!(
            budget.note_refusal(8, "refused", start).answer_after,
            Duration::ZERO,
            "another user's first"
        );
        let quiet = start + 10 * REFUSALS_FADE;
        assert_eq!(
            budget.note_refusal(7, "refused", quiet).answer_after,
            Duration::ZERO,
            "after a quiet spell"
        );
        let refusals = budget.refusals();
        assert_eq!(refusals[0].refused, prompt as u64 + 101);
        assert_eq!(refusals[0].answered_late, 100);
        assert_eq!(refusals[1].answered_late, 0);
    }

    /// A thread that writes again as soon as its refusal is answered settles at the
    /// bound: its refusals stay at most one per [`MAX_REFUSAL_DELAY`].
    #[test]
    fn a_writer_looping_on_refusals_is_held_to_the_bound() {
        let budget = HintBudget::default();
        let mut now = Instant::now();
        let mut waits = Vec::new();
        for _ in 0..1000 {
            let wait = budget.note_refusal(7, "refused", now).answer_after;
            waits.push(wait);
            // The writer's own pass between two writes.
            now += wait + Duration::from_micros(100);
        }
        assert!(
            waits[50..].iter().all(|w| *w == MAX_REFUSAL_DELAY),
            "{waits:?}"
        );
    }

    proptest! {
        /// The wait grows with the recent refusals, never past the bound, and is
        /// none for the prompt ones.
        #[test]
        fn refusal_delay_is_monotone_bounded_and_none_for_the_prompt_ones(
            a in 0.0f64..1e12,
            b in 0.0f64..1e12,
        ) {
            let (fewer, more) = (a.min(b), a.max(b));
            prop_assert!(refusal_delay(fewer) <= refusal_delay(more));
            prop_assert!(refusal_delay(more) <= MAX_REFUSAL_DELAY);
            if fewer <= PROMPT_REFUSALS {
                prop_assert_eq!(refusal_delay(fewer), Duration::ZERO);
            }
        }

        /// However a user's refusals are spaced, each answer waits at most the bound,
        /// and the first after a quiet spell of a few fades waits none.
        #[test]
        fn any_spacing_of_refusals_waits_within_the_bound(
            gaps_us in prop::collection::vec(0u64..2_000_000, 1..300),
        ) {
            let budget = HintBudget::default();
            let mut now = Instant::now();
            for gap in gaps_us {
                now += Duration::from_micros(gap);
                prop_assert!(budget.note_refusal(7, "r", now).answer_after <= MAX_REFUSAL_DELAY);
            }
            let quiet = now + 10 * REFUSALS_FADE;
            prop_assert_eq!(budget.note_refusal(7, "r", quiet).answer_after, Duration::ZERO);
        }
    }
}
