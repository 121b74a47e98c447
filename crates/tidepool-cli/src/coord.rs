//! `tidepool coord` and `tidepool top`.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;
use tidepool_coord::{Config, Coordinator, Policy, Snapshot};
use tidepool_node::format_size;

#[derive(clap::Args, Debug)]
pub struct CoordArgs {
    /// Unix socket to listen on, mode 0600 [default: $XDG_RUNTIME_DIR/tidepool/coord.sock,
    /// else /tmp/tidepool-UID/coord.sock, in a directory of mode 0700].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Let programs of this group (name or id) join too: socket 0660, its directory 0750.
    /// Whoever joins may change only its own registration; the owner and root, any.
    #[arg(long, value_parser = parse_group)]
    pub group: Option<u32>,
    /// Serve the dashboard, /api/state and Prometheus /metrics at this address.
    #[arg(long)]
    pub http: Option<std::net::SocketAddr>,
    /// The token that changes over HTTP need (`Authorization: Bearer`), mode 0600; made with a
    /// random token if missing [default: beside the socket, coord.token].
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// midas (reconstruction time saved per byte), hitrate (hits per byte, like
    /// Cliffhanger) or static (even split by weight).
    #[arg(long, default_value = "midas")]
    pub policy: Policy,
    /// Headroom always left to everything else.
    #[arg(long, default_value = "512M", value_parser = crate::parse_size_arg)]
    pub reserve: u64,
    /// Soft memory in all never exceeds this.
    #[arg(long, value_parser = crate::parse_size_arg)]
    pub max: Option<u64>,
    /// Milliseconds between budget plans.
    #[arg(long, default_value_t = 250)]
    pub epoch_ms: u64,
    /// No application's budget is cut under this while idle memory allows.
    #[arg(long, default_value = "8M", value_parser = crate::parse_size_arg)]
    pub floor: u64,
}

/// A group by name or number.
fn parse_group(s: &str) -> Result<u32, String> {
    if let Ok(gid) = s.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(s) {
        Ok(Some(g)) => Ok(g.gid.as_raw()),
        Ok(None) => Err(format!("no group named {s:?} (see /etc/group)")),
        Err(e) => Err(format!("cannot look up group {s:?}: {e}")),
    }
}

pub fn run(a: CoordArgs) -> Result<()> {
    // SIGTERM and SIGINT stop the coordinator in order (below) rather than kill it.
    tidepool_sys::block_stop_signals()?;
    let socket = a.socket.unwrap_or_else(tidepool_coord::default_socket);
    let mut cfg = Config::default()
        .socket(socket.clone())
        .policy(a.policy)
        .reserve(a.reserve)
        .max(a.max.unwrap_or(u64::MAX))
        .epoch(Duration::from_millis(a.epoch_ms.max(10)))
        .floor(a.floor);
    if let Some(gid) = a.group {
        cfg = cfg.group(gid);
    }
    if let Some(path) = a.token_file {
        cfg = cfg.token_file(path);
    }
    let coord = Coordinator::start(cfg)
        .with_context(|| format!("cannot listen at {}", socket.display()))?;
    let http = match a.http {
        Some(addr) => {
            if !addr.ip().is_loopback() {
                eprintln!(
                    "tidepool coord: the dashboard at {addr} is reachable from other machines, \
                     and anyone who reaches it can read the applications' names and figures; bind \
                     127.0.0.1 unless that is meant"
                );
            }
            let bound = coord
                .serve_http(addr)
                .with_context(|| format!("cannot serve HTTP at {addr}"))?;
            format!(
                "; dashboard at http://{bound}/, changes there need the token in {}",
                coord.token_file().display()
            )
        }
        None => String::new(),
    };
    // The first line names the socket and the dashboard: scripts and `tidepool bench` read it.
    println!(
        "tidepool coord listening on {} (policy {}, reserve {}{}){http}",
        socket.display(),
        a.policy,
        format_size(a.reserve),
        a.max
            .map(|m| format!(", at most {}", format_size(m)))
            .unwrap_or_default(),
    );
    println!(
        "soft-memory programs join when started with TIDEPOOL_COORD={}",
        socket.display()
    );
    std::io::stdout().flush()?;
    let signal = tidepool_sys::wait_for_stop()?;
    eprintln!(
        "tidepool coord: {signal}: stopping; {} applications were joined",
        coord.snapshot().apps.len()
    );
    drop(coord); // removes the token file it made
    let _ = std::fs::remove_file(&socket);
    eprintln!("tidepool coord: stopped ({} removed)", socket.display());
    Ok(())
}

/// Reads a coordinator's state over HTTP.
pub fn fetch(addr: &str) -> Result<Snapshot> {
    let url = format!("http://{addr}/api/state");
    let body = ureq::get(&url)
        .timeout(Duration::from_secs(5))
        .call()
        .with_context(|| {
            format!("cannot reach the coordinator at {url} (is `tidepool coord --http {addr}` running?)")
        })?
        .into_string()?;
    serde_json::from_str(&body).context("the coordinator's state did not parse")
}

pub fn top(addr: &str, once: bool) -> Result<()> {
    loop {
        let s = fetch(addr)?;
        let mut out = String::new();
        if !once {
            out.push_str("\x1b[H\x1b[2J");
        }
        out.push_str(&render(&s));
        print!("{out}");
        std::io::stdout().flush()?;
        if once {
            return Ok(());
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// A name an application chose, fit for a terminal: control characters (escape sequences
/// start with one) and bidirectional overrides (which reorder what follows) become `?`.
pub fn as_text(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}') {
                '?'
            } else {
                c
            }
        })
        .collect()
}

fn mib(x: u64) -> String {
    format!("{:.0}", x as f64 / (1u64 << 20) as f64)
}

/// `tidepool top`'s screen: the pool, a line per application, and their miss curves.
pub fn render(s: &Snapshot) -> String {
    let mut o = summary(s);
    push_apps(&mut o, s);
    if s.apps.is_empty() {
        o.push_str(
            "(no applications: start soft-memory programs with TIDEPOOL_COORD set, or programs \
             under `tidepool run`)\n",
        );
    } else {
        // The curves: what more memory would save each, as a share of its time.
        push_curves(&mut o, s);
    }
    o
}

/// The first lines: the policy, the pool and what is granted and held of it, the host.
fn summary(s: &Snapshot) -> String {
    format!(
        "tidepool coord · policy {} · up {:.0} s\n\
         idle pool {} MiB · granted {} · held {} · MemAvailable {} · reserve {} · pressure {:.1}% · \
         longest under reserve {:.0} ms · punched {} MiB\n\n",
        s.policy,
        s.seconds,
        mib(s.pool),
        mib(s.granted),
        mib(s.held),
        mib(s.mem_available),
        mib(s.reserve),
        100.0 * s.pressure,
        s.longest_below_reserve_ms,
        mib(s.punched_bytes)
    )
}

/// The table of applications: a header, then a line each.
fn push_apps(o: &mut String, s: &Snapshot) {
    o.push_str(&format!(
        "{:>4} {:<20} {:<5} {:>8} {:>6} {:>10} {:>10} {:>6} {:>10} {:>8} {:>9} {:>12}\n",
        "id",
        "application",
        "kind",
        "pid",
        "weight",
        "budget MiB",
        "held MiB",
        "hit",
        "misses/s",
        "miss us",
        "missing",
        "utility/MiB"
    ));
    for a in &s.apps {
        // A paged program's hits are not seen (they are plain memory accesses).
        let hit = if a.kind == "paged" {
            "-".to_string()
        } else {
            format!("{:.3}", a.hit_rate)
        };
        o.push_str(&format!(
            "{:>4} {:<20} {:<5} {:>8} {:>6.2} {:>10} {:>10} {:>6} {:>10.0} {:>8.1} {:>8.1}% {:>12.4}\n",
            a.id,
            as_text(&a.name).chars().take(20).collect::<String>(),
            a.kind,
            a.pid,
            a.weight,
            mib(a.budget),
            mib(a.held),
            hit,
            a.reads_per_s * (1.0 - a.hit_rate),
            a.miss_us,
            100.0 * a.rebuild_share,
            a.utility_per_mib
        ));
    }
}

/// The miss curves' table: per application, the share of its time 4 MiB to 4 GiB more
/// would save.
fn push_curves(o: &mut String, s: &Snapshot) {
    const AT: [u64; 6] = [4, 16, 64, 256, 1024, 4096];
    o.push_str("\nmiss curves: share of time more memory would save\n");
    o.push_str(&format!("{:>4} {:<20}", "id", "application"));
    for x in AT {
        o.push_str(&format!(
            " {:>8}",
            format!("+{}", tidepool_node::format_size(x << 20))
        ));
    }
    o.push('\n');
    for a in &s.apps {
        o.push_str(&format!(
            "{:>4} {:<20}",
            a.id,
            as_text(&a.name).chars().take(20).collect::<String>()
        ));
        for x in AT {
            let saved = a
                .curve
                .iter()
                .take_while(|p| p.extra_mib <= x)
                .last()
                .map_or(0.0, |p| p.saved_ms_per_s / 10.0);
            o.push_str(&format!(" {:>7.1}%", saved));
        }
        o.push('\n');
    }
}

/// Where `tidepool weight` sends the change.
pub enum WeightVia {
    /// The coordinator's socket: the kernel tells it who asks.
    Socket(PathBuf),
    /// Its HTTP address, with the token read from a file.
    Http { addr: String, token_file: PathBuf },
}

/// `tidepool weight`: changes an application's weight.
pub fn set_weight(via: WeightVia, app: u32, weight: f64) -> Result<()> {
    use tidepool_proto::coord::{FromCoord, ToCoord, MAX_MESSAGE};
    let (addr, token_file) = match via {
        WeightVia::Socket(path) => {
            let ch = tidepool_soft::coord::Channel::connect(&path).with_context(|| {
                format!(
                    "cannot reach the coordinator at {} (is `tidepool coord` running, as you or \
                     with --group for you?)",
                    path.display()
                )
            })?;
            ch.send(&ToCoord::SetWeight { app, weight }.encode())?;
            let mut buf = vec![0u8; MAX_MESSAGE];
            let n = match ch.recv(&mut buf, Some(Duration::from_secs(5)))? {
                Some((n, _)) => n,
                None => anyhow::bail!("the coordinator did not answer within 5 s"),
            };
            return match FromCoord::decode(&buf[..n])? {
                FromCoord::Weight { .. } => Ok(()),
                FromCoord::Error { message } => anyhow::bail!("{}", as_text(&message)),
                other => anyhow::bail!("unexpected answer from the coordinator: {other:?}"),
            };
        }
        WeightVia::Http { addr, token_file } => (addr, token_file),
    };
    let token = std::fs::read_to_string(&token_file)
        .with_context(|| {
            format!(
                "cannot read the coordinator's token from {} (pass --token-file)",
                token_file.display()
            )
        })?
        .trim()
        .to_string();
    let url = format!("http://{addr}/api/apps/{app}/weight");
    match ureq::post(&url)
        .timeout(Duration::from_secs(5))
        .set("Authorization", &format!("Bearer {token}"))
        .send_json(serde_json::json!({ "weight": weight }))
    {
        Ok(_) => Ok(()),
        Err(ureq::Error::Status(code, r)) => {
            anyhow::bail!("{code}: {}", r.into_string().unwrap_or_default().trim())
        }
        Err(e) => Err(e).with_context(|| format!("cannot reach the coordinator at {url}")),
    }
}

#[cfg(test)]
mod tests {
    use super::as_text;

    #[test]
    fn names_lose_escape_sequences_and_direction_overrides() {
        assert_eq!(as_text("web-1 café"), "web-1 café");
        assert_eq!(as_text("a\x1b[2Jb\x07"), "a?[2Jb?");
        assert_eq!(as_text("x\u{202e}gpj.exe\u{9b}"), "x?gpj.exe?");
    }
}
