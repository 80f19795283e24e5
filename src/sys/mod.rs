//! The process's share of the machine: where blocking calls run ([`blocking`]), file
//! descriptors ([`fds`]), delivery's runtime and how long its threads wait for a CPU
//! ([`delivery_runtime`]), the heap allocator ([`heap`]), freed heap given back when
//! delivery goes idle ([`trim`]), and files that hold a secret, read only when their owner
//! alone may ([`owner_only`]), and the scheduler's wake-up ([`wake`]).

pub mod blocking;
pub mod delivery_runtime;
pub mod fds;
pub mod heap;
pub mod owner_only;
pub mod trim;
pub mod wake;
