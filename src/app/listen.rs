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

pub(super) async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, AppError> {
    TcpListener::bind(addr).await.map_err(|source| AppError::Bind {
        what,
        addr: addr.into(),
        source,
    })
}

/// Binds ingress: TCP, or the socket file with its mode (kept to remove at shutdown).
pub(super) async fn bind_ingress(config: &Config) -> Result<(Listener, ListenAddr, Option<SocketFile>), AppError> {
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

/// The listeners, bound before anything else starts (a port in use stops the start).
pub(super) struct Listeners {
    pub(super) ingress: Listener,
    pub(super) ingress_addr: ListenAddr,
    pub(super) socket_file: Option<SocketFile>,
    pub(super) admin: TcpListener,
    pub(super) admin_addr: SocketAddr,
    pub(super) ops: Option<TcpListener>,
    pub(super) ops_addr: Option<SocketAddr>,
}

impl Listeners {
    pub(super) async fn bind(config: &Config) -> Result<Listeners, AppError> {
        let (ingress, ingress_addr, socket_file) = bind_ingress(config).await?;
        let local = |what: &'static str, l: &TcpListener, addr: SocketAddr| {
            l.local_addr().map_err(|source| AppError::Bind {
                what,
                addr: addr.into(),
                source,
            })
        };
        let admin = bind("admin", config.admin_listen).await?;
        let admin_addr = local("admin", &admin, config.admin_listen)?;
        let (ops, ops_addr) = match config.ops_listen {
            Some(addr) => {
                let ops = bind("ops", addr).await?;
                let local_addr = local("ops", &ops, addr)?;
                (Some(ops), Some(local_addr))
            }
            None => (None, None),
        };
        Ok(Listeners {
            ingress,
            ingress_addr,
            socket_file,
            admin,
            admin_addr,
            ops,
            ops_addr,
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
            tokio::spawn(serve::serve(self.admin, admin, limits.admin.clone(), stop.clone())),
        ];
        if let Some(listener) = self.ops {
            tasks.push(tokio::spawn(serve::serve(listener, ops, limits.admin.clone(), stop)));
        }
        (tasks, self.socket_file)
    }
}
