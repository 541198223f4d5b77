//! A node's marker: the cluster and incarnation it is verified for, its seals by a change of
//! the node list, and what it says about the node's standing in the adopted cluster. Pure.

use super::Adoption;

/// What a change of the node list appends to an old node's marker, followed by the id of the
/// cluster that replaces it (`<run_id>/<old id>#sealed:<new id>`): the node then votes for no
/// client of the old cluster, and no second change can seal it for another successor (see
/// [`crate::Client::change_cluster`]).
pub(crate) const SEALED: &str = "#sealed:";

/// What a completed change appends to the markers of the old nodes it sealed
/// (`<run_id>/<old id>#sealed:<new id>#done`): a later run of the same change finds it done
/// and never copies the old cluster's frozen state again (onto nodes of the successor that
/// were wiped for reuse since, say). A stamped node is a source of no copy.
pub(crate) const CHANGE_DONE: &str = "#done";

/// The marker value of a node verified for cluster `cluster` by the repair (or set-up) `epoch`:
/// `<run_id>.<epoch>/<cluster id>` (`<run_id>/<cluster id>` without an epoch, as an older
/// release wrote it). The epoch is new with every repair, so the marker names the node's
/// incarnation: a node that lost its data without restarting (FLUSHALL keeps the run_id) and
/// was repaired shows another marker, which restarts every watch of it (a watch is tied to the
/// marker its replies came with) and refuses every request that expected the old one.
pub(crate) fn marker_value(run_id: &str, epoch: Option<&str>, cluster: &str) -> String {
    match epoch {
        Some(e) => format!("{run_id}.{e}/{cluster}"),
        None => format!("{run_id}/{cluster}"),
    }
}

/// A marker's parts: the run_id it was written for (without its epoch) and the cluster id
/// (None in a marker written by an older release, which named the run_id only).
pub(crate) fn parse_marker(marker: &str) -> (&str, Option<&str>) {
    let (run, cluster) = match marker.split_once('/') {
        Some((run, cluster)) => (run, Some(cluster)),
        None => (marker, None),
    };
    (run.split_once('.').map_or(run, |(r, _)| r), cluster)
}

/// The successor a sealed marker names (`…#sealed:<new id>[#done]`), if it is sealed.
pub(crate) fn sealed_for(marker: &str) -> Option<&str> {
    let (_, rest) = marker.split_once(SEALED)?;
    Some(rest.strip_suffix(CHANGE_DONE).unwrap_or(rest))
}

/// What a node's marker says about its standing in the adopted cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Verified for this incarnation in the adopted cluster: it may vote.
    Member,
    /// Must be repaired before it votes (the reason says why); `needs_listing` when the
    /// repair enlists it anew, which the descriptor must allow (its URL is listed).
    Quarantined {
        /// Why.
        reason: String,
        /// Whether the node's URL must be one the descriptor lists.
        needs_listing: bool,
    },
    /// Marked for an unrelated cluster: never repaired into this one.
    Stranger(String),
}

/// A node's standing from its marker, its run_id and the adopted cluster.
pub(crate) fn standing(marker: Option<&str>, run_id: Option<&str>, adopted: &Adoption) -> Standing {
    let q = |reason: String, needs_listing: bool| Standing::Quarantined {
        reason,
        needs_listing,
    };
    let Some(marker) = marker else {
        return q(
            "no marker: a new node, or one that lost its data".into(),
            true,
        );
    };
    let (run, cluster) = parse_marker(marker);
    if let (Some(c), Adoption::Adopted(d)) = (cluster, adopted) {
        if let Some((sealed, successor)) = c.split_once(SEALED) {
            return if successor == d.id || d.prev.as_deref() == Some(sealed) {
                q(
                    format!("sealed when cluster {sealed} was replaced by cluster {successor}"),
                    true,
                )
            } else if sealed == d.id {
                Standing::Stranger(format!(
                    "cluster {sealed} was replaced by cluster {successor} (a change of its node \
                     list): use the new list"
                ))
            } else {
                Standing::Stranger(format!("sealed for cluster {sealed}, not {}", d.id))
            };
        }
    }
    let Some(cluster) = cluster else {
        return q(
            "marker from an older release (no cluster id): re-verified like a new node".into(),
            true,
        );
    };
    if let Adoption::Adopted(d) = adopted {
        if cluster != d.id {
            return if d.prev.as_deref() == Some(cluster) {
                q(
                    format!(
                        "marked for cluster {cluster}, which cluster {} replaced",
                        d.id
                    ),
                    true,
                )
            } else {
                Standing::Stranger(format!(
                    "marked for cluster {cluster}, not this client's cluster {}",
                    d.id
                ))
            };
        }
    }
    match run_id {
        None => q("no run_id reported".into(), false),
        Some(r) if r != run => q(
            format!(
                "restarted since it was last verified (marker {}, run_id {})",
                short(run),
                short(r)
            ),
            false,
        ),
        Some(_) if adopted.id().is_none() => {
            q("its cluster is not known to this client yet".into(), false)
        }
        Some(_) => Standing::Member,
    }
}

fn short(s: &str) -> &str {
    s.get(..8).unwrap_or(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Descriptor;

    fn names(xs: &[&str]) -> Vec<String> {
        xs.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn standing_follows_marker_run_id_and_cluster() {
        let d = Descriptor::new_cluster(&names(&["a", "b", "c"]));
        let adopted = Adoption::Adopted(d.clone());
        let m = marker_value("run1", None, &d.id);
        assert_eq!(standing(Some(&m), Some("run1"), &adopted), Standing::Member);
        assert!(matches!(
            standing(Some(&m), Some("run2"), &adopted),
            Standing::Quarantined {
                needs_listing: false,
                ..
            }
        ));
        assert!(matches!(
            standing(None, Some("run1"), &adopted),
            Standing::Quarantined {
                needs_listing: true,
                ..
            }
        ));
        assert!(matches!(
            standing(Some("run1"), Some("run1"), &adopted),
            Standing::Quarantined {
                needs_listing: true,
                ..
            }
        ));
        let stranger = marker_value("run1", None, "00000000000000ff");
        assert!(matches!(
            standing(Some(&stranger), Some("run1"), &adopted),
            Standing::Stranger(_)
        ));
        let next = d.succeeding(&names(&["a", "b", "c", "d", "e"]));
        assert!(matches!(
            standing(Some(&m), Some("run1"), &Adoption::Adopted(next)),
            Standing::Quarantined {
                needs_listing: true,
                ..
            }
        ));
        assert!(matches!(
            standing(Some(&m), Some("run1"), &Adoption::Unknown),
            Standing::Quarantined { .. }
        ));
    }
}
