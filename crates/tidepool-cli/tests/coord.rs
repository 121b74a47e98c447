//! `tidepool coord` as a user runs it: a real daemon, real application processes that join
//! through TIDEPOOL_COORD, the JSON API, Prometheus metrics, `tidepool top`, weights changed
//! at run time, an application killed with SIGKILL, and the dashboard rendered by headless
//! Chromium with live data.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};
use tidepool_bench::job::{AppJob, Job};

const EXE: &str = env!("CARGO_BIN_EXE_tidepool");

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Coord {
    _proc: Proc,
    _out: BufReader<ChildStdout>,
    http: String,
    socket: std::path::PathBuf,
    /// The coordinator's directory: its socket and its token file.
    dir: std::path::PathBuf,
}

impl Drop for Coord {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Coord {
    fn token_file(&self) -> std::path::PathBuf {
        self.dir.join("coord.token")
    }
}

fn coord(name: &str, args: &[&str]) -> Coord {
    let dir = std::env::temp_dir().join(format!("tp-cli-coord-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let socket = dir.join("coord.sock");
    let mut child = Command::new(EXE)
        .args([
            "coord",
            "--http",
            "127.0.0.1:0",
            "--reserve",
            "0",
            "--floor",
            "4M",
        ])
        .arg("--socket")
        .arg(&socket)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start tidepool coord");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let http = common::dashboard_addr(&line);
    Coord {
        _proc: Proc(child),
        _out: out,
        http,
        socket,
        dir,
    }
}

/// The arguments of a synthetic soft-memory application: `objects` objects requested with
/// Zipf skew 0.99, each rebuilt in `rebuild_us` on a miss, for `seconds`.
fn app_job(name: &str, objects: u64, rebuild_us: f64, seconds: f64) -> [String; 2] {
    Job::CoordApp(AppJob {
        name: name.into(),
        objects,
        skew: 0.99,
        rebuild_us,
        work_us: 5.0,
        seconds,
        budget: 0,
        seed: 1,
    })
    .args()
}

/// A synthetic soft-memory application joining the coordinator.
fn app(c: &Coord, name: &str, rebuild_us: f64, seconds: f64) -> Proc {
    let child = Command::new(EXE)
        .args(app_job(name, 8192, rebuild_us, seconds))
        .env("TIDEPOOL_COORD", &c.socket)
        .env("TIDEPOOL_APP", name)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .spawn()
        .expect("start an application");
    Proc(child)
}

fn state(c: &Coord) -> serde_json::Value {
    let body = ureq::get(&format!("http://{}/api/state", c.http))
        .call()
        .expect("GET /api/state")
        .into_string()
        .unwrap();
    serde_json::from_str(&body).unwrap()
}

fn find<'a>(s: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    s["apps"].as_array()?.iter().find(|a| a["name"] == name)
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn tidepool(args: &[&str]) -> String {
    let out = Command::new(EXE).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "tidepool {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn applications_join_are_watched_and_a_killed_one_frees_its_budget() {
    let c = coord("join", &["--max", "48M", "--epoch-ms", "100"]);
    let mut cheap = app(&c, "cheap", 1.0, 60.0);
    let _dear = app(&c, "dear", 100.0, 60.0);
    wait_for("both applications", || {
        let s = state(&c);
        find(&s, "cheap").is_some() && find(&s, "dear").is_some()
    });
    let s = state(&c);
    let budget = |s: &serde_json::Value, n| find(s, n).unwrap()["budget"].as_u64().unwrap();
    assert!(budget(&s, "cheap") + budget(&s, "dear") <= 48 << 20, "{s}");
    // Each fills its share (8192 objects of 4 KiB are 32 MiB, more than 24).
    wait_for("soft memory to be used", || {
        let s = state(&c);
        find(&s, "dear").unwrap()["held"].as_u64().unwrap() >= 16 << 20
    });
    let top = tidepool(&["top", "--once", "--http", &c.http]);
    assert!(top.contains("cheap") && top.contains("dear"), "{top}");
    let metrics = ureq::get(&format!("http://{}/metrics", c.http))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    for m in [
        "tidepool_coord_app_budget_bytes{app=\"dear\"",
        "tidepool_coord_app_hits_total{app=\"dear\"",
        "# TYPE tidepool_coord_reclaim_duration_seconds histogram",
        "tidepool_build_info{version=",
    ] {
        assert!(metrics.contains(m), "no {m} in {metrics}");
    }
    // The operator doubles an application's weight, over HTTP with the token, and over the
    // socket.
    let id = find(&state(&c), "dear").unwrap()["id"].as_u64().unwrap();
    let token = c.token_file();
    let token = token.to_str().unwrap();
    tidepool(&[
        "weight",
        &id.to_string(),
        "2.5",
        "--http",
        &c.http,
        "--token-file",
        token,
    ]);
    assert_eq!(find(&state(&c), "dear").unwrap()["weight"], 2.5);
    tidepool(&[
        "weight",
        &id.to_string(),
        "3",
        "--socket",
        c.socket.to_str().unwrap(),
    ]);
    assert_eq!(find(&state(&c), "dear").unwrap()["weight"], 3.0);
    let err = Command::new(EXE)
        .args([
            "weight",
            "999",
            "2",
            "--http",
            &c.http,
            "--token-file",
            token,
        ])
        .output()
        .unwrap();
    assert!(
        !err.status.success()
            && String::from_utf8_lossy(&err.stderr).contains("no application 999")
    );
    // A crash: the budget is free at once, and the one that wants more gets it.
    let before = budget(&state(&c), "dear");
    cheap.0.kill().unwrap();
    cheap.0.wait().unwrap();
    wait_for("the dead application to leave", || {
        find(&state(&c), "cheap").is_none()
    });
    wait_for("its budget to go to the other", || {
        budget(&state(&c), "dear") > before
    });
}

/// The uid tests run others as (nobody).
const OTHER: u32 = 65534;

/// `tidepool weight` run as another user.
fn weight_as(uid: u32, socket: &std::path::Path, app: u64) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    Command::new(EXE)
        .args(["weight", &app.to_string(), "9", "--socket"])
        .arg(socket)
        .uid(uid)
        .gid(uid)
        .output()
        .unwrap()
}

fn mode(p: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn another_user_cannot_steer_the_coordinator() {
    // It runs commands as uid OTHER.
    tidepool_sys::skip_unless!(tidepool_sys::probe::Need::Root);
    // Owner only: socket 0600 in a 0700 directory; another user cannot even connect.
    let c = coord("private", &["--max", "32M"]);
    assert_eq!(mode(&c.socket), 0o600);
    assert_eq!(mode(&c.dir), 0o700);
    assert_eq!(mode(&c.token_file()), 0o600);
    let _mine = app(&c, "mine", 5.0, 60.0);
    wait_for("the application", || find(&state(&c), "mine").is_some());
    let id = find(&state(&c), "mine").unwrap()["id"].as_u64().unwrap();
    let out = weight_as(OTHER, &c.socket, id);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("cannot reach"),
        "{err}"
    );
    assert!(err.contains("ermission denied"), "{err}");
    assert_eq!(find(&state(&c), "mine").unwrap()["weight"], 1.0);

    // With a group, its members join and change their own registrations, not the owner's.
    let g = coord("group", &["--max", "32M", "--group", &OTHER.to_string()]);
    assert_eq!(mode(&g.socket), 0o660);
    assert_eq!(mode(&g.dir), 0o750);
    let _root_app = app(&g, "owners", 5.0, 60.0);
    let _their_app = {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(EXE);
        cmd.args(app_job("theirs", 1024, 5.0, 60.0))
            .env("TIDEPOOL_COORD", &g.socket)
            .env("TIDEPOOL_APP", "theirs")
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .uid(OTHER)
            .gid(OTHER);
        Proc(cmd.spawn().unwrap())
    };
    wait_for("both applications", || {
        let s = state(&g);
        find(&s, "owners").is_some() && find(&s, "theirs").is_some()
    });
    let s = state(&g);
    let (owners, theirs) = (find(&s, "owners").unwrap(), find(&s, "theirs").unwrap());
    assert_eq!(theirs["uid"], OTHER, "the uid is the kernel's: {s}");
    let out = weight_as(OTHER, &g.socket, owners["id"].as_u64().unwrap());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(&format!("refused: uid {OTHER}")),
        "{err}"
    );
    let out = weight_as(OTHER, &g.socket, theirs["id"].as_u64().unwrap());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = state(&g);
    assert_eq!(find(&s, "owners").unwrap()["weight"], 1.0);
    assert_eq!(find(&s, "theirs").unwrap()["weight"], 9.0);
}

#[test]
fn weight_changes_over_http_need_the_token() {
    let c = coord("token", &["--max", "32M"]);
    let _a = app(&c, "a", 5.0, 60.0);
    wait_for("the application", || find(&state(&c), "a").is_some());
    let id = find(&state(&c), "a").unwrap()["id"].as_u64().unwrap();
    let url = format!("http://{}/api/apps/{id}/weight", c.http);
    let post = |auth: Option<&str>| {
        let mut r = ureq::post(&url);
        if let Some(a) = auth {
            r = r.set("Authorization", a);
        }
        match r.send_json(serde_json::json!({ "weight": 4.0 })) {
            Ok(r) => r.status(),
            Err(ureq::Error::Status(code, _)) => code,
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(post(None), 401);
    assert_eq!(post(Some("Bearer 0000000000000000000000")), 401);
    let max = ureq::post(&format!("http://{}/api/max", c.http))
        .send_json(serde_json::json!({ "bytes": 1 }));
    assert!(matches!(max, Err(ureq::Error::Status(401, _))));
    assert_eq!(find(&state(&c), "a").unwrap()["weight"], 1.0);
    let token = std::fs::read_to_string(c.token_file()).unwrap();
    assert_eq!(post(Some(&format!("Bearer {}", token.trim()))), 200);
    assert_eq!(find(&state(&c), "a").unwrap()["weight"], 4.0);
}

/// Chromium, if this machine has it (scripts/setup installs it).
fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|b| {
            Command::new(b)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
}

#[test]
fn headless_chromium_renders_the_dashboard_with_live_charts() {
    let browser = chromium().expect(
        "no Chromium on this machine: scripts/setup installs it (apt-get install chromium)",
    );
    let c = coord("dash", &["--max", "32M", "--epoch-ms", "100"]);
    let _a = app(&c, "charted", 20.0, 60.0);
    wait_for("history to build up", || {
        let s = state(&c);
        find(&s, "charted").is_some_and(|a| a["held"].as_u64().unwrap() > 0)
            && s["seconds"].as_f64().unwrap() > 3.0
    });
    let url = format!("http://{}/", c.http);
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let shot = dir.join("coord-dashboard.png");
    let _ = std::fs::remove_file(&shot);
    let common = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--window-size=1400,1000",
        "--virtual-time-budget=4000",
    ];
    let dom = Command::new(browser)
        .args(common)
        .arg("--dump-dom")
        .arg(&url)
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&dom.stdout);
    // The page fetched the history and drew it: dygraphs made its canvases, the script
    // recorded how many samples the idle chart holds, and the table names the application.
    let samples: usize = dom
        .split("data-samples=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("the dashboard did not render its charts: {dom}"));
    assert!(samples > 1, "the idle chart has {samples} samples");
    assert!(dom.matches("<canvas").count() >= 4, "four charts drawn");
    assert!(dom.contains("charted #"), "the application's row");
    let out = Command::new(browser)
        .args(common)
        .arg(format!("--screenshot={}", shot.display()))
        .arg(&url)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let png = std::fs::read(&shot).expect("a screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 20_000,
        "{} bytes",
        png.len()
    );
    eprintln!("dashboard screenshot: {}", shot.display());
}

/// Names are the applications' own: the dashboard shows them as text (no element or script of
/// theirs reaches the DOM), every response carries a strict Content-Security-Policy, and `top`
/// prints no terminal escape sequence from them.
#[test]
fn hostile_application_names_stay_text_in_the_dashboard_and_in_top() {
    let browser = chromium().expect(
        "no Chromium on this machine: scripts/setup installs it (apt-get install chromium)",
    );
    let c = coord("hostile", &["--max", "32M", "--epoch-ms", "100"]);
    let img = "<img src=x onerror=\"document.title='pwned-img'\">";
    let script = "<script>document.title='pwned-script'</script>";
    let escape = "evil\x1b]0;pwned\x07\x1b[2J";
    let _apps: Vec<Proc> = [img, script, escape]
        .iter()
        .map(|n| app(&c, n, 20.0, 60.0))
        .collect();
    // The coordinator keeps names with control characters as `?` (so do its logs).
    let shown = |n: &str| n.replace(|c: char| c.is_control(), "?");
    wait_for("the three applications", || {
        let s = state(&c);
        [img, script, escape]
            .iter()
            .all(|n| find(&s, &shown(n)).is_some())
    });
    let res = ureq::get(&format!("http://{}/", c.http)).call().unwrap();
    let csp = res.header("content-security-policy").unwrap_or_default();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-eval"),
        "{csp}"
    );
    let dom = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--window-size=1400,1000",
            "--virtual-time-budget=4000",
            "--dump-dom",
        ])
        .arg(format!("http://{}/", c.http))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert!(dom.contains("data-samples="), "the page did not run: {dom}");
    assert!(!dom.contains("<img"), "an element from a name: {dom}");
    assert!(
        !dom.contains("<script>document.title"),
        "a script from a name: {dom}"
    );
    assert!(dom.contains("<title>tidepool coord</title>"), "{dom}");
    // The names are there, as text.
    assert!(dom.contains("&lt;img src=x onerror="), "{dom}");
    assert!(dom.contains("&lt;script&gt;document.title"), "{dom}");

    let top = tidepool(&["top", "--once", "--http", &c.http]);
    assert!(!top.contains('\x1b') && !top.contains('\x07'), "{top:?}");
    assert!(top.contains("evil?]0;pwned??[2J"), "{top:?}");
}

/// `tidepool cache` joins like any soft application: it shows on the dashboard's state and in
/// the coordinator's metrics, its items fill the budget it is given, and its own `--metrics`
/// serve the `stats` counters.
#[test]
fn a_cache_server_joins_and_shows_in_the_coordinator_and_its_own_metrics() {
    let c = coord("cache", &["--max", "64M", "--epoch-ms", "100"]);
    let mut child = Command::new(EXE)
        .args(["cache", "--listen", "127.0.0.1:0", "--threads", "2"])
        .args(["--metrics", "127.0.0.1:0", "--name", "memcache-1"])
        .arg("--coord")
        .arg(&c.socket)
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start tidepool cache");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let _proc = Proc(child);
    let mut said = String::new();
    for _ in 0..3 {
        out.read_line(&mut said).unwrap();
    }
    let addr = said
        .split_whitespace()
        .find(|w| w.starts_with("127.0.0.1:"))
        .unwrap()
        .to_string();
    assert!(said.contains("sized by the coordinator"), "{said}");
    let metrics_url = said
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no metrics address in {said:?}"))
        .to_string();
    wait_for("the cache to join", || {
        find(&state(&c), "memcache-1").is_some()
    });
    // 24 MiB of values.
    tidepool_bench::cache::load::fill(addr.parse().unwrap(), 0..24_576).unwrap();
    wait_for("its items to hold soft memory", || {
        let st = state(&c);
        let a = find(&st, "memcache-1").unwrap();
        a["held"].as_u64().unwrap() >= 16 << 20 && a["kind"] == "soft"
    });
    let coord_metrics = ureq::get(&format!("http://{}/metrics", c.http))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    assert!(
        coord_metrics.contains("tidepool_coord_app_budget_bytes{app=\"memcache-1\""),
        "{coord_metrics}"
    );
    let own = ureq::get(&metrics_url)
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    assert!(
        own.contains("tidepool_cache_total_items_total 24576"),
        "{own}"
    );
    assert!(
        own.contains("# TYPE tidepool_cache_curr_items gauge"),
        "{own}"
    );
}
