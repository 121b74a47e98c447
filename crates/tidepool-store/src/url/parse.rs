//! The parser behind [`StoreUrl::parse`]: the URL split into scheme, address and query
//! parameters, then one step per scheme. Each step takes the parameters it knows; any left
//! over are refused.

use super::{check_addr, one_host, redact, Redundancy, StoreUrl, FORMS};
use crate::tls::TlsOptions;
use crate::{Compression, StoreError};
use std::ops::RangeInclusive;
use std::path::PathBuf;

/// A store URL being parsed: its scheme, what follows the scheme's `:`, and the query
/// parameters no step has taken yet.
pub(super) struct Parser<'a> {
    url: &'a str,
    scheme: &'a str,
    rest: &'a str,
    params: Vec<(&'a str, &'a str)>,
}

/// The error for `url`, redacted, refused for `reason`.
fn bad_url(url: &str, reason: String) -> StoreError {
    StoreError::BadUrl {
        url: redact(url),
        reason,
    }
}

impl<'a> Parser<'a> {
    /// Splits `url` into its scheme, the rest and the query's `key=value` parameters.
    pub(super) fn new(url: &'a str) -> Result<Parser<'a>, StoreError> {
        let (scheme, rest) = url
            .split_once(':')
            .ok_or_else(|| bad_url(url, format!("no scheme; {FORMS}")))?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, q),
            None => (rest, ""),
        };
        let mut params = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| bad_url(url, format!("query parameter '{pair}' has no '='")))?;
            params.push((k, v));
        }
        Ok(Parser {
            url,
            scheme,
            rest,
            params,
        })
    }

    /// Parses the URL as its scheme says, then refuses any query parameter left untaken.
    pub(super) fn parse(mut self) -> Result<StoreUrl, StoreError> {
        let parsed = match self.scheme {
            "local" => self.local()?,
            "node" => self.node()?,
            "redis" | "rediss" => self.redis()?,
            "redis+cluster" | "rediss+cluster" => self.redis_cluster()?,
            "memcached" => self.memcached()?,
            other => return Err(self.bad(format!("unknown scheme '{other}'; {FORMS}"))),
        };
        if let Some((k, _)) = self.params.first() {
            return Err(self.bad(format!("unknown query parameter '{k}'")));
        }
        Ok(parsed)
    }

    /// The error for this URL, refused for `reason`.
    fn bad(&self, reason: String) -> StoreError {
        bad_url(self.url, reason)
    }

    /// Takes the query parameter `name` out of those left, if it is there.
    fn take(&mut self, name: &str) -> Option<String> {
        let i = self.params.iter().position(|(k, _)| *k == name)?;
        Some(self.params.remove(i).1.to_string())
    }

    /// The TLS options, if `on`; `ca=FILE` only means something with TLS on (`how` says how
    /// to turn it on).
    fn tls_options(
        &self,
        on: bool,
        ca: Option<String>,
        how: &str,
    ) -> Result<Option<TlsOptions>, StoreError> {
        match (on, ca) {
            (true, ca) => Ok(Some(TlsOptions {
                ca: ca.map(PathBuf::from),
            })),
            (false, None) => Ok(None),
            (false, Some(_)) => Err(self.bad(format!(
                "ca= names the CA to trust for TLS, which this URL does not use; {how}"
            ))),
        }
    }

    /// What follows `//`: the host:port part, at least one character of it.
    fn host_part(&self) -> Result<String, StoreError> {
        let h = self
            .rest
            .strip_prefix("//")
            .ok_or_else(|| {
                self.bad(format!(
                    "'{}:' must be followed by //host:port",
                    self.scheme
                ))
            })?
            .trim_end_matches('/');
        if h.is_empty() {
            return Err(self.bad("no host:port given".into()));
        }
        Ok(h.to_string())
    }

    /// Takes the parameter `name`, if given, as a whole number in `range` (`unit` says what
    /// it counts, for the message).
    fn number(
        &mut self,
        name: &str,
        range: RangeInclusive<u64>,
        unit: &str,
    ) -> Result<Option<u64>, StoreError> {
        self.take(name)
            .map(|v| {
                v.parse::<u64>()
                    .ok()
                    .filter(|n| range.contains(n))
                    .ok_or_else(|| {
                        self.bad(format!(
                            "{name}={v}: write {unit}, {} to {}",
                            range.start(),
                            range.end()
                        ))
                    })
            })
            .transpose()
    }

    /// `local:[?compress=...]`.
    fn local(&mut self) -> Result<StoreUrl, StoreError> {
        if !self.rest.is_empty() && self.rest != "//" {
            return Err(self.bad("local: takes no address".into()));
        }
        let compression = match self.take("compress").as_deref() {
            None => Compression::DEFAULT,
            Some("none") => Compression::None,
            Some("lz4") => Compression::Lz4,
            Some("zstd") => Compression::Zstd,
            Some(other) => {
                return Err(self.bad(format!(
                    "unknown compression '{other}'; use compress=lz4, compress=zstd or \
                     compress=none (pages kept whole)"
                )))
            }
        };
        Ok(StoreUrl::Local { compression })
    }

    /// `node://[tenant[:token]@]host:port[,...][?...]`: one memory node, or several as one
    /// store.
    fn node(&mut self) -> Result<StoreUrl, StoreError> {
        let h = self.host_part()?;
        let (addr, tenant, token) = self.credentials(&h);
        let addrs = self.node_addrs(addr)?;
        let tls = self.node_tls()?;
        let poll_us = self.number("poll_us", 0..=1_000_000, "microseconds")?;
        let timeout_ms = self.number("timeout_ms", 1..=3_600_000, "milliseconds")?;
        let redundancy = self.redundancy(addrs.len())?;
        if addrs.len() == 1 {
            return Ok(StoreUrl::Node {
                addr: addr.to_string(),
                tenant,
                token,
                tls,
                poll_us,
                timeout_ms,
            });
        }
        Ok(StoreUrl::Nodes {
            nodes: addrs
                .into_iter()
                .map(|addr| StoreUrl::Node {
                    addr,
                    tenant: tenant.clone(),
                    token: token.clone(),
                    tls: tls.clone(),
                    poll_us,
                    timeout_ms,
                })
                .collect(),
            redundancy,
        })
    }

    /// The addresses, tenant and token of `tenant[:token]@hosts`: the tenant `default` if
    /// none is given, the token from `token=` or `TIDEPOOL_TOKEN` if the URL has none.
    fn credentials<'h>(&mut self, h: &'h str) -> (&'h str, String, String) {
        let (cred, addr) = match h.rsplit_once('@') {
            Some((c, a)) => (Some(c), a),
            None => (None, h),
        };
        let (tenant, token) = match cred {
            Some(c) => match c.split_once(':') {
                Some((t, k)) => (t.to_string(), Some(k.to_string())),
                None => (c.to_string(), None),
            },
            None => ("default".to_string(), None),
        };
        let token = token
            .or_else(|| self.take("token"))
            .or_else(|| std::env::var("TIDEPOOL_TOKEN").ok())
            .unwrap_or_default();
        (addr, tenant, token)
    }

    /// The memory nodes' addresses, each checked and none listed twice.
    fn node_addrs(&self, addr: &str) -> Result<Vec<String>, StoreError> {
        let addrs: Vec<String> = addr.split(',').map(str::to_string).collect();
        for (i, a) in addrs.iter().enumerate() {
            check_addr(a).map_err(|r| self.bad(r))?;
            if addrs[..i].contains(a) {
                return Err(self.bad(format!("{a} is listed twice; name each memory node once")));
            }
        }
        Ok(addrs)
    }

    /// `tls=1|0` and `ca=FILE` of a `node://` URL.
    fn node_tls(&mut self) -> Result<Option<TlsOptions>, StoreError> {
        let tls = match self.take("tls").as_deref() {
            None | Some("0" | "false" | "no") => false,
            Some("1" | "true" | "yes") => true,
            Some(other) => return Err(self.bad(format!("tls={other}: write tls=1 or tls=0"))),
        };
        let ca = self.take("ca");
        self.tls_options(tls, ca, "add tls=1")
    }

    /// `replicas=R` or `ec=K+M` (one copy if neither), checked against the `n` nodes listed.
    fn redundancy(&mut self, n: usize) -> Result<Redundancy, StoreError> {
        let ec = self.take("ec");
        let replicas = self.number("replicas", 1..=64, "a count")?;
        let redundancy = match (replicas, ec) {
            (Some(_), Some(_)) => {
                return Err(self.bad(
                    "replicas= and ec= both given; keep copies (replicas=R) or \
                     erasure-code (ec=K+M), not both"
                        .into(),
                ))
            }
            (r, None) => Redundancy::Replicas(r.unwrap_or(1) as usize),
            (None, Some(ec)) => Redundancy::parse_ec(&ec).map_err(|r| self.bad(r))?,
        };
        if redundancy.pieces() > n {
            return Err(self.bad(match redundancy {
                Redundancy::Replicas(r) => format!(
                    "replicas={r} needs at least {r} memory nodes and the URL lists {n}; \
                     add nodes (host1:port,host2:port,...) or lower replicas"
                ),
                Redundancy::Erasure { data, parity } => format!(
                    "ec={data}+{parity} needs at least {} memory nodes (K+M) and the \
                     URL lists {n}; add nodes (host1:port,host2:port,...) or lower K or M",
                    data + parity
                ),
            }));
        }
        Ok(redundancy)
    }

    /// `redis://` or `rediss://[:password@]host:port[/DB][?ca=FILE]`.
    fn redis(&mut self) -> Result<StoreUrl, StoreError> {
        let scheme = self.scheme;
        let addr = self.host_part()?;
        // redis://[:password@]host:port[/DB]: the database number stays on the address.
        let host = match addr.split_once('/') {
            Some((host, db)) => {
                db.parse::<u32>().map_err(|_| {
                    self.bad(format!(
                        "'{db}' is not a database number (redis://host:port/DB)"
                    ))
                })?;
                host
            }
            None => addr.as_str(),
        };
        one_host(
            host,
            &format!("{scheme}://"),
            &format!("; for a cluster write {scheme}+cluster://h1:p1,h2:p2"),
        )
        .map_err(|r| self.bad(r))?;
        check_addr(host).map_err(|r| self.bad(r))?;
        let ca = self.take("ca");
        let tls = self.tls_options(scheme == "rediss", ca, "write rediss://")?;
        Ok(StoreUrl::Redis {
            addr,
            prefix: self.take("prefix"),
            tls,
        })
    }

    /// `redis+cluster://h1:p1,...` or `rediss+cluster://...`, with `wait=N&failover_ms=MS`.
    fn redis_cluster(&mut self) -> Result<StoreUrl, StoreError> {
        let h = self.host_part()?;
        let nodes: Vec<String> = h.split(',').map(str::to_string).collect();
        for n in &nodes {
            check_addr(n).map_err(|r| self.bad(r))?;
        }
        let ca = self.take("ca");
        let tls = self.tls_options(
            self.scheme == "rediss+cluster",
            ca,
            "write rediss+cluster://",
        )?;
        let wait = self
            .number("wait", 1..=64, "a number of replicas")?
            .map(|n| n as u32);
        let failover_ms = self.number("failover_ms", 1..=3_600_000, "milliseconds")?;
        Ok(StoreUrl::RedisCluster {
            nodes,
            prefix: self.take("prefix"),
            tls,
            wait,
            failover_ms,
        })
    }

    /// `memcached://host:port`.
    fn memcached(&mut self) -> Result<StoreUrl, StoreError> {
        let addr = self.host_part()?;
        one_host(&addr, "memcached://", "").map_err(|r| self.bad(r))?;
        check_addr(&addr).map_err(|r| self.bad(r))?;
        Ok(StoreUrl::Memcached {
            addr,
            prefix: self.take("prefix"),
        })
    }
}
