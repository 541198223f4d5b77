//! User-supplied names and the Redis keys built from them.
//!
//! Every key redquorum writes has the form `rq:<kind>:<name>`, where `<kind>` is one of a
//! fixed set of internal words and `<name>` is the user's name, verbatim. The internal part
//! comes *before* the user's part, so no user name can produce another kind's key (a lock
//! named `x:fence` is `rq:lock:x:fence`, never `rq:fence:x`).
//!
//! Architecture invariant: user names travel only in KEYS and ARGV of scripts, never in
//! script text or in a SCAN/KEYS pattern.

use std::fmt;

/// Prefix of every key this crate writes.
pub const KEY_PREFIX: &str = "rq:";

/// Longest accepted name, in bytes.
pub const MAX_NAME_BYTES: usize = 512;

/// The kinds of keys. Each kind is a distinct word, so keys of two kinds never collide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KeyKind {
    /// Per-node marker proving the node has not lost its data (no user name).
    Marker,
    /// The cluster descriptor (JSON: node names and cluster id), same on every node.
    Cluster,
    /// A repair's claim on the node it repairs (liveness only).
    RepairClaim,
    /// The fence floor of the earlier release (one per node, no longer written, still read so
    /// that fences collected into it keep counting); see [`floor_key`] for the buckets.
    FenceFloor,
    /// A monotonic ID sequence's current maximum.
    Id,
    /// A lease (lock) key: a hash {v: holder value, n: version, t: ttl ms}; never expires.
    Lock,
    /// A lock's fence counter: the highest token granted with it (no TTL, one per lock).
    Fence,
    /// A periodic job's completion records (period -> token).
    Done,
    /// A group's beats (hash: member key -> beat sequence; no expiry).
    Members,
    /// A group's agreed view (hash: token, view).
    View,
    /// A group's acknowledgements of prepared views (hash: member -> token).
    Ack,
    /// A group's leader lease.
    GroupLock,
    /// A group's leader fence counter.
    GroupFence,
    /// A pool's units (hash: unit -> version * 2 + added).
    Units,
    /// A pool's unit version sequence (a fencing-ID register).
    UnitVersion,
    /// A pool's per-node change stamp of its units (`<random start>` raised by every units
    /// write on that node): tells a pool leader whether it must read the units again. Not
    /// copied by repair (a restarted count is just a re-read).
    UnitStamp,
    /// A pool's collection floor: unit-register entries below it are refused (removals below
    /// it may have been collected).
    UnitFloor,
    /// A pool's per-node change log (sorted set: field -> stamp of its last raise), read by
    /// the pool's leader for the fields raised since its last read. Not copied by repair.
    UnitLog,
    /// The epoch of a pool's per-node change log (hash: id, bind, through). Not copied.
    UnitEpoch,
    /// The node's last repair nonce, written by every repair's mark step (fixed key). Not
    /// copied.
    Marked,
    /// A pool's beats (as [`KeyKind::Members`], for the pool's members).
    PoolMembers,
    /// A pool's agreed view (as [`KeyKind::View`], with unit-list references).
    PoolView,
    /// A pool's acknowledgements (as [`KeyKind::Ack`]).
    PoolAck,
    /// A pool's leader lease.
    PoolLock,
    /// A pool's leader fence counter.
    PoolFence,
    /// One member ID's unit lists in a pool (hash: `<version>.<digest>` -> snapshot or delta,
    /// each field written once); see [`pool_list_key`].
    PoolList,
}

impl KeyKind {
    /// Every kind (for reading a key's kind back from its word).
    pub(crate) const ALL: [KeyKind; 26] = [
        KeyKind::Marker,
        KeyKind::Cluster,
        KeyKind::RepairClaim,
        KeyKind::FenceFloor,
        KeyKind::Id,
        KeyKind::Lock,
        KeyKind::Fence,
        KeyKind::Done,
        KeyKind::Members,
        KeyKind::View,
        KeyKind::Ack,
        KeyKind::GroupLock,
        KeyKind::GroupFence,
        KeyKind::Units,
        KeyKind::UnitVersion,
        KeyKind::UnitStamp,
        KeyKind::UnitFloor,
        KeyKind::UnitLog,
        KeyKind::UnitEpoch,
        KeyKind::Marked,
        KeyKind::PoolMembers,
        KeyKind::PoolView,
        KeyKind::PoolAck,
        KeyKind::PoolLock,
        KeyKind::PoolFence,
        KeyKind::PoolList,
    ];

    /// The kind of a key this crate wrote (`rq:<word>` or `rq:<word>:...`), if any.
    pub(crate) fn of_key(key: &str) -> Option<KeyKind> {
        let rest = key.strip_prefix(KEY_PREFIX)?;
        let (word, named) = rest
            .split_once(':')
            .map_or((rest, false), |(w, _)| (w, true));
        // Only the fixed keys (and the older single fence floor) stand without a name.
        let fixed = |k: &KeyKind| {
            matches!(
                k,
                KeyKind::Marker
                    | KeyKind::Cluster
                    | KeyKind::RepairClaim
                    | KeyKind::Marked
                    | KeyKind::FenceFloor
            )
        };
        KeyKind::ALL
            .into_iter()
            .find(|k| k.word() == word && (named || fixed(k)))
    }

    pub(crate) fn word(self) -> &'static str {
        match self {
            KeyKind::Marker => "marker",
            KeyKind::Cluster => "cluster",
            KeyKind::RepairClaim => "repairing",
            KeyKind::FenceFloor => "floor",
            KeyKind::Id => "id",
            KeyKind::Lock => "lock",
            KeyKind::Fence => "fence",
            KeyKind::Done => "done",
            KeyKind::Members => "members",
            KeyKind::View => "view",
            KeyKind::Ack => "ack",
            KeyKind::GroupLock => "glock",
            KeyKind::GroupFence => "gfence",
            KeyKind::Units => "units",
            KeyKind::UnitVersion => "uver",
            KeyKind::UnitStamp => "ustamp",
            KeyKind::UnitFloor => "ufloor",
            KeyKind::UnitLog => "ulog",
            KeyKind::UnitEpoch => "uepoch",
            KeyKind::Marked => "marked",
            KeyKind::PoolMembers => "pmembers",
            KeyKind::PoolView => "pview",
            KeyKind::PoolAck => "pack",
            KeyKind::PoolLock => "plock",
            KeyKind::PoolFence => "pfence",
            KeyKind::PoolList => "plist",
        }
    }
}

/// The first field of a repair's blocker, a lease value no client holds,
/// `repair-blocker:<token>:<holder>`: written where a repair's sources held different holders'
/// copies of a lock key (`repair::plan`, also by `restore.lua`), and recognised by
/// `Lock::holder` as nobody's lease.
pub(crate) const BLOCKER_PREFIX: &str = "repair-blocker";

/// The holder part of a repair's blocker (see [`BLOCKER_PREFIX`]).
pub(crate) const BLOCKER_HOLDER: &str =
    "unknown: restored by a repair whose sources held different holders";

/// The unit lists of member `id` in `pool`: `rq:plist:<pool length>:<pool>:<id>`. The length
/// prefix keeps two (pool, id) pairs from ever naming one key, whatever `:` they contain.
pub(crate) fn pool_list_key(pool: &Name, id: &str) -> String {
    format!(
        "{KEY_PREFIX}{}:{}:{}:{id}",
        KeyKind::PoolList.word(),
        pool.as_str().len(),
        pool.as_str()
    )
}

/// Buckets of the fence floor: a released lock's fence is folded into its bucket's floor (at
/// its release, or once its handle is idle: `src/lock/fold.rs`), so a node keeps at most this
/// many floor keys, and locks in different buckets never make each other's tokens too low.
pub(crate) const FLOOR_BUCKETS: u64 = 1024;

/// The fence floor bucket of the lock key `lock_key`: `rq:floor:<xxh3 % 1024>`.
pub(crate) fn floor_key(lock_key: &str) -> String {
    let bucket = xxhash_rust::xxh3::xxh3_64(lock_key.as_bytes()) % FLOOR_BUCKETS;
    format!("{}:{bucket}", fixed_key(KeyKind::FenceFloor))
}

/// Every fence floor key: the older single floor and every bucket.
pub(crate) fn all_floor_keys() -> Vec<String> {
    let single = fixed_key(KeyKind::FenceFloor);
    std::iter::once(single.clone())
        .chain((0..FLOOR_BUCKETS).map(|b| format!("{single}:{b}")))
        .collect()
}

/// A validated user-supplied name (sequence, lock, group).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Name(String);

impl Name {
    /// Validate a name: 1 to [`MAX_NAME_BYTES`] bytes, no control characters.
    ///
    /// Any other character, `:` `*` `{` and spaces included, is allowed and stored verbatim.
    pub fn new(what: &'static str, name: impl Into<String>) -> Result<Name, NameError> {
        let name = name.into();
        if name.is_empty() {
            return Err(NameError::Empty { what });
        }
        if name.len() > MAX_NAME_BYTES {
            return Err(NameError::TooLong {
                what,
                len: name.len(),
                max: MAX_NAME_BYTES,
            });
        }
        if let Some(c) = name.chars().find(|c| c.is_control()) {
            return Err(NameError::ControlCharacter {
                what,
                code: c as u32,
            });
        }
        Ok(Name(name))
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub(crate) fn key(&self, kind: KeyKind) -> String {
        format!("{KEY_PREFIX}{}:{}", kind.word(), self.0)
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Name({:?})", self.0)
    }
}

/// The key of a kind that has no user name (one per node).
pub(crate) fn fixed_key(kind: KeyKind) -> String {
    format!("{KEY_PREFIX}{}", kind.word())
}

/// A rejected name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// The empty string.
    #[error("{what} name is empty")]
    Empty {
        /// What the name was for ("sequence", "lock", ...).
        what: &'static str,
    },
    /// Longer than [`MAX_NAME_BYTES`].
    #[error("{what} name is {len} bytes long; at most {max} are allowed")]
    TooLong {
        /// What the name was for.
        what: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Contains a control character (newline, NUL, escape...).
    #[error("{what} name contains the control character U+{code:04X}")]
    ControlCharacter {
        /// What the name was for.
        what: &'static str,
        /// The offending code point.
        code: u32,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_word_and_is_read_back_from_its_keys() {
        let mut words: Vec<&str> = KeyKind::ALL.iter().map(|k| k.word()).collect();
        words.sort_unstable();
        words.dedup();
        assert_eq!(words.len(), KeyKind::ALL.len(), "one word per kind");
        for kind in KeyKind::ALL {
            assert_eq!(
                KeyKind::of_key(&format!("rq:{}:a:b", kind.word())),
                Some(kind)
            );
        }
        assert_eq!(KeyKind::of_key("rq:marker"), Some(KeyKind::Marker));
        assert_eq!(KeyKind::of_key("rq:floor"), Some(KeyKind::FenceFloor));
        assert_eq!(
            KeyKind::of_key("rq:units"),
            None,
            "a named kind without a name is no key of ours"
        );
        assert_eq!(KeyKind::of_key("rq:unknown:x"), None);
        assert_eq!(KeyKind::of_key("user:key"), None);
    }

    #[test]
    fn every_floor_key_is_a_register_repair_copies_and_a_lock_has_one_bucket() {
        let all = all_floor_keys();
        assert_eq!(all.len(), 1 + FLOOR_BUCKETS as usize);
        assert!(all.iter().all(|k| crate::repair::classify_for_tests(k)));
        let bucket = floor_key("rq:lock:payments");
        assert!(all.contains(&bucket));
        assert_eq!(bucket, floor_key("rq:lock:payments"), "stable");
    }

    #[test]
    fn two_pool_and_member_pairs_never_share_a_list_key() {
        let a = pool_list_key(&Name::new("pool", "a:b").expect("valid"), "c");
        let b = pool_list_key(&Name::new("pool", "a").expect("valid"), "b:c");
        assert_ne!(a, b);
        assert_eq!(a, "rq:plist:3:a:b:c");
    }

    #[test]
    fn hostile_names_are_rejected_or_kept_verbatim() {
        assert_eq!(
            Name::new("lock", ""),
            Err(NameError::Empty { what: "lock" })
        );
        assert!(matches!(
            Name::new("lock", "a".repeat(513)),
            Err(NameError::TooLong { len: 513, .. })
        ));
        assert!(matches!(
            Name::new("lock", "a\nb"),
            Err(NameError::ControlCharacter { code: 10, .. })
        ));
        assert!(matches!(
            Name::new("lock", "a\0b"),
            Err(NameError::ControlCharacter { code: 0, .. })
        ));
        let glob = Name::new("lock", "*{x}:marker' .. redis.call('FLUSHALL') --")
            .expect("printable is fine");
        assert_eq!(
            glob.key(KeyKind::Id),
            "rq:id:*{x}:marker' .. redis.call('FLUSHALL') --"
        );
    }

    #[test]
    fn internal_kinds_cannot_collide_with_user_names() {
        // A user name that tries to look like the marker key still lands under its own kind.
        let sneaky = Name::new("sequence", "x").expect("valid");
        assert_ne!(sneaky.key(KeyKind::Id), fixed_key(KeyKind::Marker));
        let looks_like_marker = Name::new("sequence", "../marker").expect("valid");
        assert!(looks_like_marker.key(KeyKind::Id).starts_with("rq:id:"));
        assert_ne!(KeyKind::Id.word(), KeyKind::Marker.word());
    }
}
