//! Command-line flags and the sizes and durations they select.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

/// Command-line flags.
#[derive(Parser, Debug, Clone)]
#[command(about = "Benchmark courier against same-run baselines")]
pub struct Args {
    /// A shorter run: 3 s per point and a 20,000-message backlog.
    #[arg(long)]
    pub quick: bool,
    /// A seconds-long run of every scenario at tiny scale; asserts nothing about speed.
    #[arg(long, conflicts_with = "quick")]
    pub smoke: bool,
    /// Where to write the results as JSON.
    #[arg(long, default_value = "bench-results.json")]
    pub json: PathBuf,
    /// The courier binary (default: `courier` next to this executable).
    #[arg(long)]
    pub courier: Option<PathBuf>,
    /// Messages accepted in the backlog scenario (default 1,000,000; 20,000 with --quick).
    #[arg(long)]
    pub backlog: Option<u64>,
    /// Seconds measured per throughput point (default 10; 3 with --quick).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Connection counts for the ingest points.
    #[arg(long, value_delimiter = ',')]
    pub conns: Option<Vec<usize>>,
    /// Per-host in-flight cap given to courier.
    #[arg(long, default_value_t = 64)]
    pub max_in_flight: u32,
    /// Only the ack-latency scenario, at this many requests per second (receiver up), with
    /// baseline (a) at the same rate: for tuning the tail without the whole run.
    #[arg(long)]
    pub ack_only: Option<f64>,
    /// Only the sustainable-rate scenarios: courier, (f) and nginx searched, latency at 50%
    /// and 90% of courier's rate, CPU per delivered message (for tuning delivery).
    #[arg(long, conflicts_with = "ack_only")]
    pub sustain_only: bool,
    /// Only one sustainable-rate probe of a fresh courier at this rate, never stopped early,
    /// with its scheduled send → receiver latency per 500 ms of the window: for finding
    /// where a failing probe's late messages come from.
    #[arg(long, conflicts_with_all = ["ack_only", "sustain_only"])]
    pub probe_at: Option<f64>,
    /// Only the many-endpoints scenario (for tuning courier with thousands of receivers).
    #[arg(long, conflicts_with_all = ["ack_only", "sustain_only"])]
    pub many_only: bool,
    /// Only the fleet scenario: courier's sustainable rate with `[fleet]` on a local
    /// `redis-server` and without it, and Redis's CPU per delivered message.
    #[arg(long, conflicts_with_all = ["ack_only", "sustain_only", "many_only"])]
    pub fleet_only: bool,
    /// Only the sealing scenario: ingest and the sustainable rate with payloads sealed at
    /// rest (`[store] encryption_key_files`) and without, and the CPU it adds per message.
    #[arg(long, conflicts_with_all = ["ack_only", "sustain_only", "many_only", "fleet_only"])]
    pub seal_only: bool,
    /// Only the floor scenario: courier against baseline (g), the minimal durable forwarder,
    /// alternating (courier, (g), (g), courier per pair): closed loop, fixed rates, and the
    /// sustainable rate, each run on a fresh data dir.
    #[arg(long, conflicts_with_all = ["ack_only", "sustain_only", "many_only", "fleet_only", "seal_only"])]
    pub floor_only: bool,
    /// POST a typical JSON event (ids, amounts, URLs; it packs to about 85%) instead of the
    /// 1 KiB body padded with `x` (which packs to a few percent).
    #[arg(long)]
    pub event_body: bool,
    /// Pairs of the floor scenario (default 3; 1 with --smoke).
    #[arg(long)]
    pub pairs: Option<usize>,
    /// Endpoint counts of the many-endpoints scenario (default 10000,100000,1000000;
    /// 10000 with --quick; 200 with --smoke).
    #[arg(long, value_delimiter = ',')]
    pub endpoints: Option<Vec<u64>>,
    /// In the many-endpoints scenario, one message in this many goes to a path answered
    /// 410 (dead-lettered at once); 1: every message (what a permanent failure costs).
    #[arg(long, default_value_t = 10)]
    pub gone_every: u64,
    /// Internal: serve baseline (a) and print its port.
    #[arg(long, hide = true)]
    pub serve_baseline: bool,
    /// Internal: serve baseline (d) (bodies group-committed to a file in this dir) and
    /// print its port.
    #[arg(long, hide = true)]
    pub serve_durable_baseline: Option<PathBuf>,
    /// Internal: with `--serve-durable-baseline`, commit to RocksDB (baseline (e)).
    #[arg(long, hide = true)]
    pub rocksdb: bool,
    /// Internal: serve baseline (f), a forwarding proxy to this receiver, and print its port.
    #[arg(long, hide = true)]
    pub serve_forward_baseline: Option<SocketAddr>,
    /// Internal: serve baseline (g), the minimal durable forwarder, to RECEIVER_ADDR with
    /// its RocksDB in DIR, and print its address.
    #[arg(long, hide = true, num_args = 2, value_names = ["RECEIVER_ADDR", "DIR"])]
    pub serve_floor_baseline: Option<Vec<String>>,
}

/// Sizes and durations of one run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub mode: &'static str,
    pub conns: Vec<usize>,
    pub warmup: Duration,
    pub duration: Duration,
    pub idle_samples: usize,
    pub backlog: u64,
    pub cpu_window: Duration,
    pub drain_timeout: Duration,
    /// Sustainable-rate probes: the measured window of each (30 s full, 10 s quick, 0.5 s
    /// smoke, which must keep the whole smoke run near 15 s) and the warm-up before it.
    pub sustain_window: Duration,
    pub sustain_warmup: Duration,
    /// At most this many probes per searched server.
    pub sustain_probes: usize,
    /// The short closed loop whose deliveries/s are a search's first guess.
    pub short_window: Duration,
    /// Many endpoints: the endpoint counts run, spread over at most `many_hosts` hosts.
    pub many_sizes: Vec<u64>,
    pub many_hosts: usize,
    /// Wait after the last message finished before RSS and sockets are read as settled.
    pub many_settle: Duration,
    /// `GET /endpoints?limit=100` requests timed, and the most time they may take in all.
    pub many_admin_requests: usize,
    pub many_admin_budget: Duration,
}

impl Plan {
    /// The sizes of `--smoke`, `--quick` or a full run, with the flags' overrides.
    pub fn from(args: &Args) -> Plan {
        let (mode, conns, warmup, duration, idle, backlog, cpu) = if args.smoke {
            ("smoke", vec![4], 0.1, 0.3, 5, 200, 0.5)
        } else if args.quick {
            ("quick", vec![16, 64, 256], 1.0, 3.0, 100, 20_000, 5.0)
        } else {
            ("full", vec![16, 64, 256], 2.0, 10.0, 300, 1_000_000, 5.0)
        };
        // (window, warm-up, probes, short window) of the sustainable-rate search.
        let (sw, swarm, probes, short) = if args.smoke {
            (0.5, 0.0, 2, 0.3)
        } else if args.quick {
            (10.0, 0.2, 6, 1.0)
        } else {
            (30.0, 2.0, 8, 2.0)
        };
        // (sizes, hosts, settle, admin requests, admin budget) of the many-endpoints
        // scenario; `--smoke` keeps it near 2 s.
        let (many, hosts, settle, admin_n, admin_s) = if args.smoke {
            (vec![200], 20, 0.3, 20, 2.0)
        } else if args.quick {
            (vec![10_000], 1000, 3.0, 200, 20.0)
        } else {
            (vec![10_000, 100_000, 1_000_000], 1000, 3.0, 200, 30.0)
        };
        Plan {
            mode,
            conns: args.conns.clone().unwrap_or(conns),
            warmup: Duration::from_secs_f64(warmup),
            duration: Duration::from_secs_f64(args.duration.unwrap_or(duration)),
            idle_samples: idle,
            backlog: args.backlog.unwrap_or(backlog),
            cpu_window: Duration::from_secs_f64(cpu),
            drain_timeout: Duration::from_secs(if args.smoke { 30 } else { 3600 }),
            sustain_window: Duration::from_secs_f64(sw),
            sustain_warmup: Duration::from_secs_f64(swarm),
            sustain_probes: probes,
            short_window: Duration::from_secs_f64(short),
            many_sizes: args.endpoints.clone().unwrap_or(many),
            many_hosts: hosts,
            many_settle: Duration::from_secs_f64(settle),
            many_admin_requests: admin_n,
            many_admin_budget: Duration::from_secs_f64(admin_s),
        }
    }
}
