//! Fencing tokens and the resource-side checks that make them count.
//!
//! The guarantees are documented on `FencingToken`.

use std::fmt;

/// Fencing tokens and the resource-side checks that make them count.
///
/// A lease alone never authorizes a side effect: a holder can pause (GC, swap, a stopped VM)
/// between checking its lease and writing, wake up after another client took the lock, and
/// write anyway. Every [`LockGuard`](crate::LockGuard) therefore carries a [`FencingToken`],
/// minted by the majority inside the acquisition itself: a granted token is greater than every
/// token granted before it for that lock. The resource must reject writes whose token is lower
/// than the highest it has seen. This module ships that check for the two most common
/// resources.
///
/// # Redis
/// [`fenced_set`] runs [`FENCED_SET_LUA`](crate::scripts::FENCED_SET_LUA) on the resource's
/// Redis (any Redis, not necessarily the quorum nodes): the write is applied only if its token
/// is at least the highest token seen for that resource, atomically.
///
/// # SQL
/// Keep the highest token next to the data and make it part of the write's predicate, so the
/// database itself does the check:
///
/// ```sql
/// -- once: ALTER TABLE accounts ADD COLUMN fence BIGINT NOT NULL DEFAULT 0;
/// UPDATE accounts
///    SET balance = $1, fence = $2          -- $2 = the fencing token
///  WHERE id = $3 AND fence <= $2;          -- rejects writers with an older token
/// -- 0 rows updated => a newer holder has written: stop, you are no longer the holder.
/// ```
/// For inserts, use `INSERT ... ON CONFLICT (id) DO UPDATE ... WHERE accounts.fence <= EXCLUDED.fence`.
///
/// A fencing token: a positive integer below 2^53, strictly increasing across the grants of
/// one lock. Compare tokens, never anything else.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wrap a raw token (for tokens read back from storage or the environment).
    pub const fn new(raw: u64) -> FencingToken {
        FencingToken(raw)
    }

    /// The token as an integer (for storage next to the data it fences).
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::str::FromStr for FencingToken {
    type Err = std::num::ParseIntError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.trim().parse().map(FencingToken)
    }
}

/// What the resource said about a fenced write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a stale write was refused: branch on the verdict"]
pub enum FencedWrite {
    /// Applied; the resource now remembers this token as the highest.
    Applied,
    /// Rejected: a writer with a higher token already wrote.
    Stale {
        /// The highest token the resource has seen.
        highest: FencingToken,
    },
}

/// Write `value` to `key` on a resource Redis only if `token` is at least the highest token
/// seen for `key` (remembered in `fence_key`). Atomic on the resource.
///
/// # Errors
/// The driver's error if the resource cannot be reached (the write may or may not have
/// happened in that case, as with any Redis write whose reply is lost).
///
/// # Cancel safety
/// A dropped call may or may not have written (one atomic script: all or nothing).
pub async fn fenced_set<C>(
    conn: &mut C,
    key: &str,
    fence_key: &str,
    token: FencingToken,
    value: &[u8],
) -> redis::RedisResult<FencedWrite>
where
    C: redis::aio::ConnectionLike + Send,
{
    let (applied, highest): (i64, u64) = crate::scripts::FENCED_SET
        .key(key)
        .key(fence_key)
        .arg(token.get())
        .arg(value)
        .invoke_async(conn)
        .await?;
    Ok(if applied == 1 {
        FencedWrite::Applied
    } else {
        FencedWrite::Stale {
            highest: FencingToken(highest),
        }
    })
}
