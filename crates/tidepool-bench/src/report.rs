//! Results: one row per system x workload x parameter point x metric.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Row {
    pub system: String,
    pub workload: String,
    pub metric: String,
    pub value: f64,
    pub unit: String,
    pub params: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Report {
    pub suite: String,
    pub quick: bool,
    pub results: Vec<Row>,
    /// Peers that could not run and other caveats, in words.
    #[serde(default)]
    pub notes: Vec<String>,
    /// The machine and commit the figures came from (absent in files from before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<crate::env::Env>,
}

impl Report {
    pub fn new(suite: &str, quick: bool) -> Report {
        Report {
            suite: suite.to_string(),
            quick,
            results: vec![],
            notes: vec![],
            env: None,
        }
    }

    pub fn push(
        &mut self,
        system: &str,
        workload: &str,
        metric: &str,
        value: f64,
        unit: &str,
        params: &[(&str, f64)],
    ) {
        self.results.push(Row {
            system: system.to_string(),
            workload: workload.to_string(),
            metric: metric.to_string(),
            value,
            unit: unit.to_string(),
            params: params.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        });
    }

    /// The value of one row, if measured.
    pub fn value(&self, system: &str, workload: &str, metric: &str) -> Option<f64> {
        self.results
            .iter()
            .find(|r| r.system == system && r.workload == workload && r.metric == metric)
            .map(|r| r.value)
    }

    /// The figure of `system` on `workload` at local-memory ratio `ratio` (not the bytes held
    /// beside it, `machine_mib`, `far_mib` and `unpaged_mib`), if measured.
    pub fn at_ratio(&self, system: &str, workload: &str, ratio: f64) -> Option<f64> {
        self.results
            .iter()
            .find(|row| {
                row.system == system
                    && row.workload == workload
                    && row.params.get("local_ratio").copied() == Some(ratio)
                    && !matches!(
                        row.metric.as_str(),
                        "machine_mib" | "far_mib" | "unpaged_mib"
                    )
            })
            .map(|row| row.value)
    }

    pub fn write_json(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("cannot write {}", path.display()))
    }

    /// A table with one line per workload, metric and parameter point, a column per system,
    /// and the first system's ratio to each of the others.
    pub fn table(&self) -> String {
        let mut systems: Vec<&str> = vec![];
        for r in &self.results {
            if !systems.contains(&r.system.as_str()) {
                systems.push(&r.system);
            }
        }
        let mut lines: Vec<(String, BTreeMap<&str, f64>)> = vec![];
        for r in &self.results {
            let params: Vec<String> = r.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let label = format!(
                "{} {} [{}]{}",
                r.workload,
                r.metric,
                r.unit,
                if params.is_empty() {
                    String::new()
                } else {
                    format!(" {}", params.join(","))
                }
            );
            match lines.iter_mut().find(|(l, _)| *l == label) {
                Some((_, m)) => {
                    m.insert(&r.system, r.value);
                }
                None => lines.push((label, BTreeMap::from([(r.system.as_str(), r.value)]))),
            }
        }
        let width = lines
            .iter()
            .map(|(l, _)| l.len())
            .max()
            .unwrap_or(10)
            .max(10);
        let mut out = String::new();
        let _ = write!(out, "\n{:width$}", format!("suite {}", self.suite));
        for s in &systems {
            let _ = write!(out, " {s:>15}");
        }
        let base = systems.first().copied().unwrap_or("");
        for s in systems.iter().skip(1) {
            let _ = write!(out, " {:>12}", format!("{}/{}", short(base), short(s)));
        }
        out.push('\n');
        for (label, vals) in &lines {
            let _ = write!(out, "{label:width$}");
            for s in &systems {
                match vals.get(s) {
                    Some(v) => {
                        let _ = write!(out, " {:>15}", fmt_num(*v));
                    }
                    None => {
                        let _ = write!(out, " {:>15}", "-");
                    }
                }
            }
            for s in systems.iter().skip(1) {
                match (vals.get(base), vals.get(s)) {
                    (Some(a), Some(b)) if *b != 0.0 => {
                        let _ = write!(out, " {:>11.2}x", a / b);
                    }
                    _ => {
                        let _ = write!(out, " {:>12}", "");
                    }
                }
            }
            out.push('\n');
        }
        for n in &self.notes {
            let _ = writeln!(out, "note: {n}");
        }
        out
    }
}

fn short(system: &str) -> &str {
    system.strip_prefix("tidepool-").unwrap_or(system)
}

fn fmt_num(v: f64) -> String {
    if v.abs() >= 1e6 {
        format!("{:.3}M", v / 1e6)
    } else if v.abs() >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else if v.fract() == 0.0 {
        format!("{v}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_the_documented_shape_and_table_shows_ratios() {
        let mut r = Report::new("store", true);
        r.push(
            "tidepool-node",
            "get",
            "ops_per_s",
            400_000.0,
            "ops/s",
            &[("threads", 4.0)],
        );
        r.push(
            "redis",
            "get",
            "ops_per_s",
            200_000.0,
            "ops/s",
            &[("threads", 4.0)],
        );
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(v["suite"], "store");
        assert_eq!(v["quick"], true);
        assert_eq!(v["results"][0]["params"]["threads"], 4.0);
        assert_eq!(v["results"][1]["system"], "redis");
        let t = r.table();
        assert!(t.contains("2.00x"), "{t}");
        assert_eq!(r.value("redis", "get", "ops_per_s"), Some(200_000.0));
    }
}
