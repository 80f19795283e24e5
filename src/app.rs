//! Wiring: the one place that builds every component, starts the tasks, and orders
//! shutdown.
//!
//! Start: open the store → bind the listeners (ingress, admin, and ops when set) → requeue messages a crash left in flight →
//! start scheduler, retention, ingress and admin → log `listening`.
//!
//! Stop (SIGTERM/SIGINT, or [`Running::shutdown`]): ingress answers 503 and `/readyz` 503
//! → a drain under way (`POST /drain`) stops → the scheduler stops claiming → running
//! attempts get `shutdown_grace` to finish, the rest are cut off and requeued without
//! counting an attempt → listeners close → the store's queued accepts are answered, the
//! WAL synced and memtables flushed. A drain (see `drain::control`) takes the first steps
//! earlier, with the scheduler's own stop, and forwards what is open before any of this.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rand::SeedableRng;
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use crate::admin::Admin;
use crate::clock::{SharedClock, SystemClock};
use crate::config::Config;
use crate::config::ListenAddr;
use crate::delivery::{Deliverer, DelivererParts};
use crate::drain::DrainControl;
use crate::fleet::{Fleet, FleetError, FleetParts};
use crate::inbound::ingress::Ingress;
use crate::inbound::serve::{self, Handler, Listener, ServeLimits};
use crate::inbound::uds::SocketFile;
use crate::metrics::Metrics;
use crate::ops::Probes;
use crate::outbound::client::{ClientSettings, HttpTransport};
use crate::outbound::egress::EgressPolicy;
use crate::outbound::proxy::ProxyRoute;
use crate::outbound::resolver::{Resolve, SystemResolver};
use crate::outbound::tls::{TlsHandle, TlsMaterial};
use crate::outbound::transport::Transport;
use crate::reload::{ConfigSource, Reloader};
use crate::scheduler::Scheduler;
use crate::store::{Store, StoreError, StoreOptions};
use crate::sys::priority::DeliveryRuntime;

/// After the drain, how long the listeners at least get to finish the answers in progress.
const HTTP_DRAIN_MIN: std::time::Duration = std::time::Duration::from_secs(1);

/// The listeners' limits after [`fit_to_fd_limit`].
struct ListenerLimits {
    ingress: ServeLimits,
    admin: ServeLimits,
}

/// Raises the descriptor limit and fits delivery's and the listeners' shares inside it,
/// keeping the store's reserve (see [`crate::sys::fds`]); says so when a setting is lowered.
fn fit_to_fd_limit(config: &mut Config) -> ListenerLimits {
    let mut ingress = ServeLimits {
        idle_timeout: config.ingress.idle_timeout,
        ..ServeLimits::default()
    };
    let mut admin = ServeLimits {
        idle_timeout: config.admin.idle_timeout,
        ..ServeLimits::default()
    };
    let Some(limit) = crate::sys::fds::raise_limit() else {
        return ListenerLimits { ingress, admin };
    };
    let budget = crate::sys::fds::budget(limit);
    lower_to_fit(
        limit,
        "delivery.max_in_flight",
        &mut config.delivery.max_in_flight,
        budget.attempts,
    );
    lower_to_fit(
        limit,
        "delivery.max_idle_connections",
        &mut config.delivery.max_idle_connections,
        budget.idle,
    );
    ingress.max_connections = ingress.max_connections.min(budget.ingress as usize);
    admin.max_connections = admin.max_connections.min(budget.admin as usize);
    ListenerLimits { ingress, admin }
}

/// Lowers `value` (the setting `key`) to `share` of the descriptor limit if it is above,
/// saying so.
fn lower_to_fit(limit: u64, key: &str, value: &mut u32, share: u64) {
    if u64::from(*value) > share {
        tracing::warn!(
            fd_limit = limit,
            configured = *value,
            effective = share,
            "{key} lowered to fit the file descriptor limit (raise LimitNOFILE / ulimit -n)"
        );
        *value = share as u32;
    }
}

/// Why courier could not start.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The store could not be opened.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// A listener could not be bound.
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        /// `ingress` or `admin`.
        what: &'static str,
        /// The address (`unix:/path` for a socket).
        addr: ListenAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Delivery's runtime could not be started.
    #[error("cannot start the delivery runtime: {0}")]
    Runtime(std::io::Error),
    /// The TLS material (a PEM file of `[tls]` or `[[host]]`) could not be built.
    #[error("{0}")]
    Tls(crate::config::ConfigError),
    /// `[fleet]` cannot make a Redis client (a bad URL, an unreadable password file).
    #[error("{0}")]
    Fleet(#[from] FleetError),
}

/// The replaceable parts: production uses the defaults; tests swap in a manual clock, a
/// scripted transport or a fixed resolver.
pub struct Seams {
    /// The clock.
    pub clock: SharedClock,
    /// The transport; `None` builds the real HTTP client.
    pub transport: Option<Arc<dyn Transport>>,
    /// DNS for the real HTTP client.
    pub resolver: Arc<dyn Resolve>,
    /// Seed for jitter; `None` seeds from the OS.
    pub rng_seed: Option<u64>,
    /// Where a reload reads the config again; `None`: reload is refused (in-process tests
    /// that do not test it).
    pub config_source: Option<ConfigSource>,
}

impl Default for Seams {
    fn default() -> Self {
        Seams {
            clock: Arc::new(SystemClock),
            transport: None,
            resolver: Arc::new(SystemResolver),
            rng_seed: None,
            config_source: None,
        }
    }
}

/// A started courier.
pub struct Running {
    /// Where ingress listens (the bound port when `listen` asked for port 0).
    pub ingress_addr: ListenAddr,
    /// Where admin listens.
    pub admin_addr: SocketAddr,
    /// Where the read-only ops listener listens, when `ops_listen` is set.
    pub ops_addr: Option<SocketAddr>,
    /// The delivery context (for in-process tests).
    pub deliverer: Arc<Deliverer>,
    /// Applies a reloaded config (SIGHUP, `POST /reload`).
    pub reloader: Arc<Reloader>,
    trigger: Arc<Notify>,
    done: JoinHandle<()>,
}

impl Running {
    /// Starts the shutdown sequence (idempotent).
    pub fn shutdown(&self) {
        self.trigger.notify_one();
    }

    /// Waits until shutdown has completed.
    pub async fn wait(self) {
        let _ = self.done.await;
    }
}

async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, AppError> {
    TcpListener::bind(addr).await.map_err(|source| AppError::Bind {
        what,
        addr: addr.into(),
        source,
    })
}

/// Binds ingress: TCP, or the socket file with its mode (kept to remove at shutdown).
async fn bind_ingress(config: &Config) -> Result<(Listener, ListenAddr, Option<SocketFile>), AppError> {
    let err = |source| AppError::Bind {
        what: "ingress",
        addr: config.listen.clone(),
        source,
    };
    match &config.listen {
        ListenAddr::Tcp(addr) => {
            let l = bind("ingress", *addr).await?;
            let bound = l.local_addr().map_err(err)?;
            Ok((Listener::Tcp(l), ListenAddr::Tcp(bound), None))
        }
        ListenAddr::Unix(path) => {
            let (l, file) = SocketFile::bind(path, config.listen_mode).map_err(err)?;
            Ok((Listener::Unix(l), config.listen.clone(), Some(file)))
        }
    }
}

/// Starts courier: returns once both listeners are bound and the store is open.
pub async fn start(mut config: Config, seams: Seams) -> Result<Running, AppError> {
    let loaded = config.clone();
    let limits = fit_to_fd_limit(&mut config);
    let config = Arc::new(config);
    let store = Arc::new(Store::open(
        &config.data_dir,
        StoreOptions {
            retention_ms: config.retention.as_millis() as u64,
            dead_retention_ms: config.dead_retention.as_millis() as u64,
            ..StoreOptions::default()
        },
    )?);
    let (ingress_listener, ingress_addr, socket_file) = bind_ingress(&config).await?;
    let admin_listener = bind("admin", config.admin_listen).await?;
    let admin_addr = admin_listener.local_addr().map_err(|source| AppError::Bind {
        what: "admin",
        addr: config.admin_listen.into(),
        source,
    })?;
    let ops_listener = match config.ops_listen {
        Some(addr) => Some(bind("ops", addr).await?),
        None => None,
    };
    let ops_addr = match (&ops_listener, config.ops_listen) {
        (Some(l), Some(addr)) => Some(l.local_addr().map_err(|source| AppError::Bind {
            what: "ops",
            addr: addr.into(),
            source,
        })?),
        _ => None,
    };
    // Validation refused this unless the operator said so on purpose: say it once, loudly.
    for (key, addr) in config.unauthenticated_network_listeners() {
        tracing::warn!(
            listener = key,
            addr = %addr,
            "serving the network without a token (allow_unauthenticated_network = true): anyone who can reach it can use it"
        );
    }

    let clock = seams.clock;

    // Built before the transport whether or not it is used, so a bad PEM file stops the
    // start in tests with a scripted transport too; a reload replaces its material.
    let tls = TlsHandle::new(TlsMaterial::from_config(&config).map_err(AppError::Tls)?);
    let transport: Arc<dyn Transport> = match seams.transport {
        Some(t) => t,
        None => Arc::new(HttpTransport::new(
            ClientSettings {
                connect_timeout: config.delivery.connect_timeout,
                max_response_body: config.delivery.max_response_body as usize,
                pool_max_idle_per_host: config.delivery.max_in_flight_per_host as usize,
                idle_timeout: config.delivery.idle_connection_timeout,
                max_idle_connections: config.delivery.max_idle_connections as usize,
            },
            EgressPolicy::new(config.egress.allow_private_targets, config.egress.allow.clone()),
            seams.resolver,
            tls.clone(),
            config
                .egress
                .proxy
                .as_ref()
                .map(|proxy| ProxyRoute::new(proxy, &config.egress.no_proxy)),
        )),
    };
    let rng = match seams.rng_seed {
        Some(seed) => rand::rngs::StdRng::seed_from_u64(seed),
        None => rand::rngs::StdRng::from_os_rng(),
    };
    let metrics = Arc::new(Metrics::default());
    let wake = Arc::new(Notify::new());
    let delivery_rt = DeliveryRuntime::start().map_err(AppError::Runtime)?;
    // Connects in the background: until Redis answers, the fallback limits apply.
    let fleet = Fleet::start(
        &config.fleet,
        FleetParts {
            runtime: delivery_rt.handle(),
            wake: wake.clone(),
            ca_pem: crate::outbound::tls::ca_bundle(&config.tls.ca_file).map_err(AppError::Tls)?,
        },
    )?;
    let deliverer = Deliverer::new(DelivererParts {
        store: store.clone(),
        transport,
        clock: clock.clone(),
        config: config.clone(),
        metrics: metrics.clone(),
        wake: wake.clone(),
        rng,
        runtime: delivery_rt.handle(),
        fleet,
    })?;

    // A crash leaves messages in flight, and (in the middle of a resume) parked for an
    // endpoint that is active. The simulator runs this same recovery.
    let (recovered, unparked, blocked) = deliverer.recover_at_start()?;
    for endpoint in blocked {
        // The pause of a line blocked just before the last stop: said now, and alerted.
        tracing::warn!(endpoint = %crate::redact::url_for_log(&endpoint),
            "endpoint paused: its ordered line is blocked behind a dead message; resume it with `courier endpoints resume`");
        let (d, now) = (deliverer.clone(), clock.now_ms());
        delivery_rt.handle().spawn(async move {
            let rec = d.endpoints.get(&endpoint).map(|v| v.rec).unwrap_or_default();
            crate::delivery::alert::endpoint_paused(&d, &endpoint, &rec, now).await;
        });
    }
    if recovered > 0 {
        tracing::warn!(
            count = recovered,
            "requeued messages that were in flight when courier last stopped"
        );
    }
    if unparked > 0 {
        tracing::warn!(
            count = unparked,
            "requeued messages left parked for endpoints that are not paused"
        );
    }

    let draining = Arc::new(AtomicBool::new(false));
    let accepts = Arc::new(crate::inbound::ingress::AcceptsInProgress::default());
    // Stops retention, and the scheduler at shutdown.
    let (stop_sched, sched_rx) = watch::channel(false);
    // The scheduler's own stop, which a drain (`POST /drain`) sends before any shutdown,
    // and the word that it has returned.
    let stop_scheduler = Arc::new(watch::channel(false).0);
    let (scheduler_done, scheduler_stopped) = watch::channel(false);
    let (stop_http, http_rx) = watch::channel(false);
    let drain = Arc::new(DrainControl::new(
        deliverer.clone(),
        draining.clone(),
        accepts.clone(),
        stop_scheduler.clone(),
        scheduler_stopped,
    ));

    let ingress = Arc::new(Ingress::new(
        deliverer.clone(),
        clock.clone(),
        metrics,
        draining.clone(),
        accepts,
    ));
    let probes = Arc::new(Probes::new(deliverer.clone(), draining.clone()));
    let reloader = Arc::new(Reloader::new(seams.config_source, deliverer.clone(), loaded));
    let admin = Arc::new(Admin::new(
        deliverer.clone(),
        probes.clone(),
        reloader.clone(),
        drain.clone(),
    ));
    let ingress_handler: Handler = Arc::new(move |peer, req| Box::pin(ingress.clone().handle(peer, req)));
    let admin_handler: Handler = Arc::new(move |peer, req| Box::pin(admin.clone().handle(peer, req)));
    let ops_task = ops_listener.map(|listener| {
        let handler: Handler = Arc::new(move |peer, req| Box::pin(probes.clone().handle(peer, req)));
        tokio::spawn(serve::serve(listener, handler, limits.admin.clone(), http_rx.clone()))
    });
    let ingress_task = tokio::spawn(serve::serve(
        ingress_listener,
        ingress_handler,
        limits.ingress.clone(),
        http_rx.clone(),
    ));
    let admin_task = tokio::spawn(serve::serve(
        admin_listener,
        admin_handler,
        limits.admin.clone(),
        http_rx,
    ));
    let scheduler = Scheduler::new(deliverer.clone()).run(stop_scheduler.subscribe());
    let scheduler_task = delivery_rt.handle().spawn(async move {
        scheduler.await;
        let _ = scheduler_done.send(true);
    });
    let d = deliverer.clone();
    let forget_endpoints: crate::retention::AfterSweep = Arc::new(move || {
        match d.expire_endpoints() {
        Ok((forgotten, deleted)) if forgotten + deleted > 0 => tracing::info!(
            forgotten,
            deleted,
            "endpoints not seen within the retention window forgotten (in memory), and records not written within it deleted"
        ),
        Ok(_) => {}
        Err(e) => tracing::error!(error = %e, "forgetting idle endpoints failed; will try again"),
    }
    });
    let retention_task = tokio::spawn(crate::retention::run(
        store.clone(),
        clock.clone(),
        sched_rx,
        forget_endpoints,
    ));

    match ops_addr {
        Some(ops) => tracing::info!(ingress = %ingress_addr, admin = %admin_addr, ops = %ops,
            data_dir = %config.data_dir.display(), "listening"),
        None => tracing::info!(ingress = %ingress_addr, admin = %admin_addr,
            data_dir = %config.data_dir.display(), "listening"),
    }

    let trigger = Arc::new(Notify::new());
    let t = trigger.clone();
    let d = deliverer.clone();
    let grace = config.shutdown_grace;
    let done = tokio::spawn(async move {
        t.notified().await;
        tracing::info!(
            grace_ms = grace.as_millis() as u64,
            in_flight = d.in_flight_count(),
            "shutting down: draining"
        );
        // The whole stop is bounded by shutdown_grace (plus the store's close): a stalled
        // upload, a long retention sweep or a slow receiver cannot keep courier running.
        let deadline = tokio::time::Instant::now() + grace;
        draining.store(true, Ordering::SeqCst);
        // A drain under way stops here: what it has not handed off stays pending.
        drain.abort();
        let _ = stop_sched.send(true);
        let _ = stop_scheduler.send(true);
        let _ = scheduler_task.await;
        // A sweep stops at its next batch; one family's compaction cannot be cut short, so
        // the wait for it is bounded by the grace too (RocksDB finishes or drops it at close).
        let _ = tokio::time::timeout_at(deadline, retention_task).await;
        let cut = d
            .drain(deadline.saturating_duration_since(tokio::time::Instant::now()))
            .await;
        if cut > 0 {
            tracing::warn!(
                count = cut,
                "attempts still running at the end of shutdown_grace were cut off; they are retried after restart"
            );
        }
        let _ = stop_http.send(true);
        // The listeners let open requests finish until the deadline (at least a moment,
        // so answers already being written get out), then close what is left.
        let http_deadline = deadline.max(tokio::time::Instant::now() + HTTP_DRAIN_MIN);
        for task in [Some(ingress_task), Some(admin_task), ops_task].into_iter().flatten() {
            let abort = task.abort_handle();
            if tokio::time::timeout_at(http_deadline, task).await.is_err() {
                abort.abort();
            }
        }
        if let Some(file) = socket_file {
            file.remove();
        }
        let s = store.clone();
        let _ = tokio::task::spawn_blocking(move || s.close()).await;
        drop(delivery_rt);
        tracing::info!("stopped");
    });
    Ok(Running {
        ingress_addr,
        admin_addr,
        ops_addr,
        deliverer,
        reloader,
        trigger,
        done,
    })
}

/// Runs courier until SIGTERM or SIGINT, then shuts down cleanly; SIGHUP reloads the
/// config from `source` (see [`crate::reload`]).
pub async fn run(config: Config, source: ConfigSource) -> Result<(), AppError> {
    use tokio::signal::unix::{signal, SignalKind};
    // Installed before anything listens: a SIGTERM sent as soon as /readyz answers (a
    // rollout, `systemctl restart`) must drain, not kill the process by default action;
    // a SIGHUP must reload, not kill it.
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing the SIGINT handler");
    let mut hup = signal(SignalKind::hangup()).expect("installing the SIGHUP handler");
    let seams = Seams {
        config_source: Some(source),
        ..Seams::default()
    };
    let running = start(config, seams).await?;
    loop {
        tokio::select! {
            _ = term.recv() => { tracing::info!(signal = "SIGTERM", "signal received"); break }
            _ = int.recv() => { tracing::info!(signal = "SIGINT", "signal received"); break }
            _ = hup.recv() => {
                tracing::info!(signal = "SIGHUP", "signal received: reloading the config");
                let reloader = running.reloader.clone();
                // It reads files: off the async workers. The outcome is logged by reload.
                let _ = tokio::task::spawn_blocking(move || reloader.reload()).await;
            }
        }
    }
    running.shutdown();
    running.wait().await;
    Ok(())
}
