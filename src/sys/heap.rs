//! The heap allocator the `courier` binary runs on: mimalloc 2, its arenas committed as
//! they are used (`main.rs` installs it and calls [`configure`] before anything allocates).
//!
//! Why not glibc's malloc: a message's memory crosses threads (ingest allocates it, the
//! store writer and delivery free it), and glibc frees a block into the arena of the
//! thread that made it, under that arena's lock, once the freeing thread's small cache of
//! that size is full: about a third of courier's `futex` calls were those locks
//! (docs/benchmarks.md, issue 43, steps 8 and 9). mimalloc hands a block freed by another
//! thread back through a lock-free list. Measured against the same code on glibc: 1.00x
//! and 0.86x the CPU per delivered message in the closed loop (two A/B runs), the
//! held-uploads burst of the `ingress_limits` test at +62..+80 MiB over its baseline
//! against glibc's +79..+82, idle RSS 22.2-22.6 MiB against 20.6-20.8 (docs/benchmarks.md,
//! issue 43, step 9).
//!
//! Why the setting: mimalloc 2 commits each arena it reserves at once by default, which
//! put courier's idle RSS at 38.9 MiB; committed as used, 22.2 MiB. mimalloc reads an
//! option when it first needs it, which for this one is its first allocation: hence a
//! constructor, not `main`. (Returning freed memory at once as well, `purge_delay = 0`,
//! cost the CPU it saved: 1.04x.)

use libmimalloc_sys::{mi_collect, mi_option_set, mi_option_t};

/// `mi_option_arena_eager_commit` in the `mi_option_e` of mimalloc 2 (the version the
/// `v2` feature builds); the test below holds it to its documented default.
const ARENA_EAGER_COMMIT: mi_option_t = 4;

/// Applies courier's setting; the binary calls it before its first allocation.
pub fn configure() {
    // SAFETY: setting an option stores a number mimalloc reads when it next decides; it
    // may be called at any time from any thread.
    unsafe { mi_option_set(ARENA_EAGER_COMMIT, 0) };
}

/// Gives mimalloc's free memory back to the operating system (see `trim`).
pub fn collect() {
    // SAFETY: a forced collection frees only what no one holds; any thread, any time.
    unsafe { mi_collect(true) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use libmimalloc_sys::mi_option_get;

    /// The number names the option meant: before `configure` it reads its documented
    /// default (an upgrade that renumbers `mi_option_e` fails here), after it courier's.
    #[test]
    fn the_option_is_the_one_named_and_takes_courier_s_value() {
        // SAFETY: reading an option has no precondition.
        let read = || unsafe { mi_option_get(ARENA_EAGER_COMMIT) };
        assert_eq!(read(), 2, "mi_option_arena_eager_commit (=2)");
        configure();
        assert_eq!(read(), 0);
        collect();
    }
}
