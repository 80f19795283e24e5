//! The operator commands: `courier deliveries …`, `courier endpoints …` and `courier hosts …`. They find the
//! admin API from the same settings as `serve` (config file, `COURIER_*`, flags; the token
//! from `admin_token`), call it, and print a readable table, or the API's JSON with `--json`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use clap::{Args, Subcommand};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use crate::args::GlobalArgs;

mod tables;
use crate::redact::escape;
use tables::{deliveries_table, delivery_detail, endpoints_table, hosts_table, pretty};

/// Output choice shared by the operator commands.
#[derive(Debug, Args, Clone, Copy, Default)]
pub struct OutputArgs {
    /// Print the admin API's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl OutputArgs {
    /// What the API answered: its JSON with `--json`, else `text` of it.
    fn show(self, v: &Value, text: impl FnOnce(&Value) -> String) -> String {
        if self.json {
            pretty(v)
        } else {
            text(v)
        }
    }
}

/// `courier deliveries …`
#[derive(Debug, Subcommand)]
pub enum DeliveriesCommand {
    /// List deliveries (newest last), optionally filtered.
    List {
        /// Only this state: pending, in_flight, delivered, dead, handed_off.
        #[arg(long)]
        state: Option<String>,
        /// Only this endpoint key.
        #[arg(long)]
        endpoint: Option<String>,
        /// Page size (1 to 1000).
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Start after this cursor (from a previous page).
        #[arg(long)]
        cursor: Option<String>,
        /// Output format.
        #[command(flatten)]
        out: OutputArgs,
    },
    /// Show one delivery with its attempt history.
    Show {
        /// Delivery id (dlv_…).
        id: String,
        /// Output format.
        #[command(flatten)]
        out: OutputArgs,
    },
    /// Replay a dead delivery, or every dead one matching filters with --all.
    Retry {
        /// Delivery id (dlv_…); omit with --all.
        id: Option<String>,
        /// Replay every dead delivery matching --endpoint/--since/--until.
        #[arg(long, conflicts_with = "id")]
        all: bool,
        /// With --all: only this endpoint.
        #[arg(long, requires = "all")]
        endpoint: Option<String>,
        /// With --all: only those that died at or after this RFC 3339 time.
        #[arg(long, requires = "all")]
        since: Option<String>,
        /// With --all: only those that died before this RFC 3339 time.
        #[arg(long, requires = "all")]
        until: Option<String>,
        /// Output format.
        #[command(flatten)]
        out: OutputArgs,
    },
    /// Delete a delivery (any state).
    Delete {
        /// Delivery id (dlv_…).
        id: String,
    },
}

/// `courier endpoints …`
#[derive(Debug, Subcommand)]
pub enum EndpointsCommand {
    /// List endpoints with state, streak, in-flight and pending counts.
    List {
        /// Output format.
        #[command(flatten)]
        out: OutputArgs,
    },
    /// Pause an endpoint: its messages stay pending, nothing is sent.
    Pause {
        /// Endpoint key (by default the target URL without its query).
        key: String,
    },
    /// Resume an endpoint: its held messages go out at once.
    Resume {
        /// Endpoint key.
        key: String,
    },
}

/// `courier hosts …`
#[derive(Debug, Subcommand)]
pub enum HostsCommand {
    /// List the hosts courier is working with: circuit breaker state, attempts in flight,
    /// cap, consecutive failures, next probe.
    List {
        /// Only hosts whose circuit breaker is not closed.
        #[arg(long)]
        open: bool,
        /// Output format.
        #[command(flatten)]
        out: OutputArgs,
    },
}

/// One operator command.
#[derive(Debug)]
pub enum Operation {
    /// A deliveries command.
    Deliveries(DeliveriesCommand),
    /// An endpoints command.
    Endpoints(EndpointsCommand),
    /// A hosts command.
    Hosts(HostsCommand),
    /// `courier reload`.
    Reload,
}

/// What went wrong talking to the admin API.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// The settings are invalid.
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
    /// Nothing answered at the admin address.
    #[error("cannot reach the admin API at {addr}: {reason} (is courier running? is --admin-listen right?)")]
    Unreachable {
        /// The address tried.
        addr: SocketAddr,
        /// Why.
        reason: String,
    },
    /// The API answered with an error.
    #[error("admin API answered {status}: {code}: {message}")]
    Api {
        /// HTTP status.
        status: u16,
        /// Error code.
        code: String,
        /// Message.
        message: String,
    },
}

/// A client of the admin API, found from the same settings as `serve`.
pub(crate) struct AdminClient {
    addr: SocketAddr,
    token: Option<String>,
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
}

impl AdminClient {
    /// The client for `config`'s admin API (a wildcard address is reached over loopback).
    pub(crate) fn new(config: &crate::config::Config) -> Self {
        AdminClient {
            addr: admin_target(config.admin_listen),
            token: config.admin_token.as_ref().map(|t| t.expose().to_string()),
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    async fn call(&self, method: http::Method, path_and_query: &str) -> Result<Value, OperatorError> {
        Ok(self.call_with(method, path_and_query, None).await?.1)
    }

    /// [`AdminClient::call`] with a JSON body.
    pub(crate) async fn call_with(
        &self,
        method: http::Method,
        path_and_query: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value), OperatorError> {
        let unreachable = |reason: String| OperatorError::Unreachable {
            addr: self.addr,
            reason,
        };
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("http://{}{}", self.addr, path_and_query));
        if let Some(t) = &self.token {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let body = match body {
            Some(json) => {
                req = req.header(http::header::CONTENT_TYPE, "application/json");
                Bytes::from(json.to_string())
            }
            None => Bytes::new(),
        };
        let req = req.body(Full::new(body)).map_err(|e| unreachable(e.to_string()))?;
        let resp = tokio::time::timeout(Duration::from_secs(30), self.client.request(req))
            .await
            .map_err(|_| unreachable("no answer within 30s".into()))?
            .map_err(|e| unreachable(root_cause(&e)))?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| unreachable(e.to_string()))?
            .to_bytes();
        // An empty body (204) reads as null like any body that is not JSON.
        let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if status >= 400 {
            return Err(OperatorError::Api {
                status,
                code: value["error"].as_str().unwrap_or("error").to_string(),
                message: value["message"].as_str().unwrap_or("").to_string(),
            });
        }
        Ok((status, value))
    }
}

fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

fn enc(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

fn query(pairs: &[(&str, Option<String>)]) -> String {
    let mut ser = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        if let Some(v) = v {
            ser.append_pair(k, v);
        }
    }
    let q = ser.finish();
    if q.is_empty() {
        q
    } else {
        format!("?{q}")
    }
}

/// Where to reach the admin API for a configured listen address: a wildcard listen
/// address is reached over loopback.
pub fn admin_target(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), listen.port()),
        IpAddr::V6(ip) if ip.is_unspecified() => SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), listen.port()),
        _ => listen,
    }
}

/// Runs an operator command; prints its output or one error line.
pub fn run(global: &GlobalArgs, op: Operation) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("courier: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(execute(global, op)) {
        Ok(text) => {
            if !text.is_empty() {
                println!("{text}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("courier: {}", escape(&e.to_string()));
            ExitCode::FAILURE
        }
    }
}

async fn execute(global: &GlobalArgs, op: Operation) -> Result<String, OperatorError> {
    let config = crate::args::load_config(global)?;
    let client = AdminClient::new(&config);
    match op {
        Operation::Deliveries(command) => deliveries(&client, command).await,
        Operation::Endpoints(command) => endpoints(&client, command).await,
        Operation::Hosts(HostsCommand::List { open, out }) => {
            let path = if open { "/hosts?state=open" } else { "/hosts" };
            let v = client.call(http::Method::GET, path).await?;
            Ok(out.show(&v, hosts_table))
        }
        Operation::Reload => reload(&client).await,
    }
}

/// `courier reload`: what the running courier applied, and what waits for a restart.
async fn reload(client: &AdminClient) -> Result<String, OperatorError> {
    let v = client.call(http::Method::POST, "/reload").await?;
    let strings = |key: &str| -> Vec<String> {
        let keys = v[key].as_array().into_iter().flatten();
        keys.filter_map(|k| k.as_str().map(str::to_string)).collect()
    };
    let (later, dropped) = (strings("restart_required"), strings("signing_keys_dropped"));
    let mut text = if later.is_empty() {
        "config reloaded".to_string()
    } else {
        format!(
            "config reloaded; changed but applied only at restart: {}",
            later.join(", ")
        )
    };
    if !dropped.is_empty() {
        text.push_str(&format!(
            "\nsigning keys removed or bound to other targets (messages accepted with them wait): {}",
            dropped.join(", ")
        ));
    }
    Ok(text)
}

/// `courier deliveries ...`.
async fn deliveries(client: &AdminClient, command: DeliveriesCommand) -> Result<String, OperatorError> {
    use http::Method;
    match command {
        DeliveriesCommand::List {
            state,
            endpoint,
            limit,
            cursor,
            out,
        } => {
            let q = query(&[
                ("state", state),
                ("endpoint", endpoint),
                ("limit", Some(limit.to_string())),
                ("cursor", cursor),
            ]);
            let v = client.call(Method::GET, &format!("/deliveries{q}")).await?;
            Ok(out.show(&v, deliveries_table))
        }
        DeliveriesCommand::Show { id, out } => {
            let v = client.call(Method::GET, &format!("/deliveries/{}", enc(&id))).await?;
            Ok(out.show(&v, delivery_detail))
        }
        DeliveriesCommand::Retry {
            all: true,
            endpoint,
            since,
            until,
            out,
            ..
        } => {
            let q = query(&[
                ("state", Some("dead".into())),
                ("endpoint", endpoint),
                ("since", since),
                ("until", until),
            ]);
            let v = client.call(Method::POST, &format!("/deliveries/retry{q}")).await?;
            Ok(out.show(&v, |v| format!("requeued {} dead deliveries", v["requeued"])))
        }
        DeliveriesCommand::Retry { id: Some(id), out, .. } => {
            let path = format!("/deliveries/{}/retry", enc(&id));
            let v = client.call(Method::POST, &path).await?;
            Ok(out.show(&v, |_| format!("{} requeued (pending)", escape(&id))))
        }
        DeliveriesCommand::Retry { id: None, .. } => Err(OperatorError::Api {
            status: 400,
            code: "usage".into(),
            message: "give a delivery id, or --all".into(),
        }),
        DeliveriesCommand::Delete { id } => {
            client
                .call(Method::DELETE, &format!("/deliveries/{}", enc(&id)))
                .await?;
            Ok(format!("{} deleted", escape(&id)))
        }
    }
}

/// `courier endpoints ...`.
async fn endpoints(client: &AdminClient, command: EndpointsCommand) -> Result<String, OperatorError> {
    use http::Method;
    match command {
        EndpointsCommand::List { out } => {
            // Every page, in key order (the API answers at most 1,000 a page).
            let mut items = Vec::new();
            let mut cursor: Option<String> = None;
            loop {
                let path = match &cursor {
                    Some(c) => format!("/endpoints?limit=1000&cursor={}", enc(c)),
                    None => "/endpoints?limit=1000".to_string(),
                };
                let v = client.call(Method::GET, &path).await?;
                items.extend(v["items"].as_array().cloned().unwrap_or_default());
                match v["next_cursor"].as_str() {
                    Some(c) if cursor.as_deref() != Some(c) => cursor = Some(c.to_string()),
                    _ => break,
                }
            }
            let v = serde_json::json!({ "items": items, "next_cursor": null });
            Ok(out.show(&v, endpoints_table))
        }
        EndpointsCommand::Pause { key } => toggle(client, &key, "pause").await,
        EndpointsCommand::Resume { key } => toggle(client, &key, "resume").await,
    }
}

/// `courier endpoints pause|resume KEY`.
async fn toggle(client: &AdminClient, key: &str, verb: &str) -> Result<String, OperatorError> {
    let path = format!("/endpoints/{}/{verb}", enc(key));
    client.call(http::Method::POST, &path).await?;
    Ok(format!("{} {verb}d", escape(key)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_admin_addresses_are_reached_over_loopback() {
        assert_eq!(
            admin_target("0.0.0.0:8788".parse().unwrap()),
            "127.0.0.1:8788".parse().unwrap()
        );
        assert_eq!(
            admin_target("[::]:8788".parse().unwrap()),
            "[::1]:8788".parse().unwrap()
        );
        assert_eq!(
            admin_target("10.0.0.1:1".parse().unwrap()),
            "10.0.0.1:1".parse().unwrap()
        );
    }
}
