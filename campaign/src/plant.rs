//! Planted bugs: a test-only switch per protection, passed to every workload process, so the
//! campaign can show that its checkers catch what the protection prevents.

use std::fmt;
use std::str::FromStr;

use redquorum::Config;

/// A protection switched off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plant {
    /// A quorum of N/2 (two disjoint "majorities" of one node each at N = 3... rounded down,
    /// at least 1): clients cut off from different nodes both decide.
    QuorumHalf,
    /// No quarantine of a node that lost its data: a wiped node votes at once.
    NoQuarantine,
    /// Lease holders write to the resource without the fenced guard (a plain SET).
    FencingOff,
    /// Periodic jobs run under a plain lock: the completion record is neither read nor written.
    NoCompletionCheck,
    /// Leases expire on the nodes' wall clocks (Redis `PEXPIRE`) and a lost copy stays lost:
    /// the classic Redlock design.
    ServerClockLeases,
    /// Work-distribution and peer-indexing members activate new tables and views at once,
    /// without the hand-over barrier.
    BarrierOff,
    /// A lock contender takes over a held lease as soon as it sees it, without watching it
    /// unchanged for its TTL plus drift.
    TakeoverWithoutWait,
    /// Every quorum counts a lost reply (a timeout, a broken connection) as a node that
    /// applied the request.
    LostReplyAccepted,
    /// A holder's release counts a node where it deleted nothing (another holder's copy, or
    /// none) as one where it deleted its copy: a holder deposed while frozen is told, when it
    /// releases, that a majority still held its lease. The nodes hold what they should (no two
    /// holders, no stale write): only the fenced-mutex check (release only by the holder)
    /// sees it.
    ReleaseCountsForeignCopies,
}

impl Plant {
    /// Every planted bug, for the table test.
    pub const ALL: [Plant; 9] = [
        Plant::QuorumHalf,
        Plant::NoQuarantine,
        Plant::FencingOff,
        Plant::NoCompletionCheck,
        Plant::ServerClockLeases,
        Plant::BarrierOff,
        Plant::TakeoverWithoutWait,
        Plant::LostReplyAccepted,
        Plant::ReleaseCountsForeignCopies,
    ];

    /// The guarantees a campaign with this bug must report broken (any of them).
    pub fn breaks(&self) -> &'static [&'static str] {
        match self {
            Plant::QuorumHalf => &["ids"],
            Plant::LostReplyAccepted => &["ids", "leases", "fenced writes"],
            Plant::NoQuarantine => &["ids", "leases", "fenced writes"],
            Plant::TakeoverWithoutWait => &["leases", "fenced writes"],
            Plant::FencingOff => &["fenced writes"],
            Plant::NoCompletionCheck => &["periodic jobs"],
            Plant::ServerClockLeases => &["leases", "fenced writes"],
            Plant::BarrierOff => &["one owner per unit", "one owner per task"],
            Plant::ReleaseCountsForeignCopies => &["fenced mutex"],
        }
    }

    /// The client configuration with the protection switched off.
    pub fn apply(&self, config: Config, nodes: usize) -> Config {
        match self {
            Plant::QuorumHalf => config.with_unsafe_quorum_for_tests((nodes / 2).max(1)),
            Plant::NoQuarantine => config.with_amnesia_protection_disabled_for_tests(),
            Plant::ServerClockLeases => config.with_server_clock_leases_for_tests(),
            Plant::TakeoverWithoutWait => config.without_takeover_wait_for_tests(),
            Plant::LostReplyAccepted => config.with_lost_replies_counted_for_tests(),
            Plant::ReleaseCountsForeignCopies => {
                config.with_foreign_copies_counted_on_release_for_tests()
            }
            // Not client settings: the lease workload writes without the guard; the member
            // processes get `--no-barrier-for-tests`.
            Plant::FencingOff | Plant::BarrierOff | Plant::NoCompletionCheck => config,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Plant::QuorumHalf => "quorum-half",
            Plant::NoQuarantine => "no-quarantine",
            Plant::FencingOff => "fencing-off",
            Plant::NoCompletionCheck => "no-completion-check",
            Plant::ServerClockLeases => "server-clock-leases",
            Plant::BarrierOff => "barrier-off",
            Plant::TakeoverWithoutWait => "takeover-without-wait",
            Plant::LostReplyAccepted => "lost-reply-accepted",
            Plant::ReleaseCountsForeignCopies => "release-counts-foreign-copies",
        }
    }
}

impl fmt::Display for Plant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Plant {
    type Err = String;

    fn from_str(s: &str) -> Result<Plant, String> {
        Plant::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Plant::ALL.iter().map(Plant::name).collect();
                format!("unknown planted bug {s:?}: one of {}", names.join(", "))
            })
    }
}
