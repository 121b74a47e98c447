//! The pager suite's verdict: the issues' acceptance ratios, from this run, as notes.

use crate::harness::Ctx;
use crate::report::Report;

/// The acceptance ratios, from this run, as notes.
pub(super) fn verdict(ctx: &mut Ctx) {
    let r = &ctx.report;
    let mut notes = Vec::new();
    acceptance(r, &mut notes);
    default_against_zram(r, &mut notes);
    node_budgets(r, &mut notes);
    node_misses(r, &mut notes);
    for n in notes {
        ctx.note(n);
    }
}

/// tidepool-local against its peers at the ratios the issue sets.
fn acceptance(r: &Report, notes: &mut Vec<String>) {
    let at = |system: &str, workload: &str, ratio: f64| r.at_ratio(system, workload, ratio);
    // (workload, local ratio, peer, target ratio tidepool-local / peer)
    let targets = [
        ("seq-scan", 0.5, "linux-zram", 10.0),
        ("zipf-0.99", 0.5, "linux-zram", 1.2),
        ("uniform-rmw", 0.5, "linux-zram", 1.0),
        ("seq-scan", 1.0, "native", 0.95),
        ("uniform-rmw", 1.0, "native", 0.95),
        ("zipf-0.99", 1.0, "native", 0.95),
    ];
    for (workload, ratio, peer, want) in targets {
        if let (Some(t), Some(p)) = (
            at("tidepool-local", workload, ratio),
            at(peer, workload, ratio),
        ) {
            notes.push(format!(
                "{workload} at {:.0}% local: tidepool-local / {peer} = {:.2}x (target >= {want}x)",
                ratio * 100.0,
                t / p
            ));
        }
    }
}

/// Issue 54: the default (what a user gets) against zram, speed and bytes.
fn default_against_zram(r: &Report, notes: &mut Vec<String>) {
    let at = |system: &str, workload: &str, ratio: f64| r.at_ratio(system, workload, ratio);
    let mib = |system: &str, workload: &str, ratio: f64| {
        r.results
            .iter()
            .find(|row| {
                row.system == system
                    && row.workload == workload
                    && row.metric == "machine_mib"
                    && row.params.get("local_ratio") == Some(&ratio)
            })
            .map(|row| row.value)
    };
    for workload in [
        "seq-scan",
        "uniform-rmw",
        "uniform-rmw-4t",
        "zipf-0.99",
        "python-dict",
    ] {
        for ratio in [0.25, 0.5] {
            let system = "tidepool-default";
            if let (Some(t), Some(z), Some(tm), Some(zm)) = (
                at(system, workload, ratio),
                at("linux-zram", workload, ratio),
                mib(system, workload, ratio),
                mib("linux-zram", workload, ratio),
            ) {
                let speed = if workload == "python-dict" {
                    z / t
                } else {
                    t / z
                };
                notes.push(format!(
                    "{workload} at {:.0}% local: {system} {speed:.2}x linux-zram's speed at \
                     {:.2}x its machine_mib ({tm:.0} vs {zm:.0} MiB)",
                    ratio * 100.0,
                    tm / zm
                ));
            }
        }
    }
}

/// Issue 54: a memory node takes the pages off this machine; what stays is the budget (the
/// working set's share plus the allowance) and what the pager does not page, within 10%.
fn node_budgets(r: &Report, notes: &mut Vec<String>) {
    for row in r
        .results
        .iter()
        .filter(|row| row.system.starts_with("tidepool-node") && row.metric == "machine_mib")
    {
        let unpaged = r.results.iter().find(|u| {
            u.system == row.system
                && u.workload == row.workload
                && u.metric == "unpaged_mib"
                && u.params == row.params
        });
        let (Some(u), Some(&ratio), Some(&ws)) = (
            unpaged,
            row.params.get("local_ratio"),
            row.params.get("working_set_mib"),
        ) else {
            continue;
        };
        let budget = ws * ratio + (super::ALLOWANCE >> 20) as f64;
        notes.push(crate::meter::budget_note(
            &row.workload,
            ratio,
            &row.system,
            row.value,
            budget,
            "",
            u.value,
        ));
    }
}

/// Issue 28: a node-backed miss near the wire's floor, and the node against zram.
fn node_misses(r: &Report, notes: &mut Vec<String>) {
    let at = |system: &str, workload: &str, ratio: f64| r.at_ratio(system, workload, ratio);
    let metric = |system: &str, workload: &str, metric: &str, ratio: Option<f64>| {
        r.results
            .iter()
            .find(|row| {
                row.system == system
                    && row.workload == workload
                    && row.metric == metric
                    && row.params.get("local_ratio").copied() == ratio
            })
            .map(|row| row.value)
    };
    let get = metric("tidepool-node", "get-4k-unpipelined", "p50_us", None);
    for workload in ["uniform-rmw", "zipf-0.99"] {
        if let (Some(miss), Some(get)) = (
            metric("tidepool-node", workload, "miss_us_p50", Some(0.5)),
            get,
        ) {
            notes.push(format!(
                "{workload} at 50% local: tidepool-node miss p50 {miss:.1} us = {:.2}x the node's \
                 4 KiB get p50 {get:.1} us (target <= 1.3x)",
                miss / get
            ));
        }
    }
    for (workload, want) in [
        ("uniform-rmw", 0.8),
        ("uniform-rmw-4t", 0.8),
        ("zipf-0.99", 0.8),
        ("python-dict", 1.0),
    ] {
        if let (Some(t), Some(p)) = (
            at("tidepool-node", workload, 0.5),
            at("linux-zram", workload, 0.5),
        ) {
            // Seconds for the Python program: less is better.
            let ratio = if workload == "python-dict" {
                p / t
            } else {
                t / p
            };
            notes.push(format!(
                "{workload} at 50% local: tidepool-node / linux-zram = {ratio:.2}x (target >= {want}x)"
            ));
        }
    }
}
