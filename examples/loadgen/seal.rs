//! `--seal-only`: what sealing payloads at rest (`[store] encryption_key_files`) costs.
//! The same courier config without and with a store key, in the same run:
//! - ingest with the receiver down (a closed loop at the largest connection count, each
//!   side three times, alternating, a fresh data dir each time), and courier's CPU per 202;
//! - the sustainable rate, searched twice for each (plain, sealed, sealed, plain), every
//!   search from the same first guess;
//! - courier's CPU per delivered message in one open-loop window each at 80% of the lower
//!   sustainable rate.
//!
//! The goal is both rates at 0.95x or better; the CPU rows say what one seal at
//! accept and one open per attempt add.

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::args::Args;
use crate::courier::{cpu_in_window, dead_port, us_per, write_config, Courier};
use crate::load::{closed_loop, open_loop, Schedule};
use crate::report::{per_s, ratio, vs};
use crate::run::Ctx;
use crate::sustain::{search, search_from, Subject};
use crate::{joined, Res};

/// Courier's benchmark config with a store key (made once per run, mode 0600).
pub fn sealed_config(cx: &Ctx) -> Res<PathBuf> {
    use base64::Engine as _;
    use std::os::unix::fs::OpenOptionsExt;
    let key = cx.tmp.path().join("store.key");
    if !key.exists() {
        let bytes: [u8; 32] = rand::random();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&key)?;
        std::io::Write::write_all(
            &mut f,
            base64::engine::general_purpose::STANDARD.encode(bytes).as_bytes(),
        )?;
    }
    let path = write_config(cx.tmp.path(), "courier-sealed", cx.args.max_in_flight)?;
    let mut text = std::fs::read_to_string(&path)?;
    text.push_str(&format!("\n[store]\nencryption_key_files = [\"{}\"]\n", key.display()));
    std::fs::write(&path, text)?;
    Ok(path)
}

/// One closed-loop ingest window at `conns` against a fresh courier of `config` whose
/// receiver is down: 202/s and courier's CPU per 202.
async fn ingest(cx: &Ctx, config: &Path, tag: &str, conns: usize) -> Res<(f64, f64)> {
    let data = cx.tmp.path().join(format!("data-seal-{tag}"));
    let (mut c, _) = Courier::start(&cx.bin, config, &data)?;
    c.wait_ready().await?;
    let dead = dead_port().await?;
    let target = cx.target(c.ingress, format!("/http://{dead}/hook"));
    let (s, e) = cx.window(cx.plan.warmup);
    let cpu = cpu_in_window(c.pid(), s, e);
    let r = closed_loop(&target, conns, s, e, None, false).await?;
    let per_202 = us_per(joined(cpu).await?, r.accepted);
    c.kill();
    let _ = std::fs::remove_dir_all(data);
    Ok((r.rate(), per_202))
}

/// Courier's CPU per delivered message in one open-loop window at `rate`.
async fn cpu_per_delivered(cx: &Ctx, subj: &Subject, tag: &str, rate: f64) -> Res<(u64, f64)> {
    let live = subj.up(cx, tag).await?;
    let s = Schedule::new(64, rate, cx.plan.sustain_warmup, cx.plan.sustain_window);
    let (from, end) = (s.measure_from, s.end);
    let cpu = cpu_in_window(live.pid, from, end);
    let counted = cx.receiver.count_between(from, end);
    open_loop(&cx.target(live.addr, cx.hook_path()), &s).await?;
    let delivered = joined(counted).await?;
    Ok((delivered, us_per(joined(cpu).await?, delivered)))
}

/// Sealing alone, in this process: microseconds to seal and to open one payload record as
/// courier stores it (the benchmark's 1 KiB body, a content type and an `Authorization`
/// header), each the mean of 100,000.
fn seal_and_open_us(cx: &Ctx) -> (f64, f64, usize) {
    use ::courier::store::{Keyring, Payload, SigningChoice};
    let ring = Keyring::new(&[[7; 32]]);
    let record = Payload {
        method: "POST".into(),
        headers: vec![
            ("content-type".into(), b"application/json".to_vec()),
            ("authorization".into(), b"Bearer sk_live_0123456789abcdef".to_vec()),
        ],
        body: cx.body.to_vec(),
        scheme: None,
        signing: SigningChoice::Default,
    }
    .encode_packed();
    const N: u32 = 100_000;
    let started = std::time::Instant::now();
    let mut sealed = Vec::new();
    for i in 0..N {
        sealed = ring.seal("payloads", &i.to_be_bytes(), record.clone());
    }
    let seal = started.elapsed().as_secs_f64() * 1e6 / f64::from(N);
    let started = std::time::Instant::now();
    for _ in 0..N {
        let plain = ring.open("payloads", &(N - 1).to_be_bytes(), &sealed).expect("opens");
        assert_eq!(plain.len(), record.len());
    }
    (seal, started.elapsed().as_secs_f64() * 1e6 / f64::from(N), sealed.len())
}

/// `--seal-only`: the scenario alone, one table.
pub async fn seal_only(args: Args) -> Res<()> {
    let mut cx = Ctx::new(args).await?;
    scenario(&mut cx).await?;
    cx.finish()
}

/// The scenario: ingest, both searches, the CPU windows; rows, JSON (`sealing`), checks.
pub async fn scenario(cx: &mut Ctx) -> Res<()> {
    let (plain_cfg, sealed_cfg) = (cx.config()?, sealed_config(cx)?);
    let (seal_us, open_us, stored) = seal_and_open_us(cx);
    eprintln!("sealing: seal {seal_us:.2} us, open {open_us:.2} us per payload record ({stored} bytes stored)");
    let conns = cx.plan.conns.iter().copied().max().unwrap_or(64);
    // This machine's rates drift by 10-15% over minutes: each side is measured several
    // times, alternating, the order swapped each round, and the means compared.
    eprintln!("sealing: ingest, receiver down, {conns} conns, plain and sealed alternating");
    let (mut plain, mut sealed) = (Vec::new(), Vec::new());
    for round in 0..3 {
        let (p_tag, s_tag) = (format!("plain-{round}"), format!("sealed-{round}"));
        if round % 2 == 0 {
            plain.push(ingest(cx, &plain_cfg, &p_tag, conns).await?);
            sealed.push(ingest(cx, &sealed_cfg, &s_tag, conns).await?);
        } else {
            sealed.push(ingest(cx, &sealed_cfg, &s_tag, conns).await?);
            plain.push(ingest(cx, &plain_cfg, &p_tag, conns).await?);
        }
    }
    let mean = |v: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| v.iter().map(f).sum::<f64>() / v.len() as f64;
    let (p_rate, s_rate) = (mean(&plain, |x| x.0), mean(&sealed, |x| x.0));
    let (p_cpu, s_cpu) = (mean(&plain, |x| x.1), mean(&sealed, |x| x.1));
    eprintln!(
        "  ingest plain {} ({p_cpu:.1} us/202), sealed {} ({s_cpu:.1} us/202)",
        per_s(p_rate),
        per_s(s_rate)
    );

    // Two searches each (plain, sealed, sealed, plain), all from the first one's guess.
    let sealed_subj = Subject::Sealed(sealed_cfg);
    let p1 = search(cx, "courier, payloads plain (1)", &Subject::Courier).await?;
    let first = Some(p1.first_guess());
    let s1 = search_from(cx, "courier, payloads sealed (1)", &sealed_subj, first).await?;
    let s2 = search_from(cx, "courier, payloads sealed (2)", &sealed_subj, first).await?;
    let p2 = search_from(cx, "courier, payloads plain (2)", &Subject::Courier, first).await?;
    let (p_sus, s_sus) = ((p1.rate + p2.rate) / 2.0, (s1.rate + s2.rate) / 2.0);
    let floor = p_sus.min(s_sus);
    let lowest = [&p1, &p2, &s1, &s2]
        .iter()
        .map(|s| s.lowest())
        .fold(f64::INFINITY, f64::min);
    let at = if floor > 0.0 { floor * 0.8 } else { lowest * 0.5 };
    let (p_n, p_us) = cpu_per_delivered(cx, &Subject::Courier, "cpu-plain", at).await?;
    let (s_n, s_us) = cpu_per_delivered(cx, &sealed_subj, "cpu-sealed", at).await?;
    eprintln!(
        "  at {}: plain {p_us:.1} us per delivered ({p_n}), sealed {s_us:.1} us ({s_n})",
        per_s(at)
    );

    cx.rep.row(
        format!("ingest 202/s, sealed, {conns} conns, receiver down"),
        per_s(s_rate),
        vec![vs("plain, same run", per_s(p_rate), ratio(s_rate, p_rate))],
    );
    cx.rep.row(
        format!("CPU per 202, sealed, {conns} conns"),
        format!("{s_cpu:.1} us"),
        vec![vs("plain", format!("{p_cpu:.1} us"), ratio(s_cpu, p_cpu))],
    );
    cx.rep.row(
        "sustainable rate, sealed (mean of 2 searches)",
        format!("{} ({} / {})", per_s(s_sus), s1.show(), s2.show()),
        vec![vs(
            "plain, 2 searches from the same start",
            format!("{} ({} / {})", per_s(p_sus), p1.show(), p2.show()),
            ratio(s_sus, p_sus),
        )],
    );
    cx.rep.row(
        format!("CPU per delivered message, sealed, at {}", per_s(at)),
        format!("{s_us:.1} us"),
        vec![vs("plain", format!("{p_us:.1} us"), ratio(s_us, p_us))],
    );
    cx.rep.row(
        "seal + open of one 1 KiB payload record (in process)",
        format!("{:.2} us", seal_us + open_us),
        vec![],
    );
    cx.rep.set(
        "sealing",
        json!({"conns": conns,
               "in_process": {"seal_us": seal_us, "open_us": open_us, "stored_bytes": stored},
               "ingest": {"plain": plain, "sealed": sealed, "ratio": ratio(s_rate, p_rate),
                          "cpu_us_per_202": {"plain": p_cpu, "sealed": s_cpu}},
               "sustainable": {"plain": [p1.json(), p2.json()], "sealed": [s1.json(), s2.json()],
                               "plain_mean": p_sus, "sealed_mean": s_sus, "ratio": ratio(s_sus, p_sus)},
               "cpu_window": {"rate": at, "plain": {"delivered": p_n, "us_per_delivered": p_us},
                              "sealed": {"delivered": s_n, "us_per_delivered": s_us}}}),
    );
    cx.checks.push(("sealing: ingest", p_rate > 0.0 && s_rate > 0.0));
    cx.checks
        .push(("sealing: searches", [&p1, &p2, &s1, &s2].iter().all(|s| s.worked())));
    cx.checks.push(("sealing: cpu windows", p_n > 0 && s_n > 0));
    Ok(())
}
