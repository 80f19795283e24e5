//! Where a blocking call runs: on the runtime's blocking threads, so no async worker waits
//! on the store. Under the simulator (tests) a thread may ask for them inline instead
//! ([`inline`]): the simulator's runtime then does nothing else while one runs, and a seed
//! replays exactly.

/// Runs `f` on the current runtime's blocking threads and waits for it; `Err` with the
/// panic's text if it panicked.
pub async fn run<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    #[cfg(test)]
    if inline::on() {
        return inline::call(f);
    }
    tokio::task::spawn_blocking(f).await.map_err(|e| e.to_string())
}

/// Runs `f` on `runtime`'s blocking threads without waiting for it.
pub fn spawn_on(runtime: &tokio::runtime::Handle, f: impl FnOnce() + Send + 'static) {
    #[cfg(test)]
    if inline::on() {
        let _ = inline::call(f);
        return;
    }
    runtime.spawn_blocking(f);
}

/// Calls `f`; `Err` with the panic's text if it panicked: for a thread or task that must go
/// on after one job's panic (every later job would otherwise wait for ever).
pub fn catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "unknown panic".into())
    })
}

/// Tests: blocking calls made on this thread run inline (see the module doc).
#[cfg(test)]
pub(crate) mod inline {
    use std::cell::Cell;

    thread_local! {
        static INLINE: Cell<bool> = const { Cell::new(false) };
    }

    /// From now on, blocking calls made on this thread run on it.
    pub(crate) fn set(on: bool) {
        INLINE.with(|i| i.set(on));
    }

    pub(super) fn on() -> bool {
        INLINE.with(Cell::get)
    }

    /// Calls `f`, catching its panic as a blocking thread's join would.
    pub(super) fn call<T>(f: impl FnOnce() -> T) -> Result<T, String> {
        super::catch(f)
    }
}
