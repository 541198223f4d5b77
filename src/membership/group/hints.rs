//! View-change hints: the leader publishes on the group's channel after every view it seals
//! (and a member after its first beat and after it left, so the leader, which reads every half
//! interval, seals at once), and members subscribe on every node, so a member reads a new view
//! at once instead of polling for it. A hint only wakes the loop early: nothing is decided from
//! it, and a member that misses one reads the view at its next beat anyway (at most an interval
//! later; a leader or a deputy at most half an interval later, see [`decide::member_tick`]).

use futures::StreamExt;

use crate::quorum::NodeOutcome;

use super::*;

/// The group's hint channel.
pub(super) fn channel(shared: &Shared) -> String {
    format!("{}:views", shared.members_key)
}

/// Tell the group's members that a view was sealed, or the leader that a member joined or
/// left (best effort: a hint).
pub(super) async fn publish(shared: &Shared) {
    let mut publish = redis::cmd("PUBLISH");
    publish.arg(channel(shared)).arg(1);
    let step = Step::unchecked(vec![publish], |_, _| Ok(NodeOutcome::Applied(())));
    let _ = shared.client.send(Request::vote("group.hint"), step).await;
}

/// Whether this member hears the leader's hints: subscribed on a majority of the nodes (the
/// leader's publish reaches at least a majority, and two majorities share a node). Until then
/// the loop reads the view at the fast tick.
pub(super) fn heard(shared: &Shared) -> bool {
    shared.hints_live.load(std::sync::atomic::Ordering::Acquire)
        >= shared.client.majority().needed()
}

/// Counts one live subscription while it exists.
struct Live<'a>(&'a Shared);

impl<'a> Live<'a> {
    fn new(shared: &'a Shared) -> Self {
        shared
            .hints_live
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Live(shared)
    }
}

impl Drop for Live<'_> {
    fn drop(&mut self) {
        self.0
            .hints_live
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Listen on every node until dropped, waking the member's loop on each hint; a subscription
/// that fails is tried again an interval later.
pub(super) fn watch(shared: &Arc<Shared>) -> Vec<AbortOnDrop> {
    shared
        .client
        .pubsub_clients()
        .into_iter()
        .map(|client| {
            let shared = shared.clone();
            AbortOnDrop(tokio::spawn(async move {
                let channel = channel(&shared);
                loop {
                    if let Ok(mut ps) = client.get_async_pubsub().await {
                        if ps.subscribe(&channel).await.is_ok() {
                            let _live = Live::new(&shared);
                            let mut messages = ps.on_message();
                            while messages.next().await.is_some() {
                                shared.hinted.notify_one();
                            }
                        }
                    }
                    tokio::time::sleep(shared.opts.interval).await;
                }
            }))
        })
        .collect()
}
