//! The smallest HTTP/1.1 client the `serve` workloads need: `POST` on one connection (kept
//! alive between calls), the response's status and body, the body read whole
//! (`Content-Length`) or piece by piece (`Transfer-Encoding: chunked`, as `serve`'s NDJSON event
//! streams come). Written here rather than taken from a crate: the workloads time every call
//! themselves, and no HTTP client crate's features should change how the workspace's HTTP
//! server dependencies are built.

use std::io;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The base URL in a `serve` URL file (`http://127.0.0.1:PORT`, as `serve` prints it), or an
/// error saying why not.
pub fn read_base(path: &std::path::Path) -> io::Result<String> {
    let text = std::fs::read_to_string(path)?;
    let base = text.trim();
    let host = base
        .strip_prefix("http://")
        .ok_or_else(|| bad(format!("{}: not an http:// URL: {base:?}", path.display())))?;
    Ok(host.trim_end_matches('/').to_string())
}

fn bad(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// One connection to a server (`host:port`).
#[derive(Debug)]
pub struct Conn {
    host: String,
    io: BufReader<TcpStream>,
    /// The current response's body, until it is read to its end.
    body: Body,
}

/// How much of the current response's body is left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Body {
    /// Read to its end: the connection may carry the next request.
    Done,
    /// This many bytes.
    Length(u64),
    /// Chunks, until the last (empty) one.
    Chunked,
    /// Everything until the server closes the connection.
    UntilClose,
}

impl Conn {
    /// Connect to `host` (`127.0.0.1:PORT`).
    pub async fn connect(host: &str) -> io::Result<Conn> {
        let stream = TcpStream::connect(host).await?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            host: host.to_string(),
            io: BufReader::new(stream),
            body: Body::Done,
        })
    }

    /// Whether the connection can carry another request (the last response was read whole
    /// and the server did not close it).
    pub fn reusable(&self) -> bool {
        self.body == Body::Done
    }

    /// `POST path` with an empty body; returns the response's status once its head is read
    /// (read the body with [`Conn::body`] or [`Conn::chunk`]).
    pub async fn post(&mut self, path: &str) -> io::Result<u16> {
        if self.body != Body::Done {
            return Err(bad("the last response was not read to its end".into()));
        }
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\nAccept: application/json, application/x-ndjson\r\n\r\n",
            self.host
        );
        self.io.get_mut().write_all(request.as_bytes()).await?;
        let status_line = self.line().await?;
        let status = status_line
            .strip_prefix("HTTP/1.1 ")
            .or_else(|| status_line.strip_prefix("HTTP/1.0 "))
            .and_then(|s| s.get(..3))
            .and_then(|s| s.parse::<u16>().ok())
            .ok_or_else(|| bad(format!("not an HTTP status line: {status_line:?}")))?;
        let (mut length, mut chunked, mut close) = (None, false, false);
        loop {
            let header = self.line().await?;
            if header.is_empty() {
                break;
            }
            let Some((name, value)) = header.split_once(':') else {
                return Err(bad(format!("not a header: {header:?}")));
            };
            let value = value.trim();
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => {
                    length = Some(
                        value
                            .parse::<u64>()
                            .map_err(|_| bad(format!("Content-Length {value:?}")))?,
                    )
                }
                "transfer-encoding" => chunked = value.to_ascii_lowercase().contains("chunked"),
                "connection" => close = value.eq_ignore_ascii_case("close"),
                _ => {}
            }
        }
        self.body = match (chunked, length) {
            (true, _) => Body::Chunked,
            (false, Some(0)) => Body::Done,
            (false, Some(n)) => Body::Length(n),
            (false, None) => Body::UntilClose,
        };
        if close && self.body == Body::Done {
            // Nothing more on this connection.
            self.body = Body::UntilClose;
        }
        Ok(status)
    }

    /// The next piece of the body (a chunk, or the whole body when its length is known);
    /// `None` at its end.
    pub async fn chunk(&mut self) -> io::Result<Option<Vec<u8>>> {
        match self.body {
            Body::Done => Ok(None),
            Body::Length(n) => {
                let mut bytes = vec![0; usize::try_from(n).map_err(|_| bad("huge body".into()))?];
                self.io.read_exact(&mut bytes).await?;
                self.body = Body::Done;
                Ok(Some(bytes))
            }
            Body::Chunked => {
                let size_line = self.line().await?;
                let size = size_line.split(';').next().unwrap_or("").trim();
                let size = usize::from_str_radix(size, 16)
                    .map_err(|_| bad(format!("not a chunk size: {size_line:?}")))?;
                if size == 0 {
                    // Trailers, then the empty line.
                    while !self.line().await?.is_empty() {}
                    self.body = Body::Done;
                    return Ok(None);
                }
                let mut bytes = vec![0; size];
                self.io.read_exact(&mut bytes).await?;
                if !self.line().await?.is_empty() {
                    return Err(bad("a chunk not followed by CRLF".into()));
                }
                Ok(Some(bytes))
            }
            Body::UntilClose => {
                let mut bytes = vec![0; 8192];
                let n = self.io.read(&mut bytes).await?;
                if n == 0 {
                    return Ok(None);
                }
                bytes.truncate(n);
                Ok(Some(bytes))
            }
        }
    }

    /// The whole body.
    pub async fn body(&mut self) -> io::Result<Vec<u8>> {
        let mut all = Vec::new();
        while let Some(piece) = self.chunk().await? {
            all.extend_from_slice(&piece);
        }
        Ok(all)
    }

    /// One CRLF-terminated line of the response's head or chunk framing, without the CRLF.
    async fn line(&mut self) -> io::Result<String> {
        let mut line = String::new();
        if self.io.read_line(&mut line).await? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            ));
        }
        Ok(line.trim_end_matches(['\r', '\n']).to_string())
    }
}

/// An NDJSON event stream: the JSON objects of a chunked body, one per line.
#[derive(Debug)]
pub struct Events {
    conn: Conn,
    buffer: Vec<u8>,
}

impl Events {
    /// The events of `conn`'s current response.
    pub fn new(conn: Conn) -> Events {
        Events {
            conn,
            buffer: Vec::new(),
        }
    }

    /// The next event; `Ok(None)` when the stream ended.
    pub async fn next(&mut self) -> io::Result<Option<serde_json::Value>> {
        loop {
            if let Some(at) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=at).collect();
                let event = serde_json::from_slice(&line)
                    .map_err(|e| bad(format!("an event that is not JSON ({e})")))?;
                return Ok(Some(event));
            }
            match self.conn.chunk().await? {
                Some(piece) => self.buffer.extend_from_slice(&piece),
                None => return Ok(None),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A server that answers each connection with `reply`, once per request it reads.
    async fn serve_once(reply: &'static str) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let host = listener.local_addr().expect("addr").to_string();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            let mut buf = vec![0u8; 4096];
            let _ = socket.read(&mut buf).await;
            let _ = socket.write_all(reply.as_bytes()).await;
            let _ = socket.read(&mut buf).await;
        });
        host
    }

    #[tokio::test]
    async fn a_body_with_a_length_and_a_chunked_stream_of_events_are_read() {
        let host = serve_once(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n{\"first\":7}\n",
        )
        .await;
        let mut conn = Conn::connect(&host).await.expect("connects");
        assert_eq!(conn.post("/v1/ids/x").await.expect("answers"), 200);
        let body: serde_json::Value =
            serde_json::from_slice(&conn.body().await.expect("body")).expect("json");
        assert_eq!(body["first"], 7);
        assert!(conn.reusable());

        let host = serve_once(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nf\r\n{\"event\":\"a\"}\n{\r\nd\r\n\"event\":\"b\"}\n\r\n0\r\n\r\n",
        )
        .await;
        let mut conn = Conn::connect(&host).await.expect("connects");
        assert_eq!(
            conn.post("/v1/locks/x/acquire").await.expect("answers"),
            200
        );
        let mut events = Events::new(conn);
        let a = events.next().await.expect("reads").expect("an event");
        let b = events.next().await.expect("reads").expect("an event");
        assert_eq!(
            (a["event"].as_str(), b["event"].as_str()),
            (Some("a"), Some("b"))
        );
        assert!(events.next().await.expect("reads").is_none());
    }
}
