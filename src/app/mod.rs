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
//! WAL synced and memtables flushed. A drain (see `drain::DrainControl`) takes the first steps
//! earlier, with the scheduler's own stop, and forwards what is open before any of this.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rand::SeedableRng;
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use crate::admin::Admin;
use crate::clock::{SharedClock, SteadyClock};
use crate::config::Config;
use crate::config::ListenAddr;
use crate::context::Context;
use crate::delivery::Deliverer;
use crate::drain::DrainControl;
use crate::fleet::{Fleet, FleetError, FleetParts};
use crate::inbound::ingress::Ingress;
use crate::inbound::serve::{self, Handler, Listener, ServeLimits};
use crate::inbound::uds::SocketFile;
use crate::intercept::{Intercept, InterceptParts};
use crate::metrics::Metrics;
use crate::ops::Probes;
use crate::outbound::client::HttpTransport;
use crate::outbound::resolver::{Resolve, SystemResolver};
use crate::outbound::tls::TlsMaterial;
use crate::outbound::transport::Transport;
use crate::reload::{ConfigSource, Reloader};
use crate::scheduler::Scheduler;
use crate::store::{Store, StoreError};
use crate::sys::delivery_runtime::DeliveryRuntime;

mod listen;
mod stop;

use listen::{fit_to_fd_limit, Listeners};
use stop::Stopping;

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
    /// A file the config names could not be used: the TLS material (a PEM file of `[tls]`
    /// or `[[host]]`), a store key file.
    #[error("{0}")]
    Files(crate::config::ConfigError),
    /// `[fleet]` cannot make a Redis client (a bad URL, an unreadable password file).
    #[error("{0}")]
    Fleet(#[from] FleetError),
    /// `[intercept]`'s CA cannot be read, made, or used for a listed host.
    #[error("{0}")]
    Intercept(#[from] crate::intercept::ca::CaError),
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
            clock: Arc::new(SteadyClock::new()),
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

/// Starts courier: returns once both listeners are bound and the store is open.
pub async fn start(mut config: Config, mut seams: Seams) -> Result<Running, AppError> {
    let loaded = config.clone();
    let limits = fit_to_fd_limit(&mut config);
    let config = Arc::new(config);
    let options = crate::args::store_options(&config).map_err(AppError::Files)?;
    let store = Arc::new(Store::open(&config.data_dir, options)?);
    let listeners = Listeners::bind(&config).await?;
    let config_source = seams.config_source.take();
    let resolver = seams.resolver.clone();
    let (deliverer, delivery_rt) = delivery(&config, &store, seams)?;
    recover(&deliverer, &delivery_rt)?;

    let draining = Arc::new(AtomicBool::new(false));
    let accepts = Arc::new(crate::inbound::ingress::AcceptsInProgress::default());
    // Stops retention, and the scheduler at shutdown.
    let (stop_sched, sched_rx) = watch::channel(false);
    // The scheduler's own stop, which a drain (`POST /drain`) sends before any shutdown,
    // and the word that it has returned.
    let stop_scheduler = Arc::new(watch::channel(false).0);
    let scheduler_done = watch::channel(false).0;
    let (stop_http, http_rx) = watch::channel(false);
    let drain = Arc::new(DrainControl::new(
        deliverer.clone(),
        draining.clone(),
        accepts.clone(),
        stop_scheduler.clone(),
        scheduler_done.subscribe(),
    ));
    let reloader = Arc::new(Reloader::new(config_source, deliverer.clone(), loaded));
    let (ingress_addr, admin_addr) = (listeners.ingress_addr.clone(), listeners.admin.1);
    let ops_addr = listeners.ops.as_ref().map(|o| o.1);
    let ingress = Arc::new(Ingress::new(deliverer.clone(), draining.clone(), accepts));
    let intercept = Arc::new(Intercept::new(
        &config,
        InterceptParts {
            ingress: ingress.clone(),
            ctx: deliverer.context().clone(),
            resolver,
            limits: limits.ingress.clone(),
            stop: http_rx.clone(),
        },
    )?);
    let handlers = handlers(ingress, intercept.clone(), &deliverer, &draining, &reloader, &drain);
    let (mut http_tasks, socket_file) = listeners.serve(handlers, &limits, http_rx.clone());
    // Stop waits for the tunnels as for the listeners' connections.
    let mut tunnels_stop = http_rx;
    http_tasks.push(tokio::spawn(async move {
        let _ = tunnels_stop.wait_for(|stopped| *stopped).await;
        intercept.closed().await;
    }));
    let scheduler = Scheduler::new(deliverer.clone()).run(stop_scheduler.subscribe());
    let scheduler_task = delivery_rt.handle().spawn(async move {
        scheduler.await;
        scheduler_done.send_replace(true);
    });
    let retention_task = retention(&deliverer, sched_rx);
    // Ingest's pace: on ingest's runtime, which is the one to slow.
    // It holds delivery weakly: a stopped courier's store is not kept open by it.
    let (waiting, threads) = (Arc::downgrade(&deliverer), delivery_rt.threads());
    let metrics = deliverer.context().metrics().clone();
    tokio::spawn(deliverer.pace().clone().run(
        move || threads.sample(),
        move || waiting.upgrade().map(|d| d.messages_waiting()),
        move |slowed| metrics.ingest_slowed(slowed),
    ));
    // `ops` is left out of the line when there is no ops listener.
    tracing::info!(ingress = %ingress_addr, admin = %admin_addr, ops = ops_addr.map(tracing::field::display),
        data_dir = %config.data_dir.display(), "listening");

    let trigger = Arc::new(Notify::new());
    let stopping = Stopping {
        deliverer: deliverer.clone(),
        grace: config.shutdown_grace,
        draining,
        drain,
        stop_sched,
        stop_scheduler,
        scheduler_task,
        retention_task,
        stop_http,
        http_tasks,
        socket_file,
        store,
        delivery_rt,
    };
    let t = trigger.clone();
    let done = tokio::spawn(async move {
        t.notified().await;
        stopping.run().await;
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

/// The request handlers of the three listeners: ingress (`CONNECT` to the tunnels),
/// admin (which serves the probes too, and starts reloads and drains) and ops (the probes
/// alone).
fn handlers(
    ingress: Arc<Ingress>,
    intercept: Arc<Intercept>,
    deliverer: &Arc<Deliverer>,
    draining: &Arc<AtomicBool>,
    reloader: &Arc<Reloader>,
    drain: &Arc<DrainControl>,
) -> [Handler; 3] {
    let probes = Arc::new(Probes::new(deliverer.clone(), draining.clone()));
    let admin = Arc::new(Admin::new(
        deliverer.context().clone(),
        deliverer.hosts().clone(),
        probes.clone(),
        reloader.clone(),
        drain.clone(),
    ));
    [
        Arc::new(
            move |peer, req: hyper::Request<hyper::body::Incoming>| -> serve::HandlerFuture {
                match req.method() == http::Method::CONNECT {
                    true => Box::pin(intercept.clone().connect(peer, req)),
                    false => Box::pin(ingress.clone().handle(peer, req)),
                }
            },
        ),
        Arc::new(move |peer, req| Box::pin(admin.clone().handle(peer, req))),
        Arc::new(move |peer, req| Box::pin(probes.clone().handle(peer, req))),
    ]
}

/// Delivery and what it stands on: the outbound transport (with its TLS material), the
/// delivery runtime, the fleet-wide limits and the shared context.
fn delivery(
    config: &Arc<Config>,
    store: &Arc<Store>,
    seams: Seams,
) -> Result<(Arc<Deliverer>, DeliveryRuntime), AppError> {
    // Built before the transport whether or not it is used, so a bad PEM file stops the
    // start in tests with a scripted transport too; a reload replaces its material.
    let tls = TlsMaterial::from_config(config).map_err(AppError::Files)?;
    let transport = seams
        .transport
        .unwrap_or_else(|| Arc::new(HttpTransport::new(config, seams.resolver, tls)));
    let rng = match seams.rng_seed {
        Some(seed) => rand::rngs::StdRng::seed_from_u64(seed),
        None => rand::rngs::StdRng::from_os_rng(),
    };
    let metrics = Arc::new(Metrics::default());
    let wake = Arc::new(crate::sys::wake::Wake::default());
    let delivery_rt = DeliveryRuntime::start().map_err(AppError::Runtime)?;
    // Connects in the background: until Redis answers, the fallback limits apply.
    let fleet = Fleet::start(
        &config.fleet,
        FleetParts {
            runtime: delivery_rt.handle(),
            wake: wake.clone(),
            ca_pem: crate::outbound::tls::ca_bundle(&config.tls.ca_file).map_err(AppError::Files)?,
            metrics: metrics.clone(),
        },
    )?;
    let ctx = Context::new(
        store.clone(),
        seams.clock,
        config.clone(),
        metrics,
        wake,
        delivery_rt.handle(),
    )?;
    Ok((Deliverer::new(ctx, transport, rng, fleet), delivery_rt))
}

/// The retention sweeps, each followed by forgetting the endpoints not seen within the
/// retention window; they stop when `stop` turns true.
fn retention(deliverer: &Arc<Deliverer>, stop: watch::Receiver<bool>) -> JoinHandle<()> {
    let ctx = deliverer.context().clone();
    let forget = ctx.clone();
    let forget_endpoints: crate::retention::AfterSweep = Arc::new(move || {
        match forget.expire_endpoints() {
        Ok((forgotten, deleted)) if forgotten + deleted > 0 => tracing::info!(
            forgotten,
            deleted,
            "endpoints not seen within the retention window forgotten (in memory), and records not written within it deleted"
        ),
        Ok(_) => {}
        Err(e) => tracing::error!(error = %e, "forgetting idle endpoints failed; will try again"),
    }
    });
    tokio::spawn(crate::retention::run(
        ctx.store().clone(),
        ctx.clock().clone(),
        stop,
        forget_endpoints,
    ))
}

/// Startup's recovery (see `Deliverer::recover_at_start`), said in the log: a crash leaves
/// messages in flight, and (in the middle of a resume) parked for an endpoint that is
/// active. The simulator runs this same recovery.
fn recover(deliverer: &Arc<Deliverer>, delivery_rt: &DeliveryRuntime) -> Result<(), AppError> {
    let (recovered, unparked, blocked) = deliverer.recover_at_start()?;
    for endpoint in blocked {
        // The pause of a line blocked just before the last stop: said now, and alerted.
        tracing::warn!(endpoint = %crate::redact::url_for_log(&endpoint),
            "endpoint paused: its ordered line is blocked behind a dead message; resume it with `courier endpoints resume`");
        let (d, now) = (deliverer.clone(), deliverer.context().clock().now_ms());
        delivery_rt.handle().spawn(async move {
            let rec = d
                .context()
                .endpoints()
                .get(&endpoint)
                .map(|v| v.rec)
                .unwrap_or_default();
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

    Ok(())
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
