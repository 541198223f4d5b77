//! The group view register on the quorum nodes: how views are read, chosen and sealed.
//!
//! A view is stored on each node as `{token, view, hash}` and written by `view_write.lua` as a
//! compare-and-set on the version it was derived from (its `base`): a node takes a view only
//! while it holds that base or an older version. Readers take the highest version a majority
//! returned and write it back (the same compare-and-set) before adopting it; when a majority
//! answered with that very view, it is on a majority already and the write-back, which would
//! change nothing on any of them, is skipped.
//!
//! # Why views cannot fork
//! - *One version, one view.* A sealer never reuses a sequence number within its term, even
//!   after a seal that reached only some nodes ([`View::above_attempts`]); terms are lease
//!   tokens, one sealer each. A node refuses a view whose version it holds with another digest.
//! - *One chain.* Say views X and Y were both derived from base B (X < Y), and X was adopted:
//!   X is on a majority (written back before adoption, or found on a majority by the read). Y can then reach no majority: every
//!   majority includes a node holding X or newer, which is above B, so the compare-and-set
//!   refuses Y there. Symmetrically, once Y is on a majority, X (lower) is refused by every node
//!   holding Y, and every majority read returns Y or newer. So of the views derived from one
//!   base at most one is ever adopted, and every adopted view derives from the adopted view
//!   before it: a prepared view's draining set names every member that worked under the last
//!   adopted active view.
//!
//! Architecture invariant: a view is adopted only after a majority holds it, and every write of
//! a view (seal, write-back, repair) is the compare-and-set on its base.

use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use super::assign::{parse_int, View, ViewVersion};
use crate::client::{decode as client_decode, script_call, Client, Guard, NodeCtx, Request, Step};
use crate::error::{Error, NoQuorum};
use crate::lease::{BeatReading, KeyState, Seen};
use crate::quorum::NodeOutcome;
use crate::scripts::VIEW_WRITE;

/// One node's view register as read: its token, and the view with its stored digest (or why it
/// is unreadable).
pub(crate) type StoredView = (u64, Option<Result<View, String>>);

/// Decode a node's `{token, view, hash}`: the view must parse, match its digest and carry the
/// stored version. Anything else is a corrupted register, reported, never read as empty.
pub(crate) fn decode(
    token: Option<String>,
    json: Option<String>,
    hash: Option<String>,
) -> StoredView {
    let token = match token.as_deref().map(parse_int) {
        None => return (0, None),
        Some(Some(t)) => t,
        Some(None) => return (0, Some(Err(format!("corrupted view token {token:?}")))),
    };
    let view = match json {
        None => Err("view token without a view".to_string()),
        Some(json) => match (serde_json::from_str::<View>(&json), hash) {
            (Err(e), _) => Err(format!("unreadable view: {e}")),
            (Ok(_), Some(h)) if h != View::digest(&json) => {
                Err("the view does not match its digest".into())
            }
            (Ok(v), _) if v.version.token().map(|t| t.get()) != Some(token) => {
                Err("the view's version is not its token".into())
            }
            (Ok(v), _) => Ok(v),
        },
    };
    (token, Some(view))
}

/// One node's beats as read on the node `ctx` names (its index and incarnation with them).
pub(crate) fn beat_reading(
    ctx: &NodeCtx,
    beats: std::collections::BTreeMap<String, String>,
) -> BeatReading {
    (
        ctx.node,
        ctx.marker.clone(),
        beats
            .into_iter()
            .map(|(k, v)| (k, Arc::<str>::from(v)))
            .collect(),
    )
}

/// Choose the view a majority's answers name: the highest version. A corrupted register, or two
/// different views at one version (impossible unless a node was tampered with), is an error:
/// the reader adopts nothing rather than guess.
pub(crate) fn pick(answers: &[&StoredView]) -> Result<Option<View>, String> {
    let mut best: Option<(u64, &View)> = None;
    for (token, view) in answers {
        let view = match view {
            None => continue,
            Some(Err(e)) => return Err(e.clone()),
            Some(Ok(v)) => v,
        };
        match best {
            Some((t, b)) if t == *token && b != view => {
                return Err(format!(
                    "two different views at version {:?}: refusing both",
                    view.version
                ))
            }
            Some((t, _)) if t >= *token => {}
            _ => best = Some((*token, view)),
        }
    }
    Ok(best.map(|(_, v)| v.clone()))
}

/// A node's `token`, `view` and `hash` fields as stored.
type RawView = (Option<String>, Option<String>, Option<String>);

/// What a view read carries besides the view, in the same marker-checked transaction.
#[derive(Clone, Default)]
pub(crate) struct Extras {
    /// The group's beats (a leader judges from them; a deputy keeps its watch of them warm).
    pub(crate) beats: bool,
    /// The group leader's lease, read by `Lock::lease_read` (a contender watches it).
    pub(crate) lease: Option<redis::Cmd>,
    /// Also take the answers of nodes that reply this much later than a majority (see
    /// [`Wait::Linger`](crate::quorum::fanout::Wait::Linger)): a leader judges from every node
    /// that answers about as fast, so a node whose watch restarted does not hold a judgement
    /// up while the others answer.
    pub(crate) linger: Option<std::time::Duration>,
}

/// One node's answer to a view read: its view, and what rode along.
type NodeReading = (StoredView, Option<BeatReading>, Option<Seen<KeyState>>);

/// A majority's answers to one view read, with what rode along (empty when not asked).
pub(crate) struct Reading {
    pub(crate) views: Vec<StoredView>,
    pub(crate) beats: Vec<BeatReading>,
    /// The leader lease as each answering node holds it.
    pub(crate) lease: Vec<(usize, Seen<KeyState>)>,
    pub(crate) at: Instant,
    /// Nodes needed for a majority of the list the reading ran on (a client that follows a
    /// node-list change meanwhile judges this reading by its own list, not the new one).
    pub(crate) needed: usize,
}

/// Decode one node's reply to a view read with `extras` (one reply per command, in order).
fn decode_reading(
    ctx: &NodeCtx,
    v: redis::Value,
    extras: (bool, bool),
) -> redis::RedisResult<NodeReading> {
    let (beats, lease) = extras;
    let mut replies = if beats || lease {
        redis::from_redis_value::<Vec<redis::Value>>(v)?.into_iter()
    } else {
        vec![v].into_iter()
    };
    let mut next = || {
        replies.next().ok_or_else(|| {
            redis::RedisError::from((redis::ErrorKind::Parse, "a view read's reply is short"))
        })
    };
    let (token, json, hash): RawView = redis::from_redis_value(next()?)?;
    let beats = match beats {
        true => Some(beat_reading(ctx, redis::from_redis_value(next()?)?)),
        false => None,
    };
    let lease = match lease {
        true => Some(crate::lock::decode_lease(&ctx.marker, next()?)?),
        false => None,
    };
    Ok((decode(token, json, hash), beats, lease))
}

/// The group's view register.
#[derive(Clone)]
pub(crate) struct ViewRegister {
    client: Client,
    key: Arc<str>,
    members_key: Arc<str>,
    /// TEST ONLY: the forkable register (set-if-greater, versions reused after a partial seal).
    forkable: bool,
    /// The highest version this sealer tried in its term.
    attempted: Arc<Mutex<Option<ViewVersion>>>,
}

impl ViewRegister {
    pub(crate) fn new(
        client: &Client,
        key: Arc<str>,
        members_key: Arc<str>,
        forkable: bool,
    ) -> Self {
        ViewRegister {
            client: client.clone(),
            key,
            members_key,
            forkable,
            attempted: Arc::default(),
        }
    }

    /// Read the register from a majority, with `extras` in the same round trip: a deputy
    /// keeps a warm watch of the beats, so that as a new leader it can judge a crashed member
    /// without waiting a whole lease time first, and watches the leader lease, so that it can
    /// take over a crashed leader's without rounds of its own.
    pub(crate) async fn read(&self, extras: &Extras) -> Result<Reading, Error> {
        let mut view = redis::cmd("HMGET");
        view.arg(&*self.key).arg("token").arg("view").arg("hash");
        let mut cmds = vec![view];
        if extras.beats {
            let mut beats = redis::cmd("HGETALL");
            beats.arg(&*self.members_key);
            cmds.push(beats);
        }
        cmds.extend(extras.lease.clone());
        let asked = (extras.beats, extras.lease.is_some());
        let read = Step::read(cmds, move |ctx, v| {
            Ok(NodeOutcome::Applied(decode_reading(ctx, v, asked)?))
        });
        let request = match extras.linger {
            Some(extra) => Request::vote("group.view.read").linger(extra),
            None => Request::vote("group.view.read"),
        };
        let tally = self.client.decide(request, read).await?;
        let at = Instant::now();
        let mut reading = Reading {
            views: Vec::new(),
            beats: Vec::new(),
            lease: Vec::new(),
            at,
            needed: tally.majority().needed(),
        };
        for (node, (view, beats, lease)) in tally.replies() {
            reading.views.push(view.clone());
            reading.beats.extend(beats.clone());
            reading.lease.extend(lease.clone().map(|l| (node.0, l)));
        }
        Ok(reading)
    }

    /// Whether a majority of the configured nodes answered `reading` with the view it names
    /// (`version`): that view is then on a majority already, and a write-back would change
    /// nothing anywhere.
    fn held_by_majority(&self, reading: &Reading, version: ViewVersion) -> bool {
        let token = version.token().map(|t| t.get());
        let holding = reading
            .views
            .iter()
            .filter(|(t, v)| Some(*t) == token && matches!(v, Some(Ok(_))))
            .count();
        holding >= reading.needed
    }

    /// The view a reading names, written back to a majority first unless a majority of the
    /// reading already held it (either way every later reader sees at least this view). `View::empty()` when the group has none yet.
    #[cfg(feature = "test-util")]
    pub(crate) async fn adopt(&self, reading: &Reading) -> Result<View, Error> {
        self.try_adopt(reading).await.map_err(|(e, _)| e)
    }

    /// As [`ViewRegister::adopt`]; a failure says whether some node already holds a view newer
    /// than the one written back (a leader sealed one meanwhile: read again).
    async fn try_adopt(&self, reading: &Reading) -> Result<View, (Error, bool)> {
        let answers: Vec<&StoredView> = reading.views.iter().collect();
        match pick(&answers).map_err(|e| (Error::Internal(format!("view register: {e}")), false))? {
            None => Ok(View::empty()),
            // Already on a majority (`pick` refused the reading if two of these differed): the
            // write-back's compare-and-set would find it in place on each of them.
            Some(view) if self.held_by_majority(reading, view.version) => Ok(view),
            Some(view) => {
                self.write_or_superseded(&view).await?;
                Ok(view)
            }
        }
    }

    /// Read and adopt, reading again (a few times) when the write-back lost a race with a
    /// newer view: a reader racing a sealing leader is not a failure. `observe` sees every
    /// reading taken (a member's watch feeds on the beats that ride along).
    pub(crate) async fn read_adopted(
        &self,
        extras: &Extras,
        mut observe: impl FnMut(&Reading),
    ) -> Result<(View, Reading), Error> {
        const ATTEMPTS: usize = 4;
        let mut attempt = 1;
        loop {
            let reading = self.read(extras).await?;
            observe(&reading);
            match self.try_adopt(&reading).await {
                Ok(view) => return Ok((view, reading)),
                Err((e, true)) if attempt < ATTEMPTS => {
                    tracing::debug!(error = %e, attempt, "view write-back superseded; reading again");
                    attempt += 1;
                }
                Err((e, _)) => return Err(e),
            }
        }
    }

    /// Seal `view` (derived by this sealer from the view it read): its sequence number is
    /// raised above every one tried before in this term, then it is written. Returns the view
    /// as sealed.
    pub(crate) async fn seal(&self, view: View) -> Result<View, Error> {
        let view = if self.forkable {
            view
        } else {
            let mut attempted = self.attempted.lock().unwrap_or_else(|p| p.into_inner());
            let view = view.above_attempts(*attempted);
            if attempted.is_none_or(|a| a < view.version) {
                *attempted = Some(view.version);
            }
            view
        };
        self.write(&view).await?;
        Ok(view)
    }

    /// Write `view` to every voting node (the compare-and-set on its base); Ok when a majority
    /// holds it.
    pub(crate) async fn write(&self, view: &View) -> Result<(), Error> {
        self.write_or_superseded(view).await.map_err(|(e, _)| e)
    }

    /// As [`ViewRegister::write`]; a failure says whether some node holds a newer view.
    async fn write_or_superseded(&self, view: &View) -> Result<(), (Error, bool)> {
        let token = view.version.token().ok_or_else(|| {
            (
                Error::Internal(format!("view version {:?} out of range", view.version)),
                false,
            )
        })?;
        let base: Arc<str> = if self.forkable {
            "-".into()
        } else {
            view.base
                .token()
                .map(|t| t.get().to_string())
                .unwrap_or_else(|| "0".into())
                .into()
        };
        let json = serde_json::to_string(view).map_err(|e| {
            (
                Error::Internal(format!("view cannot be encoded: {e}")),
                false,
            )
        })?;
        let hash = View::digest(&json);
        let step = write_step(&self.key, token.get(), json, hash, &base);
        let tally = self
            .client
            .send(Request::vote("group.view.write"), step)
            .await;
        if tally.reached() {
            Ok(())
        } else {
            let superseded = tally
                .replies()
                .any(|(_, (status, current))| *status == 0 && *current > token.get());
            Err((
                NoQuorum::from_tally(
                    "group.view.write",
                    &tally,
                    &self.client.node_urls(),
                    |(status, current)| match status {
                        -2 => format!("holds another view at this version (token {current})"),
                        -1 => "marker check failed".into(),
                        _ => format!("holds a newer or sibling view (token {current})"),
                    },
                )
                .into(),
                superseded,
            ))
        }
    }
}

/// `view_write.lua`: the compare-and-set of a view on its base, marker-guarded.
fn write_step(key: &str, token: u64, json: String, hash: String, base: &str) -> Step<(i64, u64)> {
    script_call(&VIEW_WRITE, Guard::Marker)
        .key(key)
        .marker_key()
        .arg(token)
        .arg(json)
        .arg(hash)
        .arg(base)
        .marker()
        .decode(|_, v| client_decode::status_pair(v))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_view_write_is_a_marker_guarded_compare_and_set() {
        let step = super::write_step("rq:view:g", 77, "{}".into(), "h".into(), "70");
        assert!(step.is_guarded());
        assert_eq!(
            step.args_for_tests("r/c"),
            vec!["77", "{}", "h", "70", "r/c"]
        );
    }

    use super::*;
    use crate::membership::assign::ViewState;
    use std::collections::BTreeSet;

    fn view(term: u64, seq: u64, members: &[&str]) -> View {
        let set: BTreeSet<String> = members.iter().map(|m| m.to_string()).collect();
        let mut v = View::empty().next(&set, term).activated(term);
        v.version = ViewVersion { term, seq };
        v
    }

    fn stored(v: &View) -> StoredView {
        let json = serde_json::to_string(v).expect("encodes");
        decode(
            v.version.token().map(|t| t.get().to_string()),
            Some(json.clone()),
            Some(View::digest(&json)),
        )
    }

    #[test]
    fn the_highest_version_wins_and_an_empty_register_is_no_view() {
        let a = stored(&view(1, 2, &["a"]));
        let b = stored(&view(1, 3, &["a", "b"]));
        let none: StoredView = (0, None);
        assert_eq!(pick(&[&a, &b, &none]), Ok(Some(view(1, 3, &["a", "b"]))));
        assert_eq!(pick(&[&none, &none]), Ok(None));
        assert_eq!(pick(&[&b, &b]), Ok(Some(view(1, 3, &["a", "b"]))));
    }

    #[test]
    fn two_views_at_one_version_or_a_corrupted_register_are_refused() {
        let x = stored(&view(1, 3, &["a", "b", "c"]));
        let y = stored(&view(1, 3, &["a", "b", "d"]));
        assert!(
            pick(&[&x, &y]).is_err(),
            "a fork must never be resolved by node order"
        );
        for bad in [
            decode(Some("nan".into()), None, None),
            decode(Some("12".into()), None, None),
            decode(Some("12".into()), Some("{".into()), None),
            decode(
                Some("7".into()),
                Some(serde_json::to_string(&view(1, 3, &["a"])).expect("json")),
                None,
            ),
        ] {
            assert!(pick(&[&bad]).is_err(), "{bad:?} must be an error");
        }
        let json = serde_json::to_string(&view(1, 3, &["a"])).expect("json");
        let tampered = decode(
            Some(
                view(1, 3, &["a"])
                    .version
                    .token()
                    .expect("t")
                    .get()
                    .to_string(),
            ),
            Some(json),
            Some("0000000000000000".into()),
        );
        assert!(pick(&[&tampered]).is_err());
        assert_eq!(parse_int("12"), Some(12));
        for bad in ["", "-1", "1e3", "nan", " 1", "99999999999999999"] {
            assert_eq!(parse_int(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn an_acknowledgement_counts_for_the_view_whose_content_it_names() {
        use crate::membership::decide::acked_members;
        let acks: std::collections::HashMap<String, String> = [
            ("a", "7"),
            ("a#h", "7:aaaa"),
            ("b", "7"),
            ("b#h", "7:ffff"),
            ("c", "7"),
            ("d", "8"),
            ("d#h", "8:ffff"),
            ("e", "6"),
            ("f", "nan"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let got = acked_members(&acks, 7, "aaaa");
        let want: std::collections::BTreeSet<String> =
            ["a", "c", "d"].iter().map(|s| s.to_string()).collect();
        assert_eq!(
            got, want,
            "b acknowledged other content at 7; e an older view; f is corrupted"
        );
    }

    #[test]
    fn a_sealer_never_reuses_a_version_it_tried() {
        let base = view(4, 7, &["a"]);
        let tried = base.next(&["a", "b"].iter().map(|s| s.to_string()).collect(), 4);
        assert_eq!(tried.version, ViewVersion { term: 4, seq: 8 });
        assert_eq!(tried.base, base.version);
        // The seal of `tried` reached one node; the sealer reads `base` again and derives anew.
        let again = base
            .next(&["a", "c"].iter().map(|s| s.to_string()).collect(), 4)
            .above_attempts(Some(tried.version));
        assert_eq!(again.version, ViewVersion { term: 4, seq: 9 });
        assert_eq!(again.base, base.version, "still derived from what it read");
        assert_eq!(again.state, ViewState::Prepare);
        // Another term's attempts do not matter.
        let next_term = base
            .next(&["a"].iter().map(|s| s.to_string()).collect(), 5)
            .above_attempts(Some(tried.version));
        assert_eq!(next_term.version, ViewVersion { term: 5, seq: 1 });
    }
}

#[cfg(feature = "test-util")]
pub use for_tests::{ReadingForTests, ViewRegisterForTests};

#[cfg(feature = "test-util")]
mod for_tests {
    use super::*;

    /// TEST ONLY: the view register of a group, driven directly (read, adopt, seal), so a test
    /// can place partial seals and concurrent readers exactly. Never use it in production.
    #[derive(Clone)]
    pub struct ViewRegisterForTests(ViewRegister);

    /// TEST ONLY: one majority read of a view register.
    pub struct ReadingForTests(Reading);

    impl std::fmt::Debug for ViewRegisterForTests {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("ViewRegisterForTests")
                .field("key", &self.0.key)
                .field("forkable", &self.0.forkable)
                .finish()
        }
    }

    impl std::fmt::Debug for ReadingForTests {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("ReadingForTests")
                .field("views", &self.0.views)
                .finish()
        }
    }

    impl ViewRegisterForTests {
        /// The register of `group`; `forkable` selects the unsafe register.
        pub fn new(client: &Client, group: &str, forkable: bool) -> Result<Self, Error> {
            let group = crate::keys::Name::new("group", group)?;
            Ok(ViewRegisterForTests(ViewRegister::new(
                client,
                group.key(crate::keys::KeyKind::View).into(),
                group.key(crate::keys::KeyKind::Members).into(),
                forkable,
            )))
        }

        /// Read from a majority (no write-back yet).
        ///
        /// # Errors
        /// [`Error::NoQuorum`] without a majority.
        ///
        /// # Cancel safety
        /// As the register's own step: a dropped write may have reached some nodes.
        pub async fn read(&self) -> Result<ReadingForTests, Error> {
            let extras = Extras {
                beats: true,
                ..Extras::default()
            };
            self.0.read(&extras).await.map(ReadingForTests)
        }

        /// Choose the view the reading names, write it back to a majority (unless a majority
        /// answered with it), adopt it.
        ///
        /// # Errors
        /// [`Error::NoQuorum`] without a majority.
        ///
        /// # Cancel safety
        /// As the register's own step: a dropped write may have reached some nodes.
        pub async fn adopt(&self, reading: &ReadingForTests) -> Result<View, Error> {
            self.0.adopt(&reading.0).await
        }

        /// Seal a view derived from one this register read (as a leader does).
        ///
        /// # Errors
        /// [`Error::NoQuorum`] without a majority.
        ///
        /// # Cancel safety
        /// As the register's own step: a dropped write may have reached some nodes.
        pub async fn seal(&self, view: View) -> Result<View, Error> {
            self.0.seal(view).await
        }
    }
}
