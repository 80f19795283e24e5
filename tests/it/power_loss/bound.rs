//! How many deliveries the power cuts may make courier repeat, and the check that each
//! repeat is one of them.
//!
//! A delivery is repeated only when its result did not survive the cut: courier then finds
//! the message open at the next start and sends it again. Results are not synced on their
//! own (`Store::finish_attempts` writes without fsync); one becomes durable when a later
//! synced write syncs the write-ahead log. Every accept batch is such a write, and RocksDB's
//! synced write syncs every live log file, so it covers every write that completed before
//! it began. So for the courier process a cut ended, with W the latest moment at which a
//! request that courier answered 202 was sent (the batch's sync began after courier read
//! that request, so after W; it succeeded before the cut, since after the cut every
//! operation fails until the process is dead):
//!
//! - a delivery that reached the receiver after W may be repeated: its result may have
//!   been written after that sync began, or not at all (in flight at the cut);
//! - a delivery that reached the receiver before W is repeated only if its result was still
//!   not written when that sync began. An attempt holds its `delivery.max_in_flight` permit
//!   from before it is sent until its result is written (`delivery::admit`), so at that
//!   moment at most `max_in_flight` such attempts existed.
//!
//! With no 202 from that process, W is its start, and every delivery it made counts in the
//! first kind. A delivery by the last process (no cut after it) is never repeated.
//!
//! The check: every delivery of an acknowledged message but its last is attributed to the
//! process during which it reached the receiver; that process must have been cut, and at
//! most `max_in_flight` of those deliveries per cut may precede its W. The sum over the
//! cuts of `min(max_in_flight, deliveries before W) + deliveries after W` bounds the
//! duplicates. The time a process ends is taken after its store check, well after it was
//! killed, so a request it wrote just before the kill is seen by the receiver by then.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use crate::support::load::Acked;

/// One courier process that a cut ended: when it was started, and when the next one was
/// (after the cut, the kill and the store check).
#[derive(Debug, Clone, Copy)]
pub struct Lived {
    /// Just before it was started.
    pub started: Instant,
    /// Just before the next process was started.
    pub ended: Instant,
}

/// What the duplicates came to against the bound.
#[derive(Debug)]
pub struct Repeats {
    /// Deliveries of acknowledged messages beyond the first.
    pub duplicates: usize,
    /// The most the cuts can explain.
    pub bound: usize,
    /// Per cut: repeated deliveries that reached the receiver before W, and after it.
    pub per_cut: Vec<(usize, usize)>,
}

impl Repeats {
    /// `; cut <n>: <before W> + <after W>` for each cut that repeated deliveries.
    pub fn by_cut(&self) -> String {
        let cuts = self.per_cut.iter().enumerate().filter(|(_, (b, a))| b + a > 0);
        cuts.map(|(n, (before, after))| format!("; cut {}: {before} + {after}", n + 1))
            .collect()
    }
}

/// Checks every duplicate against the cuts. `stamps`: per 202, when its request was sent
/// and when the 202 came; `arrivals`: per 2xx answer of the receiver, when the request
/// arrived and its event id; `cap`: courier's `delivery.max_in_flight`.
pub fn check(
    lives: &[Lived],
    stamps: &[(Instant, Instant)],
    arrivals: &[(Instant, String)],
    acked: &[Acked],
    cap: usize,
) -> Result<Repeats, String> {
    // W for each process: the latest send of a request answered 202 before it ended, if it
    // was sent to this process at all (after it started).
    let witness: Vec<Instant> = lives
        .iter()
        .map(|life| {
            let sent = stamps
                .iter()
                .filter(|(_, ack)| *ack < life.ended)
                .map(|(sent, _)| *sent);
            sent.max().map_or(life.started, |w| w.max(life.started))
        })
        .collect();
    let between = |from: Instant, to: Instant| arrivals.iter().filter(|(at, _)| *at > from && *at <= to).count();
    let bound = lives
        .iter()
        .zip(&witness)
        .map(|(life, w)| between(life.started, *w).min(cap) + between(*w, life.ended))
        .sum();

    let acked: HashSet<&str> = acked.iter().map(|(id, _)| id.as_str()).collect();
    let mut per_event: HashMap<&str, Vec<Instant>> = HashMap::new();
    for (at, id) in arrivals.iter().filter(|(_, id)| acked.contains(id.as_str())) {
        per_event.entry(id).or_default().push(*at);
    }
    let mut per_cut = vec![(0, 0); lives.len()];
    let mut duplicates = 0;
    for (id, mut times) in per_event {
        times.sort();
        for at in &times[..times.len() - 1] {
            duplicates += 1;
            let Some(cut) = lives.iter().position(|l| l.started < *at && *at <= l.ended) else {
                return Err(format!(
                    "{id} was delivered {} times, once by a courier no cut ended (a repeat no power cut explains)",
                    times.len()
                ));
            };
            if *at <= witness[cut] {
                per_cut[cut].0 += 1;
            } else {
                per_cut[cut].1 += 1;
            }
        }
    }
    if let Some(cut) = per_cut.iter().position(|(before, _)| *before > cap) {
        return Err(format!(
            "cut {}: {} deliveries repeated that reached the receiver before the last durable accept's request was \
             sent; at most delivery.max_in_flight = {cap} results can have been unwritten then",
            cut + 1,
            per_cut[cut].0
        ));
    }
    Ok(Repeats {
        duplicates,
        bound,
        per_cut,
    })
}
