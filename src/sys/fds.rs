//! File descriptors: who may use how many. RocksDB opens its WAL, SST files and MANIFEST
//! as it goes; if delivery's sockets (an outage's backlog coming due over many hosts) or
//! ingress connections took every descriptor, the store could not open a file and every
//! accept would fail. So at start courier raises its soft limit to the hard one, keeps a
//! reserve for the store, and gives delivery and the listeners bounded shares of the rest.

/// Descriptors kept for the store (RocksDB's `max_open_files` of 256 for its tables, plus
/// its WAL, MANIFEST, LOG and LOCK), logs, epoll and everything that is not a connection.
/// Idle pooled connections have a share of their own below: the pool as a whole is bounded
/// by `delivery.max_idle_connections` ([`crate::outbound::conn_cap`]), lowered to fit that share.
pub const RESERVED: u64 = 256 + 64;

/// How many connections and attempts each user may hold at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdBudget {
    /// Attempts in flight (each holds at most one socket while it runs).
    pub attempts: u64,
    /// Idle pooled connections kept between attempts.
    pub idle: u64,
    /// Ingress connections served at once.
    pub ingress: u64,
    /// Admin (and ops) connections served at once, each listener.
    pub admin: u64,
}

/// The shares of a process allowed `limit` descriptors, of what is left after the reserve:
/// three eighths for attempts, an eighth for idle pooled connections, a quarter for ingress,
/// an eighth for each of admin and ops.
pub fn budget(limit: u64) -> FdBudget {
    let usable = limit.saturating_sub(RESERVED);
    FdBudget {
        attempts: (usable * 3 / 8).max(1),
        idle: (usable / 8).max(1),
        ingress: (usable / 4).max(1),
        admin: (usable / 8).max(1),
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; returns the soft limit in force after.
pub fn raise_limit() -> Option<u64> {
    // SAFETY: getrlimit/setrlimit only read and write the struct passed to them.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return None;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
        Some(lim.rlim_cur)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_leave_the_reserve_to_the_store() {
        let b = budget(1024);
        assert_eq!(
            b,
            FdBudget {
                attempts: 264,
                idle: 88,
                ingress: 176,
                admin: 88
            }
        );
        assert!(b.attempts + b.idle + b.ingress + 2 * b.admin + RESERVED <= 1024);
        let big = budget(1 << 20);
        assert!(
            big.attempts > 1024 && big.idle > 1024 && big.ingress > 4096,
            "defaults fit a large limit: {big:?}"
        );
        assert_eq!(
            budget(10),
            FdBudget {
                attempts: 1,
                idle: 1,
                ingress: 1,
                admin: 1
            }
        );
    }

    fn limits() -> libc::rlimit {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit only writes the struct passed to it.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        lim
    }

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        // Lowered first (by one: the other tests in this process do not notice), so there is
        // something to raise whatever limits the test runs under.
        let before = limits();
        assert!(before.rlim_max > 64, "hard limit {}", before.rlim_max);
        let lowered = libc::rlimit {
            rlim_cur: before.rlim_max - 1,
            rlim_max: before.rlim_max,
        };
        // SAFETY: setrlimit only reads the struct passed to it.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lowered) }, 0);
        assert_eq!(limits().rlim_cur, before.rlim_max - 1);
        let soft = raise_limit().expect("getrlimit works");
        assert_eq!(soft, before.rlim_max, "raised to the hard limit");
        assert_eq!(limits().rlim_cur, before.rlim_max, "in force, not only reported");
        assert_eq!(raise_limit(), Some(soft), "idempotent");
    }
}
