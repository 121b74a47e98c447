//! The Grafana dashboard and the Prometheus alerting rules in `deploy/` against live servers:
//! every series a panel, a template variable or a rule queries is one that a running
//! `tidepool node` and `tidepool coord` export (`up` aside: Prometheus makes it), every panel
//! takes its data source from the dashboard's `${datasource}` variable, every alert says what
//! is wrong and waits before firing, and promtool accepts the rules and passes their unit tests.

mod common;

use bytes::Bytes;
use common::{output_within, NodeProc};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tidepool_bench::job::{AppJob, Job};
use tidepool_store::NodeClient;
use yaml_rust2::{Yaml, YamlLoader};

const EXE: &str = env!("CARGO_BIN_EXE_tidepool");
/// How long a server may take to start, answer or show a joined application.
const DEADLINE: Duration = Duration::from_secs(30);
/// What Prometheus makes itself for every target it scrapes.
const MADE_BY_PROMETHEUS: &[&str] = &["up"];

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn get(url: &str) -> String {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(10))
        .build()
        .get(url)
        .call()
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .into_string()
        .unwrap()
}

/// The names of the samples in Prometheus text (histograms' `_bucket`, `_sum`, `_count`,
/// counters' `_total` as they are served).
fn sample_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.split(['{', ' ']).next().unwrap().to_string())
        .collect()
}

/// A memory node with a tenant that put, got and freed objects, and a hello refused.
fn node_series() -> BTreeSet<String> {
    let dir = std::env::temp_dir().join(format!("tp-dashboards-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tokens = dir.join("tokens.toml");
    std::fs::write(
        &tokens,
        "[[tenant]]\nname = \"web\"\ntoken = \"s3cret\"\nquota = \"8M\"\n",
    )
    .unwrap();
    let node = NodeProc::start(&[
        "--capacity",
        "64M",
        "--tokens",
        tokens.to_str().unwrap(),
        "--metrics",
        "127.0.0.1:0",
    ]);
    assert!(NodeClient::connect(&node.addr, "web", "wrong").is_err());
    let c = NodeClient::connect(&node.addr, "web", "s3cret").unwrap();
    let data = Bytes::from(vec![7u8; 4096]);
    let handles: Vec<_> = (0..4).map(|_| c.put(data.clone()).unwrap()).collect();
    for h in &handles {
        assert_eq!(c.get(*h).unwrap(), data);
    }
    c.free(handles[0]).unwrap();
    assert!(
        c.get(handles[0]).is_err(),
        "a freed object's handle is stale"
    );
    let text = get(&node.metrics_url());
    let _ = std::fs::remove_dir_all(&dir);
    sample_names(&text)
}

/// A coordinator with one soft-memory application joined.
fn coord_series() -> BTreeSet<String> {
    let dir = std::env::temp_dir().join(format!("tp-dashboards-coord-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let socket = dir.join("coord.sock");
    let mut child = Command::new(EXE)
        .args(["coord", "--http", "127.0.0.1:0", "--reserve", "0"])
        .args(["--floor", "4M", "--max", "16M", "--epoch-ms", "100"])
        .arg("--socket")
        .arg(&socket)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start tidepool coord");
    let out = child.stdout.take().unwrap();
    let coord = Proc(child);
    let line = first_line(out);
    let http = common::dashboard_addr(&line);
    let job = Job::CoordApp(AppJob {
        name: "web".into(),
        objects: 8192,
        skew: 0.99,
        rebuild_us: 10.0,
        work_us: 5.0,
        seconds: 60.0,
        budget: 0,
        seed: 1,
    });
    let app = Proc(
        Command::new(EXE)
            .args(job.args())
            .env("TIDEPOOL_COORD", &socket)
            .env("TIDEPOOL_APP", "web")
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .spawn()
            .expect("start an application"),
    );
    let url = format!("http://{http}/metrics");
    let started = Instant::now();
    let text = loop {
        let text = get(&url);
        if text.contains("tidepool_coord_app_budget_bytes{app=\"web\"") {
            break text;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the application never joined:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    drop((app, coord));
    let _ = std::fs::remove_dir_all(&dir);
    sample_names(&text)
}

/// The first line a server prints, within the deadline.
fn first_line(out: std::process::ChildStdout) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(out);
        let mut line = String::new();
        let _ = reader.read_line(&mut line);
        let _ = tx.send(line);
        // Keep the pipe open (a server writing to a closed pipe would die of SIGPIPE).
        let _ = std::io::copy(&mut reader, &mut std::io::sink());
    });
    rx.recv_timeout(DEADLINE)
        .expect("the server said nothing within the deadline")
}

/// Where a query is (file and panel, variable or rule), and the query.
type Query = (String, String);

fn dashboards() -> Vec<(PathBuf, Value)> {
    files(&deploy().join("grafana"), ".json")
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            let json = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{} is not valid JSON: {e}", p.display()));
            (p, json)
        })
        .collect()
}

/// The files in `dir` whose names end in `suffix`, in order.
fn files(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no *{suffix} in {}", dir.display());
    out
}

/// Every panel of a dashboard, those inside rows included.
fn panels(dash: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for p in list.as_array().into_iter().flatten() {
            out.push(p);
            walk(&p["panels"], out);
        }
    }
    let mut out = vec![];
    walk(&dash["panels"], &mut out);
    out
}

/// Every panel target's and template variable's query, with where it is.
fn dashboard_queries() -> Vec<Query> {
    let mut out = vec![];
    for (path, dash) in dashboards() {
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        for p in panels(&dash) {
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"].as_str().unwrap_or_else(|| {
                    panic!("{file}: panel {:?} has a target without expr", p["title"])
                });
                out.push((format!("{file}: panel {}", p["title"]), expr.to_string()));
            }
        }
        for v in dash["templating"]["list"].as_array().into_iter().flatten() {
            if v["type"] != "query" {
                continue;
            }
            let query = v["query"]
                .as_str()
                .or_else(|| v["query"]["query"].as_str())
                .unwrap_or_else(|| panic!("{file}: variable {} has no query", v["name"]));
            if let Some(expr) = variable_expr(query) {
                out.push((format!("{file}: variable {}", v["name"]), expr));
            }
        }
    }
    out
}

/// The PromQL inside a Grafana template query: `label_values(EXPR, LABEL)` gives EXPR,
/// `query_result(EXPR)` EXPR; `label_values(LABEL)` and `label_names()` query no series.
fn variable_expr(query: &str) -> Option<String> {
    let query = query.trim();
    if let Some(args) = query
        .strip_prefix("label_values(")
        .and_then(|r| r.strip_suffix(')'))
    {
        return args
            .rsplit_once(',')
            .map(|(expr, _)| expr.trim().to_string());
    }
    if let Some(expr) = query
        .strip_prefix("query_result(")
        .and_then(|r| r.strip_suffix(')'))
    {
        return Some(expr.to_string());
    }
    assert!(
        query.starts_with("label_names("),
        "a template query this test cannot read: {query:?}"
    );
    None
}

fn yaml(path: &Path) -> Yaml {
    let text = std::fs::read_to_string(path).unwrap();
    let mut docs = YamlLoader::load_from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not valid YAML: {e}", path.display()));
    assert_eq!(docs.len(), 1, "{}: one document", path.display());
    docs.remove(0)
}

/// The rule files in deploy/prometheus (their unit tests, `*.test.yml`, aside).
fn rule_files() -> Vec<PathBuf> {
    files(&deploy().join("prometheus"), ".yml")
        .into_iter()
        .filter(|p| !p.to_string_lossy().ends_with(".test.yml"))
        .collect()
}

/// Every rule of every rule file, with where it is.
fn rules() -> Vec<(String, Yaml)> {
    let mut out = vec![];
    for path in rule_files() {
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let doc = yaml(&path);
        let groups = doc["groups"]
            .as_vec()
            .unwrap_or_else(|| panic!("{file}: no groups"));
        for g in groups {
            for r in g["rules"].as_vec().into_iter().flatten() {
                let name = r["alert"].as_str().or(r["record"].as_str()).unwrap_or("?");
                out.push((format!("{file}: {name}"), r.clone()));
            }
        }
    }
    out
}

/// The series the unit tests feed the rules, with where each is.
fn test_input_series() -> Vec<Query> {
    let mut out = vec![];
    for path in files(&deploy().join("prometheus"), ".test.yml") {
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        for t in yaml(&path)["tests"].as_vec().into_iter().flatten() {
            for s in t["input_series"].as_vec().into_iter().flatten() {
                let series = s["series"].as_str().unwrap().to_string();
                out.push((format!("{file}: input series"), series));
            }
        }
    }
    out
}

/// PromQL words that are never metric names: aggregations, keywords, and constants.
const NOT_METRICS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
    "and",
    "or",
    "unless",
    "atan2",
    "bool",
    "offset",
    "inf",
    "nan",
];

/// Keywords followed by a list of label names in parentheses.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// The metric names a PromQL expression refers to, in order: identifiers that are not
/// functions (followed by `(`), keywords or aggregations; not label names (inside `{}` or
/// after `by`, `without`, `on`, `ignoring`, `group_left`, `group_right`), strings, numbers,
/// durations (inside `[]` or after `offset`) or Grafana variables (`$name`).
fn metric_names(expr: &str) -> Vec<String> {
    let s: Vec<char> = expr.chars().collect();
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = vec![];
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&s, i);
        } else if c == '{' {
            i = skip_to(&s, i, '}');
        } else if c == '[' {
            i = skip_to(&s, i, ']');
        } else if c == '#' {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
        } else if c.is_ascii_digit() || (c == '.' && s.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            // A number or a duration: 0.99, 1e6, 0x1f, 5m, 1h30m.
            i += 1;
            while i < s.len() && (ident(s[i]) || s[i] == '.') {
                i += 1;
            }
        } else if c == '$' || c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            i += 1;
            while i < s.len() && ident(s[i]) {
                i += 1;
            }
            let word: String = s[start..i].iter().collect();
            let mut next = i;
            while next < s.len() && s[next].is_whitespace() {
                next += 1;
            }
            let call = s.get(next) == Some(&'(');
            // Keywords are case-insensitive, metric names are not.
            let keyword = word.to_lowercase();
            if LABEL_LISTS.contains(&keyword.as_str()) {
                if call {
                    i = skip_to(&s, next, ')');
                }
            } else if !(call || c == '$' || NOT_METRICS.contains(&keyword.as_str())) {
                names.push(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// The index after the string that opens at `i` (backslash escapes, except in backticks).
fn skip_string(s: &[char], i: usize) -> usize {
    let quote = s[i];
    let mut j = i + 1;
    while j < s.len() && s[j] != quote {
        if s[j] == '\\' && quote != '`' {
            j += 1;
        }
        j += 1;
    }
    j + 1
}

/// The index after the `close` that ends what opens at `i`, strings inside skipped.
fn skip_to(s: &[char], i: usize, close: char) -> usize {
    let mut j = i + 1;
    while j < s.len() && s[j] != close {
        if matches!(s[j], '"' | '\'' | '`') {
            j = skip_string(s, j);
        } else {
            j += 1;
        }
    }
    j + 1
}

#[test]
fn metric_names_are_told_from_functions_labels_strings_and_durations() {
    for (expr, want) in [
        ("up{job=\"tidepool-node\"} == 0", vec!["up"]),
        (
            "sum by (op) (rate(tidepool_node_requests_total{instance=~\"$node\"}[$__rate_interval])) > 0",
            vec!["tidepool_node_requests_total"],
        ),
        (
            "histogram_quantile(0.99, sum by (job, instance, le) (rate(a_bucket[5m]))) > 0.01",
            vec!["a_bucket"],
        ),
        (
            "(a + b) / on(instance) group_left(tenant) c > 0.9",
            vec!["a", "b", "c"],
        ),
        (
            "x > 1.1 * y and y > 0 unless z offset 1h30m",
            vec!["x", "y", "y", "z"],
        ),
        ("sum without (le) (a) or vector(1e6) or b @ 1609746000", vec!["a", "b"]),
        (
            "count(m{l=\"a}b\\\"c\"}) # a comment naming not_a_metric",
            vec!["m"],
        ),
        (
            "rate(s[5m:1m]) + label_replace(t, \"dst\", \"$1\", \"src\", \"(.*)\")",
            vec!["s", "t"],
        ),
        ("max(a:recorded:rate5m) by (instance)", vec!["a:recorded:rate5m"]),
        ("SUM(x) BY (y)", vec!["x"]),
    ] {
        assert_eq!(metric_names(expr), want, "{expr}");
    }
    assert_eq!(
        variable_expr("label_values(tidepool_node_capacity_bytes, instance)").as_deref(),
        Some("tidepool_node_capacity_bytes")
    );
    assert_eq!(variable_expr("label_values(instance)"), None);
    assert_eq!(
        with_variables_set("rate(a{i=~\"$node\",j=~\"${coord}\"}[$__rate_interval])"),
        "rate(a{i=~\".*\",j=~\".*\"}[5m])"
    );
}

#[test]
fn every_dashboard_query_and_alert_names_a_series_live_servers_export() {
    let node = node_series();
    let coord = coord_series();
    let exported: BTreeSet<&str> = node.iter().chain(&coord).map(String::as_str).collect();
    let rules = rules();
    let recorded: BTreeSet<&str> = rules
        .iter()
        .filter_map(|(_, r)| r["record"].as_str())
        .collect();
    let mut queries = dashboard_queries();
    queries.extend(rules.iter().map(|(at, r)| {
        let expr = r["expr"]
            .as_str()
            .unwrap_or_else(|| panic!("{at}: no expr"));
        (at.clone(), expr.to_string())
    }));
    queries.extend(test_input_series());
    let mut used: BTreeMap<String, usize> = BTreeMap::new();
    let mut missing = vec![];
    for (at, expr) in &queries {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{at}: {expr:?} names no series");
        for name in names {
            let known = exported.contains(name.as_str())
                || recorded.contains(name.as_str())
                || MADE_BY_PROMETHEUS.contains(&name.as_str());
            if !known {
                missing.push(format!("{at}: {name} in {expr:?}"));
            }
            *used.entry(name).or_default() += 1;
        }
    }
    assert!(
        missing.is_empty(),
        "series no live server exports:\n{}\n\nthe node exports: {node:?}\nthe coordinator \
         exports: {coord:?}",
        missing.join("\n")
    );
    eprintln!(
        "{} queries name {} series, all exported:",
        queries.len(),
        used.len()
    );
    for (name, n) in &used {
        eprintln!("  {name} ({n})");
    }
    let unused: Vec<&&str> = exported
        .iter()
        .filter(|n| !used.contains_key(**n))
        .collect();
    eprintln!("exported but on no panel and in no rule: {unused:?}");
}

#[test]
fn every_panel_takes_its_data_source_from_the_template_variable() {
    for (path, dash) in dashboards() {
        let file = path.display();
        let vars = dash["templating"]["list"].as_array().unwrap();
        let ds = vars
            .iter()
            .find(|v| v["name"] == "datasource")
            .unwrap_or_else(|| panic!("{file}: no template variable `datasource`"));
        assert_eq!(ds["type"], "datasource", "{file}: {ds}");
        assert_eq!(ds["query"], "prometheus", "{file}: {ds}");
        let templated = |d: &Value| d["uid"] == "${datasource}" || d == "${datasource}";
        for v in vars.iter().filter(|v| v["type"] == "query") {
            assert!(templated(&v["datasource"]), "{file}: variable {v}");
        }
        let mut ids = BTreeSet::new();
        for p in panels(&dash) {
            let title = &p["title"];
            let id = p["id"]
                .as_u64()
                .unwrap_or_else(|| panic!("{file}: {title} has no id"));
            assert!(ids.insert(id), "{file}: two panels have id {id}");
            assert!(
                p["gridPos"]["w"].as_u64().is_some(),
                "{file}: {title} has no gridPos"
            );
            if p["type"] == "row" {
                continue;
            }
            assert!(
                templated(&p["datasource"]),
                "{file}: panel {title}: {}",
                p["datasource"]
            );
            let targets = p["targets"].as_array();
            assert!(
                targets.is_some_and(|t| !t.is_empty()),
                "{file}: {title} queries nothing"
            );
            for t in targets.into_iter().flatten() {
                assert!(
                    t.get("datasource").is_none_or(templated),
                    "{file}: panel {title}: target {t}"
                );
            }
        }
    }
}

#[test]
fn every_alert_waits_has_a_severity_and_says_what_is_wrong() {
    let rules = rules();
    assert!(!rules.is_empty());
    let mut names = BTreeSet::new();
    for (at, r) in rules.iter().filter(|(_, r)| r["alert"].as_str().is_some()) {
        assert!(
            names.insert(r["alert"].as_str().unwrap()),
            "{at}: a second alert of that name"
        );
        assert!(
            r["for"].as_str().is_some(),
            "{at}: no `for:`: one bad scrape would page"
        );
        let severity = r["labels"]["severity"].as_str();
        assert!(
            matches!(severity, Some("critical" | "warning" | "info")),
            "{at}: severity {severity:?}"
        );
        for a in ["summary", "description"] {
            let text = r["annotations"][a].as_str().unwrap_or("");
            assert!(!text.trim().is_empty(), "{at}: no {a} annotation");
        }
    }
}

/// promtool on PATH, if it is installed.
fn promtool() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("promtool"))
        .find(|p| p.is_file())
}

/// A Grafana query as Prometheus gets it: `$__rate_interval` and the other built-in intervals
/// as 5m, the dashboard's variables (`$node`, `${coord}`) as `.*`, what "All" sends.
fn with_variables_set(expr: &str) -> String {
    let mut out = String::new();
    let mut rest = expr;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, tail) = match after.strip_prefix('{') {
            Some(inner) => {
                let end = inner
                    .find('}')
                    .unwrap_or_else(|| panic!("unclosed ${{ in {expr}"));
                (&inner[..end], &inner[end + 1..])
            }
            None => {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                after.split_at(end)
            }
        };
        out.push_str(if name.starts_with("__") { "5m" } else { ".*" });
        rest = tail;
    }
    out.push_str(rest);
    out
}

/// Runs promtool with `args`, within a deadline, and fails the test with what it said unless
/// it succeeds.
fn promtool_ok(promtool: &Path, args: &[&std::ffi::OsStr], dir: &Path) {
    let out = output_within(
        Command::new(promtool).args(args).current_dir(dir),
        Duration::from_secs(60),
    );
    let (stdout, stderr) = common::text(&out);
    assert!(out.status.success(), "promtool {args:?}:\n{stdout}{stderr}");
    eprint!("promtool {args:?}:\n{stdout}{stderr}");
}

#[test]
fn promtool_parses_the_dashboard_queries_checks_the_rules_and_runs_their_tests() {
    let Some(promtool) = promtool() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "promtool is not installed: scripts/setup installs it (Debian's prometheus package)"
        );
        eprintln!("skipped: no promtool on PATH (scripts/setup installs it)");
        return;
    };
    let dir = deploy().join("prometheus");
    let os = |s: &'static str| std::ffi::OsStr::new(s);
    let mut check = vec![os("check"), os("rules")];
    let rule_files = rule_files();
    check.extend(rule_files.iter().map(|p| p.as_os_str()));
    promtool_ok(&promtool, &check, &dir);
    let tests = files(&dir, ".test.yml");
    let mut test = vec![os("test"), os("rules")];
    test.extend(tests.iter().map(|p| p.as_os_str()));
    promtool_ok(&promtool, &test, &dir);
    // Each dashboard query as a recording rule (JSON is YAML), for promtool to parse.
    let rules: Vec<Value> = dashboard_queries()
        .iter()
        .enumerate()
        .map(|(i, (_, expr))| {
            serde_json::json!({
                "record": format!("dashboard:query_{i}"),
                "expr": with_variables_set(expr),
            })
        })
        .collect();
    let queries = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("dashboard-queries-{}.yml", std::process::id()));
    let groups = serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]});
    std::fs::write(&queries, groups.to_string()).unwrap();
    promtool_ok(
        &promtool,
        &[os("check"), os("rules"), queries.as_os_str()],
        &dir,
    );
    let _ = std::fs::remove_file(&queries);
}
