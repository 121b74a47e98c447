//! `tidepool`: far and soft memory for Linux programs.
#![forbid(unsafe_code)]

mod cache;
mod coord;
mod demo;
mod doctor;
mod manual;
mod node;
mod run;
mod run_static;
mod tune;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;
use tidepool_node::parse_size;

#[derive(Parser, Debug)]
#[command(
    name = "tidepool",
    version,
    about = "Use memory you do not own locally: a shared memory node, far stores, benchmarks.",
    long_about = "Tidepool lets programs use memory they do not own locally: DRAM on a memory \
                  node that many compute processes share, or a far store (Redis, Redis Cluster, \
                  memcached, or in-process).\n\nStart here: `tidepool demo` runs a verified \
                  round trip on the embedded store and an embedded memory node, with nothing to \
                  set up.",
    after_help = "Logging: messages go to standard error; RUST_LOG sets how much (default \
                  `warn`; `info` shows servers' progress, `tidepool_node=debug` one crate in \
                  detail; syntax of tracing-subscriber's EnvFilter). Colours only on a terminal."
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run a memory node: one server whose memory many compute processes share.
    ///
    /// The node maps --capacity bytes once (reserved, not committed: memory becomes resident as
    /// objects arrive) and splits it into sections, each managed by its own allocator thread.
    /// Clients authenticate as a tenant; with --tokens only the tenants listed there may
    /// connect, each with its own token and quota. Everything a client put is freed when it
    /// disconnects.
    ///
    /// With --tls-cert and --tls-key it accepts only TLS connections (clients add ?tls=1 to
    /// their node:// URL). With --metrics ADDR it serves Prometheus metrics at
    /// http://ADDR/metrics.
    Node(node::NodeArgs),
    /// Print a far store's counters: the bytes it holds and the values it keeps, then its own
    /// (a memory node's for one tenant and for the node; the in-process store's bytes before
    /// compression, same-filled pages and pages kept whole).
    Stats {
        /// A store URL, e.g. node://tenant[:token]@host:port
        url: String,
    },
    /// Write, read back and verify data through a far store, and report the speed.
    ///
    /// Without --backend it runs on the embedded in-process store and on a memory node it starts
    /// inside this process: nothing to set up.
    Demo {
        /// A store URL: local: (in process, compressed), local:?compress=zstd|none, node://...,
        /// redis://..., redis+cluster://..., memcached://...
        #[arg(long)]
        backend: Option<String>,
        /// How much data to move.
        #[arg(long, default_value = "256M", value_parser = parse_size_arg)]
        size: u64,
    },
    /// Run an unmodified program with its heap in far memory.
    ///
    /// Everything the program allocates (malloc, C++ new, and its own private anonymous mmaps,
    /// such as CPython's object arenas) lives in a region paged over the far store, with at most
    /// --local bytes of it in local memory. The program must be dynamically linked: the pager
    /// comes in through LD_PRELOAD (libtidepool_preload.so, found next to this executable or
    /// named by TIDEPOOL_PRELOAD). Its exit status is tidepool's. If the far store becomes
    /// unreachable the program stops with status 70 and a message; it never reads zeros in
    /// place of its data. Programs it starts get pagers of their own, and a child forked without
    /// exec gets a pager of its own over a copy of its parent's memory. `tidepool resize PID
    /// SIZE` changes the budget while it runs.
    ///
    /// The pager may make a program slower; it never leaves it hanging: a page fault that
    /// waits longer than --fault-deadline (longer while a store that rides out failures, a
    /// Redis Cluster or a set of memory nodes, waits one out) stops the program with status 70
    /// and a message naming the cause (a silent store, say) and where each of the pager's
    /// threads is. The program becomes this process (exec), so signals sent
    /// to `tidepool run` reach it, and SIGTERM or Ctrl-C end it and what it forked as they would
    /// without the pager.
    ///
    /// Where evicted pages go, and what that saves this machine: the default, local:, keeps
    /// them compressed in the program's own process (LZ4; zero and same-filled pages as one
    /// word; pages that do not compress kept whole), as Linux keeps swapped pages in zram: the
    /// program holds --local plus its evicted pages' compressed size, and needs no server.
    /// local:?compress=zstd keeps less (CPython's strings: 0.6x the bytes) and can take twice
    /// the time. A memory node
    /// (node://) or Redis takes evicted pages off this machine: the program holds about
    /// --local. local:?compress=none keeps them whole in the process and saves nothing: it
    /// measures the pager alone.
    ///
    /// With any store but local:?compress=none, part of --local holds evicted
    /// pages on probation before they go to the store: a page the program still uses comes
    /// back for a fault, not a round trip. The part follows how often that happens, from a
    /// hundredth to a fifth (with local:, whose far reads cost little more than that fault, it
    /// stays at a hundredth); TIDEPOOL_RUN_PROBATION=0 turns it off.
    ///
    /// When the budget grows (the coordinator, `tidepool resize`, pressure ending), pages
    /// evicted earlier come back from the store in batches, hottest first, until the budget is
    /// nearly full, rather than one fault at a time; TIDEPOOL_RUN_REFILL=0 turns that off.
    ///
    /// A statically linked program (Go's default build, a static C or Rust binary) never
    /// loads that library: `tidepool` loads it into a process of its own that has one, and
    /// stays as its parent, passing on its exit status and the signals sent to `tidepool run`
    /// (Ctrl-C reaches the program from the terminal). Its memory system calls reach the pager
    /// through a seccomp filter; a fork without exec fails with ENOSYS (vfork and
    /// posix_spawn work). A program the pager cannot serve (set-user-ID/set-group-ID, for
    /// which the loader ignores LD_PRELOAD) is refused before it starts, unless
    /// --allow-unpaged.
    ///
    /// When a coordinator runs (`tidepool coord`, at its default socket or --coord), the
    /// program joins it: --local is where its budget starts, and the coordinator moves local
    /// memory between it and other programs and soft-memory applications, by what a byte
    /// saves each of them in miss time, within --min and --max, and takes it back when the
    /// host runs short. --no-coord keeps the budget fixed (`tidepool resize` still changes it).
    ///
    /// Example: tidepool run --local 256M --stats -- python3 script.py
    #[command(
        after_long_help = "Environment (every variable, with its default, is in the \
        README's table):\n  TIDEPOOL_PRELOAD        the preload library to load [default: \
        next to tidepool]\n  TIDEPOOL_COORD          the coordinator's socket [default: the \
        default socket, if one answers]\n  TIDEPOOL_TOKEN          a memory node's token when \
        the URL has none\n  TIDEPOOL_RUN_FAULT_DEADLINE  --fault-deadline's default\n\
        Passed on to the program from here, to compare or test:\n  TIDEPOOL_RUN_FRAMES, \
        TIDEPOOL_RUN_DROP_COPIES, TIDEPOOL_RUN_PROBATION, TIDEPOOL_RUN_REFILL, \
        TIDEPOOL_RUN_FOLLOW  =0 turns that part off\n  TIDEPOOL_RUN_SECTIONS_OUT  a directory \
        each process writes its sections to\n  TIDEPOOL_RUN_FAULT_TRACE  with it, record \
        this many demand faults there too (tidepool tune)\n  TIDEPOOL_RUN_STALL_AFTER  stop the fault \
        handlers after this many faults (tests of the watchdog)"
    )]
    Run {
        /// Local memory for the program's heap, e.g. 256M; the rest lives in far memory.
        #[arg(long, value_parser = parse_size_arg)]
        local: u64,
        /// Far store URL: local: (in this process, compressed with LZ4: the default;
        /// ?compress=zstd is smaller and slower, ?compress=none keeps pages whole and saves no
        /// memory),
        /// node://tenant[:token]@host:port
        /// (?tls=1[&ca=FILE] for TLS; several hosts, comma-separated, with ?replicas=R to keep
        /// each page on R of them), redis://host:port, rediss://host:port (TLS),
        /// redis+cluster://host:port,..., memcached://host:port.
        #[arg(long, default_value = "local:")]
        backend: String,
        #[command(flatten)]
        opts: run::RunOpts,
        /// Serve the program's sections as this profile says (`tidepool tune` writes one; see
        /// the section names `--stats` prints). A profile made for another program, or for
        /// another build of this one, is ignored with a message.
        #[arg(long, value_name = "FILE")]
        profile: Option<PathBuf>,
        #[command(flatten)]
        join: run::JoinArgs,
        /// The program and its arguments, after `--`.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        program: Vec<OsString>,
    },
    /// Change the local memory of a program running under `tidepool run`, without restarting it.
    ///
    /// Shrinking evicts at once; growing lets the program keep more of its heap local.
    Resize {
        /// The program's process id.
        pid: u32,
        /// The new local budget, e.g. 512M.
        #[arg(value_parser = parse_size_arg)]
        local: u64,
    },
    /// Add a memory node to the far store of a program running under `tidepool run`.
    ///
    /// The store must be a set of memory nodes (node://h1:p1,h2:p2,...). New writes may place
    /// pieces on the node, and values that lost a piece with a node that went down are stored
    /// again with all their pieces, the new node taking its share.
    AddNode {
        /// The program's process id.
        pid: u32,
        /// The node's address, host:port (a `tidepool node` already running).
        addr: String,
    },
    /// Choose cache sections from a profile (Mira's profile-guided tuning), for far data
    /// structures or for an unmodified program.
    ///
    /// For far data structures, PROFILE is the JSON a profiling run wrote
    /// (Far::enable_profiling, then Far::profile()). Streams get a small window of long lines
    /// fetched ahead; the rest of --budget goes, a slice at a time, to the site whose misses it
    /// saves most, from each site's miss-ratio curves at 64 B to 4 KiB lines. Prints the
    /// configuration as TOML (or writes it to --out) and, on stderr, why each site got what it
    /// got. Run the program with it, profile again and tune again until it stops getting
    /// faster.
    ///
    /// With a program after `--` (`tidepool tune --local SIZE -- PROGRAM ARGS`), tunes the
    /// pager's sections for that unmodified program instead: it runs the program under
    /// `tidepool run` a few times: once recording its faults with prefetching off, to search
    /// every prefetcher and line for each busy section offline against that trace (a section
    /// keeps a prefetcher only if 70% of what it fetched there was used), then rounds each
    /// trying a policy for every section that takes at
    /// least 1% of the far reads or prefetches (a stride, sweep or successor prefetcher of its
    /// own, none, a line of 2 or 4 pages), keeps what cut that section's misses, then tries
    /// keeping one busy section's pages longer or holding a section that reuses little of its
    /// room to a share of the budget, and prints a profile for `tidepool run --profile`. Tune on
    /// an input smaller than the one you will run; the program's output must be the same every
    /// run.
    #[command(
        after_long_help = "Environment: TIDEPOOL_PRELOAD, the preload library each \
        round's `tidepool run` loads [default: next to tidepool]."
    )]
    Tune(TuneArgs),
    /// Print the pager statistics of a program running under `tidepool run`.
    Status {
        /// The program's process id.
        pid: u32,
    },
    /// Run a benchmark suite side by side with its peers; writes SUITE.json and SUITE.png.
    #[command(after_long_help = "Environment (the README's table has them all): \
        TIDEPOOL_BENCH_SYSTEMS, TIDEPOOL_BENCH_WORKLOADS, TIDEPOOL_BENCH_RATIOS limit a run to \
        some systems, workloads, local ratios (comma-separated); TIDEPOOL_BENCH_PARTS, \
        TIDEPOOL_FAR_PARTS run some parts of the coord, cache and far suites; TIDEPOOL_BIN the \
        tidepool binary to start nodes and workers from; TIDEPOOL_PRELOAD the preload library; \
        TIDEPOOL_MIMALLOC_BENCH as --mimalloc-bench.")]
    Bench {
        /// Suite to run (`--list` shows them).
        #[arg(required_unless_present = "list")]
        suite: Option<String>,
        /// Finish within about a minute, with less data.
        #[arg(long)]
        quick: bool,
        /// Where to write SUITE.json and SUITE.png.
        #[arg(long, default_value = "bench-results")]
        out: PathBuf,
        /// List the suites.
        #[arg(long)]
        list: bool,
        /// Where servers and clients run, the same for every system: auto (latency workloads
        /// on one CPU, throughput workloads with servers on the last CPU and clients on the
        /// others), split, shared (all on CPU 0) or free (unpinned).
        #[arg(long, default_value = "auto")]
        placement: tidepool_bench::Placement,
        /// alloc suite: a checkout of github.com/daanx/mimalloc-bench built with its own
        /// `./build-bench-env.sh bench` (binaries in DIR/out/bench, inputs in DIR/bench). Its
        /// public benchmarks (larson, alloc-test, cfrac, espresso, barnes, xmalloc-test,
        /// cache-scratch, cache-thrash, mstress, rptest, glibc-simple, glibc-thread,
        /// malloc-large) then run under every allocator too; without it they are skipped.
        #[arg(long, value_name = "DIR", env = "TIDEPOOL_MIMALLOC_BENCH")]
        mimalloc_bench: Option<PathBuf>,
    },
    /// Run the soft-memory coordinator: idle memory moved between applications to where it
    /// is worth most, and taken back under pressure before anything is OOM-killed.
    ///
    /// Programs using tidepool soft memory join when started with TIDEPOOL_COORD=SOCKET
    /// (optionally TIDEPOOL_APP=name, TIDEPOOL_WEIGHT=w): they hand over their soft memory's
    /// memfd and report hits, misses, reconstruction time and ghost hits every 100 ms. Idle
    /// memory is MemAvailable (and the coordinator's memory cgroup's headroom) minus --reserve,
    /// plus what soft memory already holds. Under pressure budgets are cut (the programs
    /// evacuate and give back segments); when pressure is severe or a program is slow the
    /// coordinator punches holes in its coldest segments itself.
    ///
    /// Example: tidepool coord --http 127.0.0.1:7171 --policy midas
    #[command(after_long_help = "Environment: programs join when started with \
        TIDEPOOL_COORD=SOCKET (soft memory; `tidepool run` and `tidepool cache` join it by \
        themselves), named by TIDEPOOL_APP and weighted by TIDEPOOL_WEIGHT.")]
    Coord(coord::CoordArgs),
    /// Show a coordinator's applications live in the terminal (needs `tidepool coord --http`).
    Top {
        /// The coordinator's --http address.
        #[arg(long, default_value = "127.0.0.1:7171")]
        http: String,
        /// Print once and exit.
        #[arg(long)]
        once: bool,
    },
    /// Change an application's weight in the coordinator while it runs: over its socket (the
    /// coordinator's owner and root may change any application, others only their own), or
    /// over HTTP with its token.
    Weight {
        /// The application's id (as `tidepool top` shows it).
        app: u32,
        /// The new weight (1 is the default; 2 counts its utility twice).
        weight: f64,
        /// The coordinator's socket [default: as `tidepool coord`'s].
        #[arg(long, conflicts_with = "http")]
        socket: Option<PathBuf>,
        /// Go through the coordinator's --http address instead of its socket.
        #[arg(long)]
        http: Option<String>,
        /// The token for --http [default: beside the default socket, coord.token].
        #[arg(long, requires = "http")]
        token_file: Option<PathBuf>,
    },
    /// Run a memcached-compatible cache server whose items live in soft memory.
    ///
    /// Any memcached client works unchanged: the text protocol (get, gets, gat, gats, set,
    /// add, replace, append, prepend, cas, delete, incr, decr, touch, flush_all, stats,
    /// version, verbosity, quit) and the meta commands (mg, ms, md, ma, mn), with memcached's
    /// limits and error replies.
    ///
    /// There is no fixed -m: items live in soft memory, which grows into idle memory and is
    /// given back in milliseconds when the host needs it (a value given back reads as a miss,
    /// as an evicted item would). A coordinator (`tidepool coord`) sizes it beside other
    /// programs when one runs; otherwise an `auto` budget follows the host's available memory
    /// minus --reserve. It gives memory back rather than being swapped or OOM-killed. With
    /// --far, values also go to a far store and come back from there instead of being misses.
    ///
    /// Example: tidepool cache --listen 127.0.0.1:11211 --threads 4 --far node://cache@10.0.0.5:7070
    #[command(
        after_long_help = "Environment: TIDEPOOL_COORD, the coordinator's socket to \
        join [default: the default socket, if one answers]; TIDEPOOL_TOKEN, a memory node's \
        token for --far when the URL has none."
    )]
    Cache(cache::CacheArgs),
    /// Check what each feature needs from this host, and name the fix for what is missing.
    ///
    /// Each check is made for real, as the user who runs it: userfaultfd with the kernel's
    /// faults and UFFDIO_MOVE (tidepool run), seccomp user notification (statically linked
    /// programs), a memfd with SIGBUS faults and shmem huge pages (soft memory), the
    /// coordinator's socket, root, the cgroup v1 memory controller and zram (the benchmarks),
    /// and a far store if --url names one. Exits 1 if a feature cannot work here.
    #[command(
        after_long_help = "Environment: TIDEPOOL_COORD, the coordinator's socket to \
        check [default: the default socket]; TIDEPOOL_PRELOAD, the preload library to check \
        [default: as `tidepool run` finds it]."
    )]
    Doctor {
        /// Also check that this far store is reachable, e.g. node://tenant:token@host:7070.
        #[arg(long)]
        url: Option<String>,
    },
    /// Print a shell's completion script for tidepool.
    ///
    /// Example: tidepool completions bash > /etc/bash_completion.d/tidepool
    Completions {
        /// The shell to complete in.
        shell: clap_complete::Shell,
    },
    /// Internal: write the man pages (tidepool.1 and one per command) into a directory.
    #[command(hide = true)]
    Manpages {
        /// The directory to write them into (made if missing).
        out: PathBuf,
    },
    /// Internal: a client process of a benchmark, given its job as JSON
    /// (`tidepool_bench::job::Job`).
    #[command(hide = true)]
    BenchWorker { job: String },
}

fn parse_size_arg(s: &str) -> Result<u64, String> {
    parse_size(s)
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| format!("{s:?} is not a number of seconds (e.g. 5 or 0.5)"))
}

/// `tidepool tune`'s arguments (its help is on the subcommand).
#[derive(Debug, clap::Args)]
struct TuneArgs {
    /// Profile JSON from a profiling run (far data structures).
    profile: Option<PathBuf>,
    /// Local memory for all sections together (line tables included), e.g. 32M (far data
    /// structures).
    #[arg(long, value_parser = parse_size_arg)]
    budget: Option<u64>,
    /// Local memory to tune the program at, e.g. 64M (a program).
    #[arg(long, value_parser = parse_size_arg)]
    local: Option<u64>,
    /// Far store to tune the program over (as for `tidepool run`).
    #[arg(long, default_value = "local:")]
    backend: String,
    /// Runs of the program, the first with the profile so far.
    #[arg(long, default_value_t = 4)]
    rounds: u32,
    /// Go on from this profile (tune's own output) instead of the default policies.
    #[arg(long, value_name = "FILE")]
    from: Option<PathBuf>,
    /// Do not require the program's output to be the same in every round.
    #[arg(long)]
    ignore_output: bool,
    /// Write the result here instead of standard output.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Before keeping a profile, check it again on a larger input: the program's arguments
    /// for that run, one `--check-arg` each, in place of those after `--` (the program
    /// stays). A profile that is not 3% faster there too is left empty: tune on a small
    /// input and check on a middling one, to keep only what carries over to sizes tune
    /// never ran.
    #[arg(long = "check-arg", value_name = "ARG", allow_hyphen_values = true)]
    check_args: Vec<OsString>,
    /// Local memory for that larger check, e.g. 48M [default: --local].
    #[arg(long, value_parser = parse_size_arg, value_name = "SIZE")]
    check_local: Option<u64>,
    /// The program to tune and its arguments, after `--`.
    #[arg(last = true)]
    program: Vec<OsString>,
}

fn main() {
    // `tidepool __exec-static ...`: becomes a statically linked program (never returns).
    run_static::enter_if_asked();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // Escape codes only for a person at a terminal, never into a file or a journal.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if let Err(e) = run(Cli::parse()) {
        eprintln!("tidepool: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Cmd::Node(args) => node::run(args),
        Cmd::Stats { url } => stats(&url),
        Cmd::Demo { backend, size } => demo::run(backend.as_deref(), size),
        Cmd::Bench {
            suite,
            quick,
            out,
            list,
            placement,
            mimalloc_bench,
        } => bench(
            suite,
            list,
            tidepool_bench::BenchOpts {
                quick,
                out,
                placement,
                mimalloc_bench,
            },
        ),
        Cmd::Run {
            local,
            backend,
            opts,
            profile,
            join,
            program,
        } => run::run(local, &backend, &opts, profile.as_deref(), &join, &program),
        Cmd::Resize { pid, local } => run::resize(pid, local),
        Cmd::AddNode { pid, addr } => run::add_node(pid, &addr),
        Cmd::Coord(args) => coord::run(args),
        Cmd::Top { http, once } => coord::top(&http, once),
        Cmd::Weight {
            app,
            weight,
            socket,
            http,
            token_file,
        } => coord::set_weight(weight_via(socket, http, token_file), app, weight),
        Cmd::Status { pid } => run::status(pid),
        Cmd::Tune(args) => tune(args),
        Cmd::Cache(args) => cache::run(args),
        Cmd::Doctor { url } => doctor::run(url.as_deref()),
        Cmd::Completions { shell } => manual::completions(shell),
        Cmd::Manpages { out } => manual::man_pages(&out),
        Cmd::BenchWorker { job } => tidepool_bench::job::Job::parse(&job)?.run(),
    }
}

/// `tidepool tune`: a program's pager sections, or a far-structure profile's.
fn tune(a: TuneArgs) -> Result<()> {
    let larger_asked = !a.check_args.is_empty() || a.check_local.is_some();
    match (a.program.is_empty(), a.profile, a.budget, a.local) {
        (false, None, None, Some(local)) => tune::tune_program(&tune::ProgramTune {
            local,
            backend: a.backend,
            out: a.out,
            rounds: a.rounds.max(1),
            from: a.from,
            ignore_output: a.ignore_output,
            larger: tune::Larger::from_args(a.check_args, a.check_local),
            program: a.program,
        }),
        (false, ..) => anyhow::bail!(
            "to tune a program give --local SIZE and the program after --, and neither a far-structure profile nor --budget"
        ),
        (true, Some(_), Some(_), _) if larger_asked => anyhow::bail!(
            "--check-arg and --check-local are for tuning a program (tidepool tune --local SIZE -- PROGRAM ARGS), not a far-structure profile"
        ),
        (true, Some(profile), Some(budget), _) => {
            tune::tune_far(&profile, budget, a.out.as_deref())
        }
        (true, ..) => anyhow::bail!(
            "give a program to tune (tidepool tune --local SIZE -- PROGRAM ARGS) or a far-structure profile and --budget (tidepool tune PROFILE.json --budget SIZE)"
        ),
    }
}

/// `tidepool stats`: a far store's counters, one a line.
fn stats(url: &str) -> Result<()> {
    let store = tidepool_store::open(url)?;
    let stats = store.stats()?;
    // What the store cannot count is said so, not printed as a Rust Option.
    let shown = |v: Option<u64>| v.map_or("unknown".to_string(), |n| n.to_string());
    println!("{:32} {}", "far_bytes", shown(stats.far_bytes));
    println!("{:32} {}", "objects", shown(stats.objects));
    for (k, v) in &stats.extra {
        println!("{k:32} {v}");
    }
    Ok(())
}

/// `tidepool bench`: lists the suites, or runs one.
fn bench(suite: Option<String>, list: bool, opts: tidepool_bench::BenchOpts) -> Result<()> {
    if list {
        for s in tidepool_bench::suites() {
            println!("{:10} {}", s.name(), s.about());
        }
        return Ok(());
    }
    let suite = suite.expect("clap requires it");
    tidepool_bench::run(&suite, opts)?;
    Ok(())
}

/// How `tidepool weight` reaches the coordinator: over HTTP with its token if given an
/// address, else over its socket (the default ones if not named).
fn weight_via(
    socket: Option<PathBuf>,
    http: Option<String>,
    token_file: Option<PathBuf>,
) -> coord::WeightVia {
    match http {
        Some(addr) => coord::WeightVia::Http {
            addr,
            token_file: token_file.unwrap_or_else(|| {
                tidepool_coord::default_token_file(&tidepool_coord::default_socket())
            }),
        },
        None => coord::WeightVia::Socket(socket.unwrap_or_else(tidepool_coord::default_socket)),
    }
}
