//! The listeners: bound first (a port in use stops the start), their connection limits
//! fitted to the file descriptor limit.

use super::*;

/// The listeners' limits after [`fit_to_fd_limit`].
pub(super) struct ListenerLimits {
    pub(super) ingress: ServeLimits,
    pub(super) admin: ServeLimits,
}

/// Raises the descriptor limit and fits delivery's and the listeners' shares inside it,
/// keeping the store's reserve (see [`crate::sys::fds`]); says so when a setting is lowered.
pub(super) fn fit_to_fd_limit(config: &mut Config) -> ListenerLimits {
    let mut ingress = ServeLimits {
        idle_timeout: config.ingress.idle_timeout,
        send_timeout: config.ingress.send_timeout,
        ..ServeLimits::default()
    };
    let mut admin = ServeLimits {
        idle_timeout: config.admin.idle_timeout,
        send_timeout: config.admin.send_timeout,
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
pub(super) fn lower_to_fit(limit: u64, key: &str, value: &mut u32, share: u64) {
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

/// Binds `addr` for `what`: the listener and the address it got (the port, when 0 asked).
pub(super) async fn bind(what: &'static str, addr: SocketAddr) -> Result<(TcpListener, SocketAddr), AppError> {
    let err = move |source| AppError::Bind {
        what,
        addr: addr.into(),
        source,
    };
    let l = TcpListener::bind(addr).await.map_err(err)?;
    let bound = l.local_addr().map_err(err)?;
    Ok((l, bound))
}

/// The listeners, bound before anything else starts (a port in use stops the start).
pub(super) struct Listeners {
    pub(super) ingress: Listener,
    pub(super) ingress_addr: ListenAddr,
    pub(super) socket_file: Option<SocketFile>,
    pub(super) admin: (TcpListener, SocketAddr),
    pub(super) ops: Option<(TcpListener, SocketAddr)>,
}

impl Listeners {
    /// Binds ingress (TCP, or the socket file with its mode, kept to remove at shutdown),
    /// admin and ops; warns of each served to the network without a token.
    pub(super) async fn bind(config: &Config) -> Result<Listeners, AppError> {
        let (ingress, ingress_addr, socket_file) = match &config.listen {
            ListenAddr::Tcp(addr) => {
                let (l, bound) = bind("ingress", *addr).await?;
                (Listener::Tcp(l), ListenAddr::Tcp(bound), None)
            }
            ListenAddr::Unix(path) => {
                let (l, file) = SocketFile::bind(path, config.listen_mode).map_err(|source| AppError::Bind {
                    what: "ingress",
                    addr: config.listen.clone(),
                    source,
                })?;
                (Listener::Unix(l), config.listen.clone(), Some(file))
            }
        };
        let admin = bind("admin", config.admin_listen).await?;
        let ops = match config.ops_listen {
            Some(addr) => Some(bind("ops", addr).await?),
            None => None,
        };
        // Validation refused this unless the operator said so on purpose: say it once, loudly.
        for (key, addr) in config.unauthenticated_network_listeners() {
            tracing::warn!(
                listener = key,
                addr = %addr,
                "serving the network without a token (allow_unauthenticated_network = true): anyone who can reach it can use it"
            );
        }
        Ok(Listeners {
            ingress,
            ingress_addr,
            socket_file,
            admin,
            ops,
        })
    }

    /// Serves ingress, admin and (when bound) ops with their handlers, in that order, until
    /// `stop` turns true; answers the tasks and the Unix socket file to remove at stop.
    pub(super) fn serve(
        self,
        [ingress, admin, ops]: [Handler; 3],
        limits: &ListenerLimits,
        stop: watch::Receiver<bool>,
    ) -> (Vec<JoinHandle<()>>, Option<SocketFile>) {
        let mut tasks = vec![
            tokio::spawn(serve::serve(
                self.ingress,
                ingress,
                limits.ingress.clone(),
                stop.clone(),
            )),
            tokio::spawn(serve::serve(self.admin.0, admin, limits.admin.clone(), stop.clone())),
        ];
        if let Some((listener, _)) = self.ops {
            tasks.push(tokio::spawn(serve::serve(listener, ops, limits.admin.clone(), stop)));
        }
        (tasks, self.socket_file)
    }
}
