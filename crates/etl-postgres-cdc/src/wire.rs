//! The replication connection: the PostgreSQL wire protocol's startup,
//! authentication and simple queries, then the copy-both stream of
//! `START_REPLICATION`, on `postgres-protocol`'s frontend messages.
//!
//! tokio-postgres has no replication protocol (rust-postgres#116), and no
//! maintained crate on crates.io speaks it on tokio with rustls; this
//! module is the part of a client the source needs and nothing more.

use std::pin::Pin;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use etl_postgres::{ClientSettings, SslMode};
use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{ChannelBinding, SCRAM_SHA_256, ScramSha256};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio_postgres::config::Host;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};

use crate::CdcError;

/// A byte stream to the server: TCP, a Unix socket, or TLS over TCP.
pub(crate) trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

type BoxStream = Pin<Box<dyn Stream>>;

/// Upper bound of one backend message: a row or a change larger than
/// this is refused rather than allocated (PostgreSQL's own limit for a
/// field is 1 GiB).
const MAX_MESSAGE: usize = 1 << 30;

/// One backend message: its tag and body.
#[derive(Debug)]
pub(crate) struct Frame {
    pub(crate) tag: u8,
    pub(crate) body: Bytes,
}

/// Reads whole backend messages from a stream.
pub(crate) struct FrameReader<R> {
    read: R,
    buf: BytesMut,
    target: String,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    fn new(read: R, target: String) -> Self {
        FrameReader {
            read,
            buf: BytesMut::with_capacity(64 * 1024),
            target,
        }
    }

    fn io(&self, context: &'static str, source: std::io::Error) -> CdcError {
        CdcError::Io {
            target: self.target.clone(),
            context,
            source,
        }
    }

    /// Whether a whole message is buffered.
    fn has_frame(&self) -> bool {
        self.buf.len() >= 5
            && self.buf.len()
                > u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize
    }

    /// The next message. Not cancel safe: the caller owns the reader in
    /// one task.
    pub(crate) async fn next(&mut self) -> Result<Frame, CdcError> {
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
                let len = len as usize;
                if !(4..=MAX_MESSAGE).contains(&len) {
                    return Err(CdcError::Protocol {
                        target: self.target.clone(),
                        reason: format!("a message of length {len}"),
                    });
                }
                if self.buf.len() > len {
                    let tag = self.buf[0];
                    let mut frame = self.buf.split_to(1 + len);
                    frame.advance(5);
                    return Ok(Frame {
                        tag,
                        body: frame.freeze(),
                    });
                }
                self.buf.reserve(1 + len - self.buf.len());
            }
            let n = self
                .read
                .read_buf(&mut self.buf)
                .await
                .map_err(|e| self.io("reading", e))?;
            if n == 0 {
                return Err(self.io(
                    "reading",
                    std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the server closed the connection",
                    ),
                ));
            }
        }
    }
}

/// A connection in replication mode (`replication=database`), before
/// streaming: it runs replication commands and simple SQL queries.
pub(crate) struct Connection {
    reader: FrameReader<ReadHalf<BoxStream>>,
    write: WriteHalf<BoxStream>,
    target: String,
}

/// The fields of an `ErrorResponse`.
fn server_error(target: &str, context: &str, body: &Bytes) -> CdcError {
    let mut code = String::new();
    let mut message = String::new();
    let mut detail = String::new();
    let mut fields = body.as_ref();
    while let Some((&kind, rest)) = fields.split_first() {
        if kind == 0 {
            break;
        }
        let end = rest.iter().position(|b| *b == 0).unwrap_or(rest.len());
        let text = String::from_utf8_lossy(&rest[..end]).into_owned();
        match kind {
            b'C' => code = text,
            b'M' => message = text,
            b'D' => detail = text,
            _ => {}
        }
        fields = rest.get(end + 1..).unwrap_or_default();
    }
    if !detail.is_empty() {
        message = format!("{message} ({detail})");
    }
    let hint = match code.as_str() {
        "42501" => "; the role needs the REPLICATION attribute (ALTER ROLE ... REPLICATION) \
                    and SELECT on the published tables"
            .to_owned(),
        "28P01" | "28000" => "; check the user, the password and pg_hba.conf".to_owned(),
        "55000" => "; see docs/postgres-cdc.md, \"Server setup\"".to_owned(),
        "53400" => "; raise max_replication_slots or max_wal_senders".to_owned(),
        _ => String::new(),
    };
    CdcError::Server {
        target: target.to_owned(),
        context: context.to_owned(),
        code,
        message,
        hint,
    }
}

/// `user@host:port/database` of `config`.
pub(crate) fn target_of(settings: &ClientSettings) -> String {
    settings.target.clone()
}

async fn open_socket(settings: &ClientSettings, target: &str) -> Result<BoxStream, CdcError> {
    let config = &settings.config;
    let io = |context, source| CdcError::Io {
        target: target.to_owned(),
        context,
        source,
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    match config.get_hosts().first() {
        Some(Host::Unix(dir)) => {
            let path = dir.join(format!(".s.PGSQL.{port}"));
            let stream = tokio::net::UnixStream::connect(path)
                .await
                .map_err(|e| io("connecting", e))?;
            Ok(Box::pin(stream))
        }
        Some(Host::Tcp(host)) => {
            let stream = tokio::net::TcpStream::connect((host.as_str(), port))
                .await
                .map_err(|e| io("connecting", e))?;
            let _ = stream.set_nodelay(true);
            Ok(Box::pin(stream))
        }
        None => Err(CdcError::Config {
            field: "url".to_owned(),
            reason: "names no host".to_owned(),
        }),
    }
}

async fn start_tls(
    settings: &ClientSettings,
    target: &str,
    mut stream: BoxStream,
) -> Result<BoxStream, CdcError> {
    let Some(tls) = &settings.tls else {
        return Ok(stream);
    };
    let host = match settings.config.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        // libpq does not use TLS over a Unix socket either.
        _ => return Ok(stream),
    };
    let io = |source| CdcError::Io {
        target: target.to_owned(),
        context: "asking for TLS",
        source,
    };
    let mut buf = BytesMut::new();
    frontend::ssl_request(&mut buf);
    stream.write_all(&buf).await.map_err(io)?;
    let mut answer = [0u8; 1];
    stream.read_exact(&mut answer).await.map_err(io)?;
    if answer[0] != b'S' {
        if settings.sslmode == SslMode::Prefer {
            tracing::warn!(
                %target,
                "sslmode = \"prefer\": the server does not offer TLS, so the replication \
                 connection is NOT encrypted; set sslmode = \"require\" to refuse plaintext"
            );
            return Ok(stream);
        }
        return Err(CdcError::Tls {
            target: target.to_owned(),
            reason: format!(
                "the server does not offer TLS and sslmode is {}",
                settings.sslmode.as_str()
            ),
        });
    }
    let mut make = tls.clone();
    let connect = MakeTlsConnect::<BoxStream>::make_tls_connect(&mut make, &host).map_err(|e| {
        CdcError::Tls {
            target: target.to_owned(),
            reason: e.to_string(),
        }
    })?;
    let stream = connect.connect(stream).await.map_err(|e| CdcError::Tls {
        target: target.to_owned(),
        reason: e.to_string(),
    })?;
    Ok(Box::pin(stream))
}

impl Connection {
    /// Connect, authenticate and wait until the server is ready, within
    /// `timeout`.
    pub(crate) async fn connect(
        settings: &ClientSettings,
        application_name: &str,
        timeout: Duration,
    ) -> Result<Connection, CdcError> {
        let target = target_of(settings);
        match tokio::time::timeout(timeout, Self::connect_now(settings, application_name)).await {
            Ok(result) => result,
            Err(_) => Err(CdcError::Io {
                target,
                context: "connecting",
                source: std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer within {}s", timeout.as_secs()),
                ),
            }),
        }
    }

    async fn connect_now(
        settings: &ClientSettings,
        application_name: &str,
    ) -> Result<Connection, CdcError> {
        let target = target_of(settings);
        let stream = open_socket(settings, &target).await?;
        let stream = start_tls(settings, &target, stream).await?;
        let (read, write) = tokio::io::split(stream);
        let mut conn = Connection {
            reader: FrameReader::new(read, target.clone()),
            write,
            target,
        };
        conn.startup(settings, application_name).await?;
        Ok(conn)
    }

    /// The server named in messages.
    pub(crate) fn target(&self) -> &str {
        &self.target
    }

    async fn send(&mut self, buf: &[u8]) -> Result<(), CdcError> {
        let target = &self.target;
        self.write
            .write_all(buf)
            .await
            .map_err(|source| CdcError::Io {
                target: target.clone(),
                context: "writing",
                source,
            })
    }

    fn protocol(&self, reason: impl Into<String>) -> CdcError {
        CdcError::Protocol {
            target: self.target.clone(),
            reason: reason.into(),
        }
    }

    async fn startup(
        &mut self,
        settings: &ClientSettings,
        application_name: &str,
    ) -> Result<(), CdcError> {
        let config = &settings.config;
        let user = config.get_user().unwrap_or("postgres").to_owned();
        let database = config.get_dbname().unwrap_or(&user).to_owned();
        let params = [
            ("user", user.as_str()),
            ("database", database.as_str()),
            ("replication", "database"),
            ("application_name", application_name),
            // The text forms the value mapping expects (see `value`).
            ("DateStyle", "ISO"),
            ("TimeZone", "UTC"),
            ("IntervalStyle", "iso_8601"),
            ("bytea_output", "hex"),
            ("extra_float_digits", "3"),
            ("client_encoding", "UTF8"),
        ];
        let mut buf = BytesMut::new();
        frontend::startup_message(params.iter().copied(), &mut buf)
            .map_err(|e| self.protocol(format!("startup message: {e}")))?;
        self.send(&buf).await?;
        let password = config.get_password().map(<[u8]>::to_vec);
        let no_password = || CdcError::Config {
            field: "password".to_owned(),
            reason: "the server asks for a password and none is configured \
                     (`password`, the URL's, or PGPASSWORD)"
                .to_owned(),
        };
        let mut scram: Option<ScramSha256> = None;
        loop {
            let frame = self.reader.next().await?;
            match frame.tag {
                b'R' => {
                    let mut body = frame.body.clone();
                    if body.len() < 4 {
                        return Err(self.protocol("a short authentication request"));
                    }
                    let kind = body.get_i32();
                    buf.clear();
                    match kind {
                        0 => {}
                        3 => {
                            let password = password.as_deref().ok_or_else(no_password)?;
                            frontend::password_message(password, &mut buf)
                                .map_err(|e| self.protocol(e.to_string()))?;
                            self.send(&buf).await?;
                        }
                        5 => {
                            let password = password.as_deref().ok_or_else(no_password)?;
                            if body.len() < 4 {
                                return Err(self.protocol("an MD5 request without its salt"));
                            }
                            let salt = [body[0], body[1], body[2], body[3]];
                            let hash = md5_hash(user.as_bytes(), password, salt);
                            frontend::password_message(hash.as_bytes(), &mut buf)
                                .map_err(|e| self.protocol(e.to_string()))?;
                            self.send(&buf).await?;
                        }
                        10 => {
                            let password = password.as_deref().ok_or_else(no_password)?;
                            let offers_scram = body
                                .split(|b| *b == 0)
                                .any(|m| m == SCRAM_SHA_256.as_bytes());
                            if !offers_scram {
                                return Err(CdcError::Setup {
                                    target: self.target.clone(),
                                    reason: "the server offers no SASL mechanism this client \
                                             knows (SCRAM-SHA-256)"
                                        .to_owned(),
                                });
                            }
                            let state = ScramSha256::new(password, ChannelBinding::unsupported());
                            frontend::sasl_initial_response(
                                SCRAM_SHA_256,
                                state.message(),
                                &mut buf,
                            )
                            .map_err(|e| self.protocol(e.to_string()))?;
                            self.send(&buf).await?;
                            scram = Some(state);
                        }
                        11 => {
                            let state = scram
                                .as_mut()
                                .ok_or_else(|| self.protocol("SASL continue before SASL"))?;
                            state
                                .update(&body)
                                .map_err(|e| self.protocol(format!("SCRAM: {e}")))?;
                            frontend::sasl_response(state.message(), &mut buf)
                                .map_err(|e| self.protocol(e.to_string()))?;
                            self.send(&buf).await?;
                        }
                        12 => {
                            let state = scram
                                .as_mut()
                                .ok_or_else(|| self.protocol("SASL final before SASL"))?;
                            state.finish(&body).map_err(|e| CdcError::Setup {
                                target: self.target.clone(),
                                reason: format!("the server's SCRAM signature is wrong: {e}"),
                            })?;
                        }
                        other => {
                            return Err(CdcError::Setup {
                                target: self.target.clone(),
                                reason: format!(
                                    "the server asks for authentication method {other}, which \
                                     this client does not support (password, md5, \
                                     scram-sha-256 are)"
                                ),
                            });
                        }
                    }
                }
                b'E' => return Err(server_error(&self.target, "logging in", &frame.body)),
                b'Z' => return Ok(()),
                // ParameterStatus, BackendKeyData, NoticeResponse.
                _ => {}
            }
        }
    }

    /// Run one simple query (a replication command or SQL) and return its
    /// rows as text.
    pub(crate) async fn query(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>, CdcError> {
        let mut buf = BytesMut::new();
        frontend::query(sql, &mut buf).map_err(|e| self.protocol(e.to_string()))?;
        self.send(&buf).await?;
        let mut rows = Vec::new();
        let mut error = None;
        loop {
            let frame = self.reader.next().await?;
            match frame.tag {
                b'D' => rows
                    .push(data_row(&frame.body).ok_or_else(|| self.protocol("a malformed row"))?),
                b'E' => error = Some(server_error(&self.target, sql, &frame.body)),
                b'Z' => break,
                // RowDescription, CommandComplete, NoticeResponse, ...
                _ => {}
            }
        }
        match error {
            Some(e) => Err(e),
            None => Ok(rows),
        }
    }

    /// Send `START_REPLICATION` and switch to the copy-both stream.
    pub(crate) async fn start_replication(
        mut self,
        command: &str,
    ) -> Result<(ReplicationReader, ReplicationWriter), CdcError> {
        let mut buf = BytesMut::new();
        frontend::query(command, &mut buf).map_err(|e| self.protocol(e.to_string()))?;
        self.send(&buf).await?;
        loop {
            let frame = self.reader.next().await?;
            match frame.tag {
                b'W' => break,
                b'E' => return Err(server_error(&self.target, "START_REPLICATION", &frame.body)),
                b'N' | b'S' => {}
                other => {
                    return Err(self.protocol(format!(
                        "expected the copy-both response, got message {:?}",
                        char::from(other)
                    )));
                }
            }
        }
        Ok((
            ReplicationReader {
                reader: self.reader,
                target: self.target.clone(),
            },
            ReplicationWriter {
                write: self.write,
                target: self.target,
            },
        ))
    }
}

fn data_row(body: &Bytes) -> Option<Vec<Option<String>>> {
    let mut body = body.clone();
    if body.len() < 2 {
        return None;
    }
    let n = body.get_i16();
    let mut row = Vec::new();
    for _ in 0..n {
        if body.len() < 4 {
            return None;
        }
        let len = body.get_i32();
        if len < 0 {
            row.push(None);
            continue;
        }
        let len = len as usize;
        if body.len() < len {
            return None;
        }
        row.push(Some(
            String::from_utf8_lossy(&body.split_to(len)).into_owned(),
        ));
    }
    Some(row)
}

/// What the server sends while streaming.
#[derive(Debug)]
pub(crate) enum ServerMessage {
    /// `XLogData`: one `pgoutput` message at `start`.
    XLogData {
        /// The WAL position of the message.
        start: u64,
        /// The server's end of WAL when it sent it.
        wal_end: u64,
        /// The message.
        data: Bytes,
    },
    /// Primary keepalive: the server's end of WAL, and whether it wants a
    /// status update now (it is about to time the connection out).
    Keepalive {
        /// The server's end of WAL (what it has sent).
        end: u64,
        /// Reply at once.
        reply: bool,
    },
}

/// The reading side of the copy-both stream.
pub(crate) struct ReplicationReader {
    reader: FrameReader<ReadHalf<BoxStream>>,
    target: String,
}

impl ReplicationReader {
    /// The server named in messages.
    pub(crate) fn target(&self) -> &str {
        &self.target
    }

    /// Whether a whole message is read already (more of the stream is
    /// here): the caller may gather it into the same batch.
    pub(crate) fn has_buffered_frame(&self) -> bool {
        self.reader.has_frame()
    }

    /// The next message of the stream. Not cancel safe.
    pub(crate) async fn next(&mut self) -> Result<ServerMessage, CdcError> {
        loop {
            let frame = self.reader.next().await?;
            match frame.tag {
                b'd' => {
                    let mut body = frame.body;
                    let short = || CdcError::Protocol {
                        target: self.target.clone(),
                        reason: "a short replication message".to_owned(),
                    };
                    match body.first().copied() {
                        Some(b'w') if body.len() >= 25 => {
                            body.advance(1);
                            let start = body.get_u64();
                            let wal_end = body.get_u64();
                            let _time = body.get_i64();
                            return Ok(ServerMessage::XLogData {
                                start,
                                wal_end,
                                data: body,
                            });
                        }
                        Some(b'k') if body.len() >= 18 => {
                            body.advance(1);
                            let end = body.get_u64();
                            let _time = body.get_i64();
                            let reply = body.get_u8() == 1;
                            return Ok(ServerMessage::Keepalive { end, reply });
                        }
                        Some(b'w' | b'k') => return Err(short()),
                        other => {
                            return Err(CdcError::Protocol {
                                target: self.target.clone(),
                                reason: format!("unknown replication message {other:?}"),
                            });
                        }
                    }
                }
                b'E' => {
                    return Err(server_error(&self.target, "streaming", &frame.body));
                }
                b'c' => {
                    return Err(CdcError::Io {
                        target: self.target.clone(),
                        context: "streaming",
                        source: std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            "the server ended the replication stream",
                        ),
                    });
                }
                // Notices and parameter changes.
                _ => {}
            }
        }
    }
}

/// The writing side: standby status updates.
pub(crate) struct ReplicationWriter {
    write: WriteHalf<BoxStream>,
    target: String,
}

/// Microseconds since PostgreSQL's epoch, now.
fn pg_now() -> i64 {
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0);
    unix - 946_684_800_000_000
}

impl ReplicationWriter {
    /// Send a standby status update: `written` received, `flushed`
    /// durably delivered (the slot's confirmed position follows it).
    pub(crate) async fn status(&mut self, written: u64, flushed: u64) -> Result<(), CdcError> {
        let mut body = BytesMut::with_capacity(34);
        body.put_u8(b'r');
        body.put_u64(written);
        body.put_u64(flushed);
        body.put_u64(flushed);
        body.put_i64(pg_now());
        body.put_u8(0);
        let mut buf = BytesMut::with_capacity(40);
        buf.put_u8(b'd');
        buf.put_i32(4 + body.len() as i32);
        buf.extend_from_slice(&body);
        let target = &self.target;
        let io = |source| CdcError::Io {
            target: target.clone(),
            context: "sending a standby status update",
            source,
        };
        self.write.write_all(&buf).await.map_err(io)?;
        self.write.flush().await.map_err(io)
    }
}
