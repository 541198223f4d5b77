//! Beats: this member's on a timer of their own; the group's, read by the leader.

use super::*;

/// Beats on a timer of their own (like a lock's watchdog), so that a slow drain hook or slow
/// view reads never delay them: every interval, with the seed's random constant skew once.
pub(super) async fn beat_loop(shared: Arc<Shared>, lease: Duration) {
    let interval = shared.opts.interval;
    let mut skew_left = shared
        .opts
        .skew
        .unwrap_or_else(|| interval.mul_f64(rand::random::<f64>() / 2.0));
    let mut seq: u64 = 0;
    loop {
        if let Some(until) = frozen_until(&shared) {
            tokio::time::sleep_until(until).await;
        }
        seq += 1;
        let sent = Stamp::now();
        let ok = beat(&shared, seq, false).await;
        if ok {
            let until = sent.after(lease::validity(lease));
            {
                let mut cur = shared.beat_until.lock().unwrap_or_else(|p| p.into_inner());
                if cur.is_none_or(|c| c.mono < until.mono) {
                    *cur = Some(until);
                }
            }
            shared.beaten.notify_one();
            if seq == 1 {
                // A joiner: the leader reads every half interval; the hint has it seal at once.
                // (Not awaited: the beats keep their own timer.)
                let shared = shared.clone();
                tokio::spawn(async move { hints::publish(&shared).await });
            }
        }
        // The first beat goes out at once (a fast join); the skew shifts the later ones once,
        // EARLIER (one gap shorter than an interval): a later shift would stretch one gap past
        // the lease, which outlives a beat by only a quarter interval.
        // A beat that did not reach a majority is retried soon, well before the lease ends.
        let next = if ok {
            sent.mono + interval.saturating_sub(std::mem::take(&mut skew_left))
        } else {
            Instant::now() + interval / 8
        };
        tokio::time::sleep_until(next).await;
    }
}

/// Refresh (or drop) this member's beat on every voting node; true with a majority.
pub(super) async fn beat(shared: &Shared, seq: u64, leave: bool) -> bool {
    let mode = if leave { "1" } else { "0" };
    let step = beat_step(&shared.members_key, &shared.key, &seq.to_string(), mode);
    let request = Request::vote("group.beat").wait_all_if(leave);
    shared.client.send(request, step).await.reached()
}

/// `member_beat.lua` for `member` in the hash `key`: a beat (`mode` "0"), a leave ("1"), or
/// garbage collection of the entry where it still holds `value` ("gc").
pub(super) fn beat_step(key: &str, member: &str, value: &str, mode: &str) -> Step<()> {
    script_call(&MEMBER_BEAT, Guard::Marker)
        .key(key)
        .marker_key()
        .arg(member)
        .arg(value)
        .arg(mode)
        .marker()
        .decode(|_, v| decode::one_applied(v))
}

/// The beat value a member writes when it leaves gracefully.
pub(super) const LEFT: &str = "left";

/// Remove gone members' beat entries where they still hold the value the leader watched.
pub(super) async fn collect_garbage(client: Client, key: Arc<str>, garbage: BeatGarbage) {
    let sends = garbage.into_iter().map(|(member, values)| {
        let key = key.clone();
        let steps = Steps::per_node(move |ctx| {
            let (_, v) = values.iter().find(|(n, _)| *n == ctx.node)?;
            Some(beat_step(&key, &member, v, "gc"))
        });
        let client = client.clone();
        async move {
            client
                .send(Request::vote("group.members.gc").wait_all(), steps)
                .await
        }
    });
    futures::future::join_all(sends).await;
}

pub(super) fn hgetall(key: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("HGETALL");
    cmd.arg(key);
    cmd
}

/// The beats a majority holds: the first majority to answer, and every other node that
/// answers about as fast (see [`Wait::Linger`](crate::quorum::fanout::Wait::Linger)), never
/// more than an eighth of an interval later. Every reading is from this round (the gone
/// judgement needs that), and a node whose watch restarted (a restart, a wipe) does not hold
/// up a crash judgement while the others answer; a hung node costs the leader little.
pub(super) async fn read_beats(shared: &Shared) -> Result<Vec<BeatReading>, Error> {
    let read = Step::read(vec![hgetall(&shared.members_key)], |ctx, v| {
        Ok(decode::value(v)?.map(|beats| beat_reading(ctx, beats)))
    });
    let request = Request::vote("group.members").linger(shared.opts.interval / 8);
    let tally = shared.client.decide(request, read).await?;
    Ok(tally.replies().map(|(_, r)| r.clone()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beats_leaves_and_collections_compare_the_marker() {
        for mode in ["0", "1", "gc"] {
            let step = beat_step("rq:members:g", "m#1", "12", mode);
            assert!(step.is_guarded(), "mode {mode}");
            assert_eq!(step.args_for_tests("r/c"), vec!["m#1", "12", mode, "r/c"]);
        }
    }
}
