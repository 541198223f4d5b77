//! Acquisition: rounds, waiting for a holder, scoped work, release.

use super::fold::Mode;
use super::*;

/// Acquisition rounds one attempt may take (retries after a token guess that was behind).
const ROUNDS: u32 = 6;

impl Lock {
    /// One acquisition attempt, for a caller that will not wait for a live holder (a cron
    /// job, a one-shot process). When the lease is held, the attempt watches it: a holder
    /// that is alive shows it within its lease time (an extension changes its copy's version
    /// on a node the attempt already saw it on, or a new holder's copies replace the ones seen
    /// on a majority; a new value on fewer nodes may be a contender about to release, and is
    /// watched), and the attempt then returns [`Error::LockHeld`] at once (a release lets the
    /// attempt acquire); a lease
    /// that stays unchanged on a majority for its own TTL (the one its holder chose, stored
    /// on the nodes, whatever this handle's TTL) plus drift, on this client's monotonic
    /// clock, was abandoned (its holder crashed), and the attempt takes it over by
    /// compare-and-swap, exactly as a waiting [`acquire`](Self::acquire) would. So it returns
    /// at once when the lock is free, within about one or two of the holder's extension
    /// intervals when it is held by a live holder, and after the holder's TTL plus drift when
    /// the holder is gone. The watch is bounded by twice that window (of the longer of the
    /// two TTLs) plus the operation timeout.
    ///
    /// # Errors
    /// [`Error::LockHeld`] if another holder has it (and showed it is alive);
    /// [`Error::LockLooksAbandoned`] if the bound was reached while the lease stayed quiet on
    /// a majority but could not be taken yet (its state kept changing on a minority);
    /// [`Error::NoQuorum`]
    /// if a majority did not answer; [`Error::TooSlow`] if the nodes answered too slowly to
    /// leave half the TTL of validity; [`Error::Contended`] if every round's token fell behind
    /// concurrent grants of locks sharing its fence floor bucket (retryable). Every failed
    /// attempt is released on every node.
    ///
    /// # Cancel safety
    /// Cancel-safe: a round in flight when the call is dropped is released on every node in the
    /// background, so a lease it may have won is never left behind.
    pub async fn try_acquire(&self) -> Result<LockGuard, Error> {
        self.counted_attempt(true).await
    }

    /// One acquisition attempt, without watching a held lease across
    /// rounds: a contender that watches the lease from readings of its own
    /// ([`observe_readings`](Self::observe_readings)) tries when [`ready_at`](Self::ready_at)
    /// says so. Errors and cancel safety as [`try_acquire`](Self::try_acquire).
    pub(crate) async fn attempt_once(&self) -> Result<LockGuard, Error> {
        self.counted_attempt(false).await
    }

    /// One attempt, counted (see [`try_acquire`](Self::try_acquire)); `watching`: watch a held
    /// lease until its holder shows it is alive or its window ends.
    async fn counted_attempt(&self, watching: bool) -> Result<LockGuard, Error> {
        let result = if watching {
            self.attempt_watching().await
        } else {
            self.attempt().await
        };
        crate::metrics::lease_acquisition(&result);
        result
    }

    /// Acquire, retrying after random delays (and as soon as the holder releases) until `wait`
    /// has passed. `Duration::ZERO` tries once.
    ///
    /// # Errors
    /// [`Error::LockLooksAbandoned`] when the wait ends before the takeover of a lease that
    /// stayed unchanged on a majority for at least half its own TTL (its holder is probably
    /// gone: the error says when it can be taken); [`Error::Timeout`] when the wait ends with
    /// the lock otherwise still held (its holder showed it is alive, or the wait was too short
    /// to tell); with `wait` zero, as [`try_acquire`](Self::try_acquire); [`Error::NoQuorum`],
    /// [`Error::TooSlow`] or [`Error::Contended`] when the last attempt lacked a majority,
    /// answered too late or kept falling behind (nobody was seen holding it); invalid input
    /// errors at once.
    ///
    /// # Cancel safety
    /// Cancel-safe, like [`try_acquire`](Self::try_acquire).
    pub async fn acquire(&self, wait: Duration) -> Result<LockGuard, Error> {
        let started = Instant::now();
        let deadline = started + wait;
        let released = Arc::new(Notify::new());
        // Waiters listen for releases, from their first failed try on: a first try that wins
        // (or a single try) needs no subscription. A release between that try and the
        // subscription is only seen by the next poll (the hint shortens sleeps, nothing more).
        let mut watch = None;
        loop {
            // A single try watches a held lease (see `try_acquire`); a waiting caller's
            // tries do not, its loop watches across them until its own deadline.
            let err = match self.counted_attempt(wait.is_zero()).await {
                Ok(g) => return Ok(g),
                Err(
                    e @ (Error::LockHeld { .. }
                    | Error::NoQuorum(_)
                    | Error::Timeout { .. }
                    | Error::TooSlow { .. }
                    | Error::Contended { .. }),
                ) => e,
                Err(other) => return Err(other),
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(match err {
                    // The wait ended first: a lease that stayed quiet is said to look
                    // abandoned (with when it can be taken), anything else is a timeout.
                    Error::LockHeld { .. } if !wait.is_zero() => {
                        self.looks_abandoned(now).unwrap_or(Error::Timeout {
                            op: "lock.acquire",
                            waited: now - started,
                        })
                    }
                    other => other,
                });
            }
            if watch.is_none() {
                watch = Some(ReleaseWatch::start(&self.inner, released.clone()));
            }
            // A random delay longer than an acquisition takes, so waiters spread out.
            let base =
                (self.inner.ttl / 10).clamp(Duration::from_millis(10), Duration::from_millis(500));
            let delay = base.mul_f64(0.5 + rand::random::<f64>());
            tokio::select! {
                _ = tokio::time::sleep_until((now + delay).min(deadline)) => {}
                _ = released.notified() => {}
            }
        }
    }

    /// Run `work` while holding the lock: acquire (waiting up to `wait`), run the future,
    /// cancel it (drop it) as soon as the lease is lost, then release.
    ///
    /// The closure receives the fencing token and a cancellation token that is cancelled on
    /// loss; pass them to anything the work spawns.
    ///
    /// # Errors
    /// Acquisition errors as in [`acquire`](Self::acquire); [`Error::LeaseLost`] if the lease
    /// was lost before `work` finished (the work was cancelled).
    ///
    /// # Cancel safety
    /// Dropping the call drops `work` wherever it is and releases the lease in the
    /// background; the work's own side effects are the caller's to reason about (use the
    /// fencing token).
    pub async fn run<F, Fut, T>(&self, wait: Duration, work: F) -> Result<T, Error>
    where
        F: FnOnce(FencingToken, CancellationToken) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.acquire(wait).await?;
        // Boxed so it can be dropped (stopped, destructors run) before the release.
        let mut fut = Box::pin(work(guard.token(), guard.cancellation_token()));
        tokio::select! {
            out = &mut fut => {
                let _ = guard.release().await;
                Ok(out)
            }
            reason = guard.lost() => {
                drop(fut);
                let _ = guard.release().await;
                Err(Error::LeaseLost { name: self.name().to_string(), reason })
            }
        }
    }

    /// [`attempt`](Self::attempt), and while the lease is held but quiet, read rounds until
    /// the holder shows it is alive (an extension, or a new holder on a majority: see
    /// [`decide::holder_alive`]) or the window ends (the next attempt takes it over). Bounded
    /// by [`lease::one_shot_watch`] (twice the watch window of the longest lease time known:
    /// this handle's or the one the nodes store for the lease, so a holder with a longer TTL
    /// than ours is outwaited too) plus an operation timeout; a lease still quiet then is
    /// said to look abandoned.
    async fn attempt_watching(&self) -> Result<LockGuard, Error> {
        let inner = &self.inner;
        let needed = inner.client.majority().needed();
        let started = Instant::now();
        let slack = inner.client.config().operation_timeout();
        let poll = (inner.ttl / 8).clamp(Duration::from_millis(10), Duration::from_millis(500));
        let mut held: Vec<Option<Seen<KeyState>>> = vec![None; inner.client.node_urls().len()];
        let mut own: Vec<Arc<str>> = Vec::new();
        loop {
            let result = self.attempt_recording(Some(&mut own)).await;
            if !matches!(result, Err(Error::LockHeld { .. })) {
                return result;
            }
            let now = Instant::now();
            let (plan, seen, limit) = {
                let watch = inner.watch();
                // The bound follows the lease's stored TTL, learnt from the rounds' readings.
                let limit = started + lease::one_shot_watch(inner.ttl, &watch) + slack;
                let plan = lease::plan_with(&watch, needed, now, inner.takeover_window);
                let seen: Vec<Option<Seen<KeyState>>> = (0..watch.len())
                    .map(|i| watch.get(i).map(|(s, _)| s.clone()))
                    .collect();
                (plan, seen, limit)
            };
            if now >= limit {
                return Err(self.looks_abandoned(now).unwrap_or(Error::LockHeld {
                    name: inner.name.as_str().to_string(),
                }));
            }
            match plan {
                Plan::WaitUntil(t) => {
                    if decide::holder_alive(&held, &seen, &own, needed) {
                        return result;
                    }
                    decide::remember_held(&mut held, &seen);
                    // Jittered: callers that split a takeover and released together do not
                    // read, and try again, in step. Never longer than the poll: a live holder
                    // is seen no later than before (a caller may be timing its answer).
                    let poll = poll.mul_f64(0.5 + rand::random::<f64>() / 2.0);
                    tokio::time::sleep_until(t.min(now + poll).min(limit)).await;
                }
                // Ready now: the next attempt swaps the quiet lease, unless the holder showed
                // it is alive meanwhile (an extension, or a new holder on a majority).
                Plan::Attempt(_) => {
                    if decide::holder_alive(&held, &seen, &own, needed) {
                        return result;
                    }
                    decide::remember_held(&mut held, &seen);
                }
            }
        }
    }

    /// [`Error::LockLooksAbandoned`] for a caller whose limit ends at `now` while the lease a
    /// majority holds looks abandoned (see [`lease::quiet_lease`]), with when it can be taken.
    fn looks_abandoned(&self, now: Instant) -> Option<Error> {
        let inner = &self.inner;
        let needed = inner.client.majority().needed();
        let quiet = lease::quiet_lease(&inner.watch(), needed, now, inner.takeover_window)?;
        Some(Error::LockLooksAbandoned {
            name: inner.name.as_str().to_string(),
            ttl: quiet.ttl,
            quiet_for: quiet.quiet_for,
            takeover_in: quiet.ready_at.saturating_duration_since(now),
        })
    }

    /// One attempt: rounds until granted, held, contended or out of time.
    pub(super) async fn attempt(&self) -> Result<LockGuard, Error> {
        self.attempt_recording(None).await
    }

    /// [`attempt`](Self::attempt), adding each round's value that may be granted to `own`.
    async fn attempt_recording(
        &self,
        mut own: Option<&mut Vec<Arc<str>>>,
    ) -> Result<LockGuard, Error> {
        let inner = &self.inner;
        let started = Instant::now();
        for round in 0..ROUNDS {
            let (token, value) = self.proposal(round)?;
            let stamp = Stamp::now();
            let start = stamp.mono;
            let asks = self.round_asks(start);
            let only_reads = asks.iter().all(|a| *a == Ask::Read);
            if let Some(own) = own.as_deref_mut().filter(|_| !only_reads) {
                own.push(value.clone());
            }
            // From here until the round is released or its grant is a guard, a drop of this
            // attempt (the caller went away) releases the round in the background.
            let mut undo = UndoRound {
                lock: self,
                value: (!only_reads && inner.undo_dropped_rounds).then(|| value.clone()),
                token,
                runtime: tokio::runtime::Handle::try_current().ok(),
            };
            let tally = self.send_round(&value, token, asks).await;
            let took = start.elapsed();
            self.learn_from(&tally, token, Instant::now());
            let until = stamp.after(lease::validity(inner.ttl));
            let verdict = self.judge(&tally, only_reads, until);
            // A round that was not granted is undone everywhere (also on nodes whose reply
            // was not awaited: they may have granted), rolled back where its grant is
            // untouched (`undo.rs`): no caller was given its token.
            if verdict == decide::AfterRound::TooSlow
                || (verdict != decide::AfterRound::Granted && !only_reads)
            {
                self.undo_round(&value, token).await;
            }
            undo.value = None;
            match verdict {
                decide::AfterRound::Granted => {
                    tracing::debug!(lock = %inner.name, token, "lease granted");
                    let token = FencingToken::new(token);
                    return Ok(LockGuard::start(self.clone(), value, token, start, until));
                }
                decide::AfterRound::TooSlow => {
                    return Err(Error::TooSlow {
                        op: "lock.acquire",
                        took,
                    })
                }
                decide::AfterRound::Again => continue,
                decide::AfterRound::Held => {
                    return Err(Error::LockHeld {
                        name: inner.name.as_str().to_string(),
                    })
                }
                decide::AfterRound::NoQuorum => return Err(self.no_quorum(&tally)),
            }
        }
        // Every round was a retry (our token guess kept falling behind other grants in this
        // lock's floor bucket): contention, not a holder.
        Err(Error::Contended {
            op: "lock.acquire",
            attempts: ROUNDS,
            elapsed: started.elapsed(),
        })
    }

    /// What each node is asked in a round starting `now`: the plan's asks, or (not ready yet)
    /// reads that refresh what the nodes hold (a holder that extends or releases shows it).
    fn round_asks(&self, now: Instant) -> Vec<Ask> {
        let inner = &self.inner;
        let needed = inner.client.majority().needed();
        match lease::plan_with(&inner.watch(), needed, now, inner.takeover_window) {
            Plan::Attempt(asks) => asks,
            Plan::WaitUntil(_) => vec![Ask::Read; inner.client.node_urls().len()],
        }
    }

    /// The error of a round that too few nodes answered, naming each node's answer.
    fn no_quorum(&self, tally: &Tally<Grant>) -> Error {
        let urls = self.inner.client.node_urls();
        NoQuorum::from_tally("lock.acquire", tally, &urls, |g| format!("{:?}", g.status)).into()
    }

    /// Round `round`'s token (above the highest fence this handle knows, see
    /// [`decide::next_token`]) and lease value: 128 random bits (fresh per round), the token,
    /// the holder description.
    ///
    /// # Errors
    /// [`Error::Exhausted`] when the token would reach 2^53.
    fn proposal(&self, round: u32) -> Result<(u64, Arc<str>), Error> {
        let inner = &self.inner;
        let known = inner.known_fence.load(Ordering::Acquire);
        let token = decide::next_token(known, round, &mut rand::rng());
        if token >= VALUE_LIMIT {
            return Err(Error::Exhausted {
                sequence: format!("fence of lock {}", inner.name.as_str()),
                limit: VALUE_LIMIT,
            });
        }
        let value: Arc<str> = format!("{}:{}:{}", random_hex128(), token, inner.holder).into();
        Ok((token, value))
    }

    /// What a round's tally means (see [`decide::after_round`]).
    fn judge(&self, tally: &Tally<Grant>, only_reads: bool, until: Stamp) -> decide::AfterRound {
        let needed = tally.majority().needed();
        decide::after_round(decide::Round {
            reached: tally.reached(),
            validity_left: until.end().saturating_duration_since(Instant::now()),
            min_validity: self.inner.min_validity,
            token_low: tally
                .replies()
                .any(|(_, g)| g.status == GrantStatus::TokenLow),
            only_reads,
            ready_now: only_reads
                && matches!(
                    lease::plan_with(
                        &self.inner.watch(),
                        needed,
                        Instant::now(),
                        self.inner.takeover_window
                    ),
                    Plan::Attempt(_)
                ),
            held_seen: tally
                .replies()
                .any(|(_, g)| matches!(g.seen.state, KeyState::Held { .. })),
            replies: tally.replies().count(),
            needed,
        })
    }

    /// Learn from a round's replies: the highest fence (bounded: a fence far above what a
    /// majority reports, from a corrupted or hostile node, is not learned, or the token would
    /// jump toward its limit), and what each node holds, seen at `seen_at`.
    fn learn_from(&self, tally: &Tally<Grant>, token: u64, seen_at: Instant) {
        let inner = &self.inner;
        let needed = tally.majority().needed();
        let fences: Vec<u64> = tally.replies().map(|(_, g)| g.fence).collect();
        let known = inner.known_fence.load(Ordering::Acquire);
        let (highest, set_aside) = bounded_learn(&fences, needed, known, MAX_FENCE_JUMP);
        if set_aside {
            tracing::warn!(lock = %inner.name.as_str(), fences = ?fences, learned = highest, "a node reports a fence far above the majority; not jumping to it");
        }
        let granted = if tally.applied() > 0 { token } else { 0 };
        inner
            .known_fence
            .fetch_max(highest.max(granted), Ordering::AcqRel);
        let mut watch = inner.watch();
        for r in tally.results() {
            match &r.outcome {
                NodeOutcome::Applied(_) => watch.forget(r.node.0),
                NodeOutcome::Rejected(g) if g.status == GrantStatus::Refused => {
                    watch.forget(r.node.0);
                    inner.client.suspect(r.node.0);
                }
                NodeOutcome::Rejected(g) => watch.observe(r.node.0, g.seen.clone(), seen_at),
                NodeOutcome::Unknown(_) => {}
            }
        }
    }

    /// One acquisition round: to each node its ask (grant if free, swap a watched stale
    /// key, or only read), decided as soon as a majority granted or cannot.
    pub(super) async fn send_round(
        &self,
        value: &Arc<str>,
        token: u64,
        asks: Vec<Ask>,
    ) -> Tally<Grant> {
        let inner = &self.inner;
        let acquire = AcquireStep {
            keys: self.lease_keys(),
            value: value.clone(),
            ttl_ms: inner.ttl.as_millis() as u64,
            token,
            expiry: inner.server_clock,
        };
        let asks: Arc<[Ask]> = asks.into();
        let steps = Steps::per_node(move |ctx| {
            let ask = asks.get(ctx.node).cloned().unwrap_or(Ask::Read);
            Some(acquire.step(&ask))
        });
        let request = Request::vote("lock.acquire").within(inner.node_deadline);
        inner.client.send(request, steps).await
    }

    /// The lease's keys on a node: the lock, its fence, the marker, its fence floor bucket,
    /// the earlier release's single floor.
    pub(super) fn lease_keys(&self) -> [String; 5] {
        [
            self.inner.key.clone(),
            self.inner.fence_key.clone(),
            self.inner.marker_key.clone(),
            self.inner.floor_key.clone(),
            fixed_key(KeyKind::FenceFloor),
        ]
    }

    /// Compare-and-delete of a lease this handle held (its guard's release) on every node
    /// (also nodes that did not answer: they may have applied). Returns how many nodes had
    /// deleted it when the outcome was decided; slower nodes are still sent the release, in the
    /// background (a copy left anyway is taken over after its TTL plus drift, like a crashed
    /// holder's), so one frozen node does not slow a release down. The fence is folded into
    /// the floor, or, for a release soon after the handle's previous one, kept for the next
    /// grant to rewrite, owing a collect (see [`fold`](super::fold)). Never a rollback: the
    /// token may have been used (a round no caller was given is undone by `undo_round`).
    ///
    /// Cancel safety: a release dropped before its decision may not reach every node; the
    /// guard's drop sends it again in the background.
    pub(super) async fn release_held(&self, value: &Arc<str>) -> usize {
        let mode = self.inner.folds().on_release(Instant::now());
        if mode
            == (Mode::Keep {
                start_collector: true,
            })
        {
            tokio::spawn(self.clone().collect_when_idle());
        }
        let foreign_counted = self.inner.release_counts_foreign_copies;
        self.release_in(value, mode, foreign_counted).await
    }

    /// `foreign_counted` (TEST ONLY, the switch
    /// `Config::with_foreign_copies_counted_on_release_for_tests`): a node that deleted
    /// nothing (it holds another holder's copy, or none) counts as one that deleted this one.
    async fn release_in(&self, value: &Arc<str>, mode: Mode, foreign_counted: bool) -> usize {
        let step = self
            .release_call(value, mode.script_arg())
            .decode(move |_, v| match decode::one_applied(v) {
                Ok(NodeOutcome::Rejected(())) if foreign_counted => Ok(NodeOutcome::Applied(())),
                other => other,
            });
        self.send_release(step).await
    }

    /// `lock_release.lua` on this lock's keys for the copy `value`, in `mode` (further
    /// arguments and the decoder are the caller's). No marker check: deleting one's own copy
    /// is safe on any node, verified or not.
    pub(super) fn release_call(
        &self,
        value: &str,
        mode: &'static str,
    ) -> crate::client::ScriptCall {
        let inner = &self.inner;
        script_call(&LOCK_RELEASE, Guard::None("deleting one's own copy"))
            .key(&inner.key)
            .key(&inner.fence_key)
            .key(&inner.floor_key)
            .arg(value)
            .arg(&inner.channel)
            .arg(mode)
    }

    /// Send a release step to every node (also nodes that did not answer the round: they
    /// may have applied), finishing in the background; how many applied it when decided.
    pub(super) async fn send_release(&self, step: Step<()>) -> usize {
        let request = Request::any_node("lock.release", Targets::All)
            .within(self.inner.node_deadline)
            .finishing_in_background();
        self.inner.client.send(request, step).await.applied()
    }

    /// The collect a kept fence owes: once this handle has released nothing for the fold
    /// window, every voting node that holds no copy of the lock folds the fence into its
    /// floor. Only verified nodes, and behind the marker: a node under repair may be given a
    /// fence that its restore of a lease copy must still read. Best effort: a node that does
    /// not answer, or holds a copy, keeps the fence key until the lock's next fold.
    async fn collect_when_idle(self) {
        loop {
            let due = self.inner.folds().collect_due(Instant::now());
            match due {
                Ok(()) => break,
                Err(at) => tokio::time::sleep_until(at).await,
            }
        }
        let inner = &self.inner;
        let step = script_call(&LOCK_RELEASE, Guard::Marker)
            .key(&inner.key)
            .key(&inner.fence_key)
            .key(&inner.floor_key)
            .marker_key()
            .arg("")
            .arg(&inner.channel)
            .arg("collect")
            .marker()
            .decode(|_, v| {
                // 1 folded, 0 nothing to fold here (no fence, or a copy keeps it): both done.
                let status: i64 = redis::from_redis_value(v)?;
                Ok(if status >= 0 {
                    NodeOutcome::Applied(())
                } else {
                    crate::client::stale()
                })
            });
        let request = Request::vote("lock.fold")
            .wait_all()
            .within(inner.node_deadline);
        let _ = inner.client.send(request, step).await;
    }
}

/// Releases a round's value in the background when dropped armed: the attempt was dropped while
/// its round may have been granted on some node.
struct UndoRound<'a> {
    lock: &'a Lock,
    /// The round's value while it may be granted somewhere (never for a read-only round).
    value: Option<Arc<str>>,
    /// The round's token (its undo rolls back a grant still untouched).
    token: u64,
    /// The runtime the round runs on, so the release is spawned there even when the attempt is
    /// dropped on a thread outside it.
    runtime: Option<tokio::runtime::Handle>,
}

impl Drop for UndoRound<'_> {
    fn drop(&mut self) {
        let Some(value) = self.value.take() else {
            return;
        };
        let lock = self.lock.clone();
        let token = self.token;
        if let Some(runtime) = &self.runtime {
            runtime.spawn(async move {
                lock.undo_round(&value, token).await;
            });
        }
    }
}

/// 128 random bits from the OS CSPRNG, as 32 hex digits.
pub(super) fn random_hex128() -> String {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        // The OS CSPRNG is unavailable (it never is on Linux); fall back to the thread RNG,
        // which is itself seeded from the OS.
        bytes = rand::random();
    }
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(32);
    for b in bytes {
        hex.push(char::from(HEX[usize::from(b >> 4)]));
        hex.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    hex
}
