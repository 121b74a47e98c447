//! TLS for clients of servers on other machines: the memory node (`node://...?tls=1`) and Redis
//! (`rediss://`). rustls with the ring provider; whom to trust is either one PEM file of CA
//! certificates (`ca=FILE`, for a private CA) or the system's roots.
//!
//! The handshake is driven here over a blocking socket whose timeouts the caller set, so that a
//! server on the wrong side of the TLS divide is reported as such instead of hanging: a plain
//! server answers a ClientHello with plain bytes (the node with an error frame), closes, or
//! waits for more input (Redis reads an inline command up to a newline).

use crate::StoreError;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore};
use std::io;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What a URL asks of TLS: [`TlsOptions::default`] trusts the system's roots, and the setter
/// below says otherwise. Holds no secret: a CA file's path, not its contents.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// PEM file of CA certificates to trust instead of the system's roots.
    pub(crate) ca: Option<PathBuf>,
}

impl TlsOptions {
    /// PEM file of CA certificates to trust instead of the system's roots (for a private CA).
    /// Default: none, the system's roots are trusted.
    pub fn ca(mut self, value: PathBuf) -> TlsOptions {
        self.ca = Some(value);
        self
    }
}

/// A client's TLS settings for one server: whom to trust and the name its certificate must
/// carry (the URL's host, a DNS name or an IP address). Cheap to clone; connections share it,
/// and with it rustls's session cache, so a pool's later connections resume the first one's
/// session.
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<ClientConfig>,
    server_name: ServerName<'static>,
    /// Where the roots came from, for messages.
    roots: String,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("server_name", &self.server_name)
            .field("roots", &self.roots)
            .finish()
    }
}

/// The host part of `[user:password@]host:port[/DB]` (without brackets around an IPv6
/// address).
pub(crate) fn host_of(addr: &str) -> &str {
    let host_port = host_port(addr);
    let host = host_port.rsplit_once(':').map_or(host_port, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// `host:port` of `[user:password@]host:port[/DB]`.
pub(crate) fn host_port(addr: &str) -> &str {
    let after_user = addr.rsplit_once('@').map_or(addr, |(_, h)| h);
    after_user.split('/').next().unwrap_or(after_user)
}

fn setup_error(reason: String) -> StoreError {
    StoreError::TlsSetup { reason }
}

/// The CA certificates of a PEM file; every error names the file.
pub(crate) fn read_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, StoreError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| {
            setup_error(format!(
                "cannot read CA certificates from {}: {e}",
                path.display()
            ))
        })?;
    if certs.is_empty() {
        return Err(setup_error(format!(
            "{} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            path.display()
        )));
    }
    Ok(certs)
}

fn root_store(ca: Option<&Path>) -> Result<(RootCertStore, String), StoreError> {
    let mut roots = RootCertStore::empty();
    match ca {
        Some(path) => {
            for cert in read_ca_file(path)? {
                roots.add(cert).map_err(|e| {
                    setup_error(format!(
                        "{} holds a certificate that cannot be a trust anchor: {e}",
                        path.display()
                    ))
                })?;
            }
            Ok((roots, path.display().to_string()))
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            // Unparsable system certificates are skipped, as browsers do.
            let (added, _ignored) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                let why = found
                    .errors
                    .first()
                    .map_or_else(String::new, |e| format!(" ({e})"));
                return Err(setup_error(format!(
                    "found no trusted root certificates on this system{why}; name the server's \
                     CA with ca=/path/ca.pem in the URL"
                )));
            }
            Ok((roots, "the system's root certificates".into()))
        }
    }
}

impl ClientTls {
    /// Settings for the server at `addr` (`host:port`), trusting the CAs in `ca` or, without
    /// it, the system's roots.
    pub fn new(addr: &str, ca: Option<&Path>) -> Result<ClientTls, StoreError> {
        let host = host_of(addr);
        let server_name = ServerName::try_from(host.to_string()).map_err(|_| {
            setup_error(format!(
                "'{host}' is neither a DNS name nor an IP address a certificate could name"
            ))
        })?;
        let (roots, from) = root_store(ca)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| setup_error(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(ClientTls {
            config: Arc::new(config),
            server_name,
            roots: from,
        })
    }

    /// Settings from a URL's options.
    pub fn from_options(addr: &str, opts: &TlsOptions) -> Result<ClientTls, StoreError> {
        Self::new(addr, opts.ca.as_deref())
    }

    /// Runs the handshake on `stream` (blocking, with the timeouts the caller set). Errors say
    /// whether the server does not speak TLS, sent a certificate we do not trust, or did not
    /// answer. A server that answered in plain text is not speaking TLS, unless `plain_answer`
    /// makes out of its first bytes an error of its own (a memory node busy at its connection
    /// limit answers so before any handshake).
    pub(crate) fn handshake(
        &self,
        stream: &mut TcpStream,
        backend: &'static str,
        addr: &str,
        plain_hint: &str,
        plain_answer: &dyn Fn(&[u8]) -> Option<StoreError>,
    ) -> Result<ClientConnection, StoreError> {
        let fail = |reason: String| StoreError::Tls {
            backend,
            addr: addr.to_string(),
            reason,
        };
        let mut conn = ClientConnection::new(Arc::clone(&self.config), self.server_name.clone())
            .map_err(|e| fail(e.to_string()))?;
        let mut checked_first_byte = false;
        while conn.is_handshaking() {
            while conn.wants_write() {
                conn.write_tls(stream)
                    .map_err(|e| fail(format!("cannot send the TLS handshake: {e}")))?;
            }
            if !conn.is_handshaking() {
                break;
            }
            if !checked_first_byte {
                // A TLS server's first byte is a record type: 0x16 (handshake) or 0x15 (an
                // alert). Anything else is a server speaking its own protocol in the clear.
                let mut first = [0u8; 1];
                match stream.peek(&mut first) {
                    Ok(0) => {
                        return Err(fail(format!(
                            "the server closed the connection during the TLS handshake; \
                             it probably does not use TLS{plain_hint}"
                        )))
                    }
                    Ok(_) if first[0] != 0x16 && first[0] != 0x15 => {
                        let mut answer = vec![0u8; 4096];
                        let n = std::io::Read::read(stream, &mut answer).unwrap_or(0);
                        if let Some(e) = plain_answer(&answer[..n]) {
                            return Err(e);
                        }
                        return Err(fail(format!(
                            "the server answered in plain text: it does not use TLS{plain_hint}"
                        )));
                    }
                    Ok(_) => checked_first_byte = true,
                    Err(e) => return Err(fail(no_answer(&e, plain_hint))),
                }
            }
            match conn.read_tls(stream) {
                Ok(0) => {
                    return Err(fail(
                        "the server closed the connection during the TLS handshake".into(),
                    ))
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(fail(no_answer(&e, plain_hint))),
            }
            if let Err(e) = conn.process_new_packets() {
                // Send the alert that says why, then give up.
                let _ = conn.write_tls(stream);
                return Err(fail(describe_tls_error(&e, &self.roots)));
            }
        }
        // The last flight (client Finished) may still be queued.
        while conn.wants_write() {
            conn.write_tls(stream)
                .map_err(|e| fail(format!("cannot send the TLS handshake: {e}")))?;
        }
        Ok(conn)
    }

    /// Opens a connection to `server` (`host:port`) and runs the handshake on it, then closes
    /// it: for clients (the redis crate's) whose own handshake would wait without a timeout,
    /// this fails fast and clearly when the server does not speak TLS or is not trusted.
    /// Messages name `shown` (the URL's address, printed redacted).
    pub(crate) fn probe(
        &self,
        server: &str,
        shown: &str,
        backend: &'static str,
        timeout: std::time::Duration,
        plain_hint: &str,
    ) -> Result<(), StoreError> {
        let connect_err = |cause| StoreError::Connect {
            backend,
            addr: shown.to_string(),
            cause,
        };
        let mut stream = connect_with_timeout(server, timeout).map_err(connect_err)?;
        stream
            .set_read_timeout(Some(timeout))
            .and_then(|()| stream.set_write_timeout(Some(timeout)))
            .map_err(connect_err)?;
        let mut conn = self.handshake(&mut stream, backend, shown, plain_hint, &|_| None)?;
        conn.send_close_notify();
        let _ = conn.write_tls(&mut stream);
        Ok(())
    }
}

fn connect_with_timeout(addr: &str, timeout: std::time::Duration) -> io::Result<TcpStream> {
    use std::net::ToSocketAddrs;
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the name resolves to no address");
    for sock in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&sock, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn no_answer(e: &io::Error, plain_hint: &str) -> String {
    if matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    ) {
        format!(
            "no answer to the TLS handshake: the server probably does not use TLS (a plain \
             server waits for a request it can read){plain_hint}"
        )
    } else {
        format!("the TLS handshake failed: {e}")
    }
}

fn describe_tls_error(e: &rustls::Error, roots: &str) -> String {
    use rustls::CertificateError as C;
    match e {
        rustls::Error::InvalidCertificate(why) => {
            let what = match why {
                C::UnknownIssuer => format!("it is not signed by a CA in {roots}"),
                C::NotValidForName | C::NotValidForNameContext { .. } => {
                    "it does not name the host of the URL (DNS name or IP address)".to_string()
                }
                C::Expired | C::ExpiredContext { .. } => "it has expired".to_string(),
                C::NotValidYet | C::NotValidYetContext { .. } => {
                    "it is not valid yet (are the clocks right?)".to_string()
                }
                other => format!(
                    "{other:?}; it must be a server certificate signed by a CA in {roots}, \
                     naming the host of the URL"
                ),
            };
            format!("the server's certificate was refused: {what}")
        }
        rustls::Error::InvalidMessage(_) => {
            format!("the server does not speak TLS here ({e}); is this its TLS port?")
        }
        other => format!("the TLS handshake failed: {other}"),
    }
}

/// Reads what a TLS connection has decrypted into `buf`'s spare room, first pulling records
/// from `stream` when nothing is decrypted yet. `Ok(0)`: the server closed the connection.
pub(crate) fn read_plain(
    conn: &mut ClientConnection,
    stream: &mut TcpStream,
    buf: &mut bytes::BytesMut,
) -> io::Result<usize> {
    use std::io::BufRead;
    loop {
        match conn.reader().fill_buf() {
            Ok(chunk) if !chunk.is_empty() => {
                let n = chunk.len();
                buf.extend_from_slice(chunk);
                conn.reader().consume(n);
                return Ok(n);
            }
            Ok(_) => return Ok(0), // close_notify
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
            Err(e) => return Err(e),
        }
        let n = loop {
            match conn.read_tls(stream) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => break r?,
            }
        };
        if n == 0 {
            return Ok(0);
        }
        conn.process_new_packets()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    }
}

/// Encrypts `slices` and sends them on `stream` (blocking), a record buffer's worth at a time
/// so that a large batch is never held encrypted in memory whole.
pub(crate) fn write_all_vectored(
    conn: &mut ClientConnection,
    stream: &mut TcpStream,
    mut rest: &mut [io::IoSlice<'_>],
    iov_max: usize,
) -> io::Result<()> {
    use std::io::Write;
    while !rest.is_empty() {
        let take = rest.len().min(iov_max);
        let n = conn.writer().write_vectored(&rest[..take])?;
        io::IoSlice::advance_slices(&mut rest, n);
        while conn.wants_write() {
            match conn.write_tls(stream) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if n == 0 && !conn.wants_write() {
            return Err(io::Error::other("TLS connection refused more data"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_come_out_of_addresses() {
        assert_eq!(host_of("127.0.0.1:7070"), "127.0.0.1");
        assert_eq!(host_of("node.example:7070"), "node.example");
        assert_eq!(host_of("[::1]:7070"), "::1");
        assert_eq!(host_of(":pw@redis.example:6379/2"), "redis.example");
    }

    #[test]
    fn a_missing_or_empty_ca_file_is_named() {
        let e = ClientTls::new("127.0.0.1:1", Some(Path::new("/nonexistent/ca.pem")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
        let dir = std::env::temp_dir().join(format!("tp-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = ClientTls::new("127.0.0.1:1", Some(&empty))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("empty.pem") && e.contains("no PEM certificate"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
