//! The `courier` binary: everything lives in the library; see `courier --help`.

/// The heap allocator, and why: see `courier::sys::heap`. In the binary only: the
/// benchmark's baseline, run inside `loadgen`, keeps the system's.
#[global_allocator]
static HEAP: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Runs as the process starts, before Rust's runtime allocates: mimalloc reads the
/// setting at its first allocation, and `main` comes too late.
#[used]
#[link_section = ".init_array"]
static CONFIGURE_HEAP: extern "C" fn() = configure_heap;

extern "C" fn configure_heap() {
    courier::sys::heap::configure();
}

fn main() -> std::process::ExitCode {
    courier::cli::main()
}
