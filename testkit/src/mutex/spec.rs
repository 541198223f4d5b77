//! The sequential specification of the fenced-mutex check: a fenced mutex (see the parent
//! module's docs).

use stateright::semantics::SequentialSpec;

/// The sequential specification: a fenced mutex. See the module docs.
///
/// Two search hints prune only orders that cannot finish: the known grants' tokens, sorted
/// (every known grant must be placed, and tokens rise, so they are placed in token order: one
/// placed out of it leaves a smaller one that can never follow); and an operation of unknown
/// outcome placed where it has no effect (such an order is the same as one without it, which
/// the search tries too).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct FencedMutex {
    /// The grant holding the lock.
    pub(super) holder: Option<usize>,
    /// The highest token granted so far.
    pub(super) highest: u64,
    /// The known grants' tokens, sorted, and how many of them were placed.
    pub(super) due: (std::sync::Arc<[u64]>, usize),
    /// An operation of unknown outcome was placed with no effect: this order is cut short.
    pub(super) idle: bool,
}

/// An operation on a [`FencedMutex`]: acquire or release, by grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MutexOp {
    /// Grant `n` (its index) acquires.
    Acquire(usize),
    /// Grant `n` releases.
    Release(usize),
}

/// What a [`MutexOp`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MutexRet {
    /// Granted, with this token.
    Granted(u64),
    /// Released.
    Released,
    /// No effect (only for an operation whose outcome is unknown).
    NoEffect,
}

impl SequentialSpec for FencedMutex {
    type Op = MutexOp;
    type Ret = MutexRet;

    /// Only an operation whose outcome is unknown is invoked (never returned): it takes
    /// effect if it can, with the least token for an acquire.
    fn invoke(&mut self, op: &MutexOp) -> MutexRet {
        match *op {
            MutexOp::Acquire(g) if self.holder.is_none() => {
                self.highest += 1;
                self.holder = Some(g);
                MutexRet::Granted(self.highest)
            }
            MutexOp::Release(g) if self.holder == Some(g) => {
                self.holder = None;
                MutexRet::Released
            }
            _ => {
                self.idle = true;
                MutexRet::NoEffect
            }
        }
    }

    fn is_valid_step(&mut self, op: &MutexOp, ret: &MutexRet) -> bool {
        if self.idle {
            return false;
        }
        match (*op, *ret) {
            (MutexOp::Acquire(g), MutexRet::Granted(t))
                if self.holder.is_none() && t > self.highest =>
            {
                let (due, placed) = &mut self.due;
                if due.get(*placed).is_some_and(|next| *next != t) {
                    return false;
                }
                *placed += 1;
                self.highest = t;
                self.holder = Some(g);
                true
            }
            (MutexOp::Release(g), MutexRet::Released) if self.holder == Some(g) => {
                self.holder = None;
                true
            }
            _ => false,
        }
    }
}
