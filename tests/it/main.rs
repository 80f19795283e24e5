//! Black-box tests: the real `courier` binary on ephemeral ports, real local receivers.
//! One test binary (modules below) so the suite links once.

mod support;

mod delivery;
mod ingress;
mod lifecycle;
