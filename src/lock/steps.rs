//! The node steps of a lease and their pure decoders.

use super::*;

/// One node's answer to an acquisition round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Grant {
    pub(super) status: GrantStatus,
    /// The node's fence before the round.
    pub(super) fence: u64,
    /// What the key held before the round, on which incarnation.
    pub(super) seen: Seen<KeyState>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum GrantStatus {
    Granted,
    /// The key was not in the state asked for (or the round only read it).
    NotAsExpected,
    /// The key was as asked but the fence is at or above the proposed token.
    TokenLow,
    /// The node's marker is missing or stale: it may not vote.
    Refused,
}

/// One acquisition round's node step, built once per round; [`step`](Self::step) gives each
/// node its ask.
pub(super) struct AcquireStep {
    pub(super) keys: [String; 5],
    pub(super) value: Arc<str>,
    pub(super) ttl_ms: u64,
    pub(super) token: u64,
    /// The test-only server-side expiry.
    pub(super) expiry: bool,
}

impl AcquireStep {
    /// `lock_acquire.lua` for one node: grant if free, swap the watched state (compared with
    /// the incarnation it was watched on), or only read.
    pub(super) fn step(&self, ask: &Ask) -> Step<Grant> {
        let call = script_call(&LOCK_ACQUIRE, Guard::Marker)
            .key(&self.keys[0])
            .key(&self.keys[1])
            .key(&self.keys[2])
            .key(&self.keys[3])
            .key(&self.keys[4])
            .arg(&*self.value)
            .arg(self.ttl_ms)
            .arg(self.token);
        let call = match ask {
            Ask::Read => call.marker().arg("read").arg("").arg(0),
            Ask::Swap(Seen {
                state: KeyState::Absent,
                ..
            }) => call.marker().arg("absent").arg("").arg(0),
            Ask::Swap(Seen {
                run_id,
                state: KeyState::Held { value, version, .. },
            }) => call
                .marker_as(run_id)
                .arg("swap")
                .arg(&**value)
                .arg(*version),
        };
        call.arg(if self.expiry { "x" } else { "" })
            .decode(|ctx, v| decode_grant(&ctx.marker, v))
    }
}

/// A node's answer to `lock_acquire.lua`: `{status, fence, value, version, ttl}`.
pub(super) fn decode_grant(
    marker: &Arc<str>,
    v: redis::Value,
) -> redis::RedisResult<NodeOutcome<Grant>> {
    let (status, fence, cur_value, cur_version, cur_ttl): (i64, u64, String, u64, u64) =
        redis::from_redis_value(v)?;
    let state = if cur_value.is_empty() {
        KeyState::Absent
    } else {
        KeyState::Held {
            value: cur_value.into(),
            version: cur_version,
            ttl: Duration::from_millis(cur_ttl),
        }
    };
    let grant = Grant {
        status: match status {
            1 => GrantStatus::Granted,
            0 => GrantStatus::NotAsExpected,
            -2 => GrantStatus::TokenLow,
            _ => GrantStatus::Refused,
        },
        fence,
        seen: Seen {
            run_id: marker.clone(),
            state,
        },
    };
    Ok(if status == 1 {
        NodeOutcome::Applied(grant)
    } else {
        NodeOutcome::Rejected(grant)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::NodeCtx;
    use redis::Value;

    fn acquire() -> AcquireStep {
        AcquireStep {
            keys: ["k".into(), "f".into(), "m".into(), "fl".into(), "lf".into()],
            value: "v1".into(),
            ttl_ms: 1000,
            token: 7,
            expiry: false,
        }
    }

    fn ctx() -> NodeCtx {
        NodeCtx {
            node: 0,
            marker: "run/c".into(),
            run_id: "run".into(),
        }
    }

    #[test]
    fn every_acquisition_ask_compares_a_marker() {
        let held = Seen {
            run_id: "watched/c".into(),
            state: KeyState::Held {
                value: "old".into(),
                version: 3,
                ttl: Duration::from_secs(1),
            },
        };
        let absent = Seen {
            run_id: "run/c".into(),
            state: KeyState::Absent,
        };
        let cases = [
            (
                Ask::Read,
                vec!["v1", "1000", "7", "run/c", "read", "", "0", ""],
            ),
            (
                Ask::Swap(absent),
                vec!["v1", "1000", "7", "run/c", "absent", "", "0", ""],
            ),
            (
                Ask::Swap(held),
                vec!["v1", "1000", "7", "watched/c", "swap", "old", "3", ""],
            ),
        ];
        for (ask, args) in cases {
            let step = acquire().step(&ask);
            assert!(step.is_guarded(), "{ask:?} carries a marker");
            assert_eq!(
                step.args_for_tests("run/c"),
                args,
                "{ask:?}: the script's ARGV"
            );
        }
    }

    #[test]
    fn a_grant_is_decoded_with_the_incarnation_it_was_seen_on() {
        let reply = |status: i64, value: &str| {
            Value::Array(vec![
                Value::Int(status),
                Value::Int(41),
                Value::BulkString(value.as_bytes().to_vec()),
                Value::Int(2),
                Value::Int(1000),
            ])
        };
        let step = acquire().step(&Ask::Read);
        let granted = step
            .decode_for_tests(&ctx(), reply(1, ""))
            .expect("decodes");
        let NodeOutcome::Applied(g) = granted else {
            panic!("status 1 is a grant: {granted:?}")
        };
        assert_eq!((g.status, g.fence), (GrantStatus::Granted, 41));
        assert_eq!(g.seen.state, KeyState::Absent);
        assert_eq!(&*g.seen.run_id, "run/c", "seen on this node's incarnation");
        let cases = [
            (0, GrantStatus::NotAsExpected),
            (-2, GrantStatus::TokenLow),
            (-1, GrantStatus::Refused),
        ];
        for (status, want) in cases {
            match step.decode_for_tests(&ctx(), reply(status, "other")) {
                Ok(NodeOutcome::Rejected(g)) => {
                    assert_eq!(g.status, want, "status {status}");
                    assert!(matches!(g.seen.state, KeyState::Held { version: 2, .. }));
                }
                other => panic!("status {status}: {other:?}"),
            }
        }
        assert!(
            step.decode_for_tests(&ctx(), Value::Int(1)).is_err(),
            "a malformed reply is an error, so the node's outcome is unknown"
        );
    }
}
