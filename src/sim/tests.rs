//! The simulator's entry points: a few hundred seeds in CI, a soak or one seed on demand.

use std::time::Duration;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

#[test]
fn seeds() {
    if let Some(seed) = env_u64("COURIER_SIM_SEED") {
        match super::run_twice(seed) {
            Ok(trace) => {
                for line in &trace {
                    println!("  {line}");
                }
                println!("seed {seed}: {} steps, every invariant held", trace.len());
            }
            Err(f) => panic!("{f}"),
        }
        return;
    }
    // CI's seeds run twice each (their traces must hash the same); a soak once, unless
    // `COURIER_SIM_TWICE=1`.
    let twice = env_u64("COURIER_SIM_SEEDS").is_none() || env_u64("COURIER_SIM_TWICE") == Some(1);
    let seeds = env_u64("COURIER_SIM_SEEDS").unwrap_or(super::CI_SEEDS);
    let first = env_u64("COURIER_SIM_FIRST").unwrap_or(1);
    let budget = Duration::from_secs(env_u64("COURIER_SIM_BUDGET").unwrap_or(3600 * 24));
    let started = std::time::Instant::now();
    if env_u64("COURIER_SIM_SEEDS").is_none() {
        for &seed in super::CI_KEPT {
            if let Err(f) = super::soak(seed, 1, budget, true) {
                panic!("{f}");
            }
        }
    }
    match super::soak(first, seeds, budget, twice) {
        Ok(ran) => println!(
            "{ran} seeds from {first} in {:.1}s{}, every invariant held",
            started.elapsed().as_secs_f64(),
            if twice {
                ", each run twice with equal traces"
            } else {
                ""
            }
        ),
        Err(f) => panic!("{f}"),
    }
}
