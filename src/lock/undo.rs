//! A round's undo: roll back a grant that is still untouched, fold anywhere else.
//!
//! A round that no caller was given (too few grants, too late, or its caller went away) is
//! undone on every node. It used to be folded everywhere (`lock_release.lua`'s mode `"fold"`:
//! the copy deleted, the round's token folded into the node's fence floor). On the node that
//! missed the current holder's grant, that losing token then stays above the holder's token for
//! good, and the holder's extensions may not re-create their copy there (`lock_extend.lua`
//! re-creates only where the fence is at most the holder's token): the holder lives on a bare
//! majority, one node fault from losing the lease. So the undo now asks every node for a
//! rollback (mode `"undo"`): where the node's copy still holds the round's value at version 1,
//! with the previous fence key its grant recorded beside it (field `p`, written only by
//! `lock_acquire.lua`), and its fence key still holds exactly the round's token, the copy is
//! deleted and the fence key set back to `p`. Anywhere else the node folds, as before.
//!
//! The rollback needs no reply from the round: the node that granted keeps what it must go
//! back to. (A round is usually decided before the node that missed the holder's grant
//! answers: the holder's nodes refuse first, and the round is lost; that node's reply is not
//! awaited.) Why it is safe is argued in `mod.rs` ("An undone round").

use super::*;

impl Lock {
    /// Undo a round of `value` and `token` that no caller was given: compare-and-delete on
    /// every node (also nodes that did not answer: they may have granted), rolling the grant
    /// back where it is untouched (see the module docs), folding the fence elsewhere. Returns
    /// how many nodes had deleted the round's copy when the outcome was decided; slower nodes
    /// are still sent the undo in the background (a copy left anyway is taken over after its
    /// TTL plus drift, like a crashed holder's), so one frozen node does not slow it down.
    ///
    /// Never for a round whose grant a caller was given: a rollback lowers the fence key, and
    /// a token a caller may have used must stay below every later grant's.
    ///
    /// Cancel safety: an undo dropped before its decision may not reach every node; its
    /// callers (the round, and a dropped round's guard, `UndoRound`) send it in the background.
    pub(super) async fn undo_round(&self, value: &Arc<str>, token: u64) -> usize {
        let (mode, token) = if self.inner.rollback_undone_rounds {
            ("undo", token.to_string())
        } else {
            // The TEST-ONLY rule before issue 43: fold everywhere.
            ("fold", String::new())
        };
        // A rollback is decided by what the node's own keys say (see `lock_release.lua`).
        let step = self
            .release_call(value, mode)
            .arg(token)
            .decode(|_, v| decode_undo(v));
        self.send_release(step).await
    }
}

/// `lock_release.lua`'s reply to an undo: 2 rolled back, 1 folded (the copy deleted either
/// way), 0 the node held no copy of the round.
fn decode_undo(v: redis::Value) -> redis::RedisResult<NodeOutcome<()>> {
    let status: i64 = redis::from_redis_value(v)?;
    Ok(if status >= 1 {
        NodeOutcome::Applied(())
    } else {
        NodeOutcome::Rejected(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    #[test]
    fn a_rollback_and_a_fold_both_count_as_the_copy_deleted() {
        for (reply, applied) in [(2, true), (1, true), (0, false)] {
            let outcome = decode_undo(Value::Int(reply)).expect("decodes");
            assert_eq!(
                matches!(outcome, NodeOutcome::Applied(())),
                applied,
                "reply {reply}"
            );
        }
        assert!(
            decode_undo(Value::Nil).is_err(),
            "a malformed reply leaves the node's outcome unknown"
        );
    }
}
