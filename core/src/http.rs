//! HTTP/1.1 client exchanges, sans-IO (RFC 9112), for the LLM calls and MCP over HTTP alike:
//! the request head written, the response head and body parsed, chunked bodies decoded, the
//! keep-alive decision made. The HTTP/1.1 rules are `ureq-proto`'s (the sans-IO protocol half
//! of ureq); this module gives them the shape the runtimes drive: [`Exchange::start`] gives the
//! bytes to write, [`Exchange::push`] takes the bytes read, split anywhere, and yields
//! [`HttpEvent`]s.
//!
//! The runtime opens the connection to the request's [`Origin`] (TLS for `https`), writes
//! [`Started::head`] and then the body's pieces back to back (one `writev`: the body is never
//! copied into the exchange), and feeds what it reads to [`Exchange::push`] until
//! [`Exchange::is_done`]; at end of stream it calls [`Exchange::finish`]. A connection whose
//! exchange ended [`Exchange::reusable`] may carry the next request to the same origin.
//!
//! Redirects are never followed: a `3xx` is a response like any other, for its owner to report
//! (a credential must never travel to where a `Location` points).

use crate::llm::{Body, HttpRequest};
use std::fmt;
use ureq_proto::BodyMode;
use ureq_proto::client::state::{RecvBody, RecvResponse};
use ureq_proto::client::{Call, RecvBodyResult, RecvResponseResult, SendRequestResult};
use ureq_proto::http;

/// What the runtime observed of one HTTP exchange ([`Action::CallLlm`](crate::Action::CallLlm)), in this order:
/// `Head`, any number of `Body`, then `End` or `Failed`. `Failed` may also come first (no
/// connection). After the core dropped the exchange ([`Action::CancelLlm`](crate::Action::CancelLlm)) the runtime may
/// still deliver some; the core ignores them. The runtime reads the response with the core's
/// codec ([`crate::http::Exchange`]), so a `3xx` arrives like any status: redirects are never
/// followed.
#[derive(Clone, PartialEq, Eq)]
pub enum HttpEvent {
    /// The response's status line and headers.
    Head {
        /// The HTTP status code (e.g. 200, 429, 529).
        status: u16,
        /// Header `(name, value)` pairs in the order received, names lower-cased (the core
        /// reads e.g. `retry-after`, `retry-after-ms` and `date`, SPEC L5; `content-type` and
        /// `mcp-session-id`, SPEC M10).
        headers: Vec<(String, String)>,
    },
    /// The next chunk of the body, as read (any size, split anywhere; the core decodes SSE and
    /// UTF-8 across chunks).
    Body(Vec<u8>),
    /// The body ended cleanly.
    End,
    /// A connection or IO failure before or during the body, with a one-line reason for logs
    /// and the client's error message; retryable (SPEC L5).
    Failed(String),
}

impl fmt::Debug for HttpEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpEvent::Head { status, .. } => write!(f, "Head({status})"),
            HttpEvent::Body(b) => write!(f, "Body({} B)", b.len()),
            HttpEvent::End => write!(f, "End"),
            HttpEvent::Failed(e) => write!(f, "Failed({e})"),
        }
    }
}

/// The longest response head (status line and headers) accepted, in bytes; a longer one fails
/// the exchange (docs/limits.md).
pub const MAX_RESPONSE_HEAD_BYTES: usize = 32 * 1024;

/// The longest chunk-size line (with extensions) a chunked body may have, in bytes.
const MAX_CHUNK_LINE_BYTES: usize = 4 * 1024;

/// The request methods the agent uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `GET` (the MCP server's event stream, MCP 2025-11-25 basic/transports).
    Get,
    /// `POST` (an LLM call, an MCP message).
    Post,
    /// `DELETE` (the end of an MCP session).
    Delete,
}

impl Method {
    /// The method's name on the wire.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Delete => "DELETE",
        }
    }
}

/// One HTTP request as the core builds it. `Debug` shows the method, URL, header names and the
/// body length only: never a credential (SPEC P2).
#[derive(Clone, PartialEq, Eq)]
pub struct Request {
    /// The method.
    pub method: Method,
    /// The absolute `http://` or `https://` URL.
    pub url: String,
    /// Header `(name, value)` pairs, sent in this order after `host` (and `content-length`,
    /// which the exchange adds for a body; a caller never sets either).
    pub headers: Vec<(String, String)>,
    /// The body (empty for `GET` and `DELETE`), in pieces written back to back.
    pub body: Body,
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(k, _)| k.as_str()).collect();
        write!(
            f,
            "{} {} {names:?} ({} B)",
            self.method.as_str(),
            self.url,
            self.body.len()
        )
    }
}

impl From<HttpRequest> for Request {
    /// An LLM call is a `POST` (SPEC L6–L8).
    fn from(r: HttpRequest) -> Request {
        Request {
            method: Method::Post,
            url: r.url,
            headers: r.headers,
            body: r.body,
        }
    }
}

/// Where a request goes: the key of a connection (`https://api.example.com:443`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Origin {
    /// `https` (TLS) rather than `http`.
    pub tls: bool,
    /// The host name or IP address, without the brackets of an IPv6 literal; also the TLS
    /// server name.
    pub host: String,
    /// The TCP port (80 or 443 unless the URL names one).
    pub port: u16,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        if self.host.contains(':') {
            write!(f, "{scheme}://[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{scheme}://{}:{}", self.host, self.port)
        }
    }
}

/// Why an exchange cannot go on; its `Display` is one line for logs and error messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExchangeError {
    /// The request cannot be written: a URL that is not absolute `http(s)`, a header name or
    /// value HTTP does not allow (a newline in a value, say).
    #[error("invalid request: {0}")]
    BadRequest(String),
    /// The response is not HTTP/1.1 as RFC 9112 has it (a bad status line, a bad chunk size).
    #[error("invalid HTTP response: {0}")]
    BadResponse(String),
    /// The response head grew over [`MAX_RESPONSE_HEAD_BYTES`].
    #[error("the response head is over {MAX_RESPONSE_HEAD_BYTES} bytes")]
    HeadTooLarge,
    /// The connection ended before the response did.
    #[error("the connection closed {0}")]
    Closed(&'static str),
}

/// A started exchange: the bytes to write and where to.
#[derive(Debug)]
pub struct Started {
    /// The exchange, waiting for the response.
    pub exchange: Exchange,
    /// The connection to use.
    pub origin: Origin,
    /// The request head; the request's body pieces follow it on the wire.
    pub head: Vec<u8>,
}

/// One request/response exchange on a connection (see the module docs).
pub struct Exchange {
    phase: Phase,
    /// Response-head bytes received while the head is incomplete.
    pending: Vec<u8>,
}

enum Phase {
    /// Waiting for the complete response head.
    Head(Call<RecvResponse>),
    /// Reading the body.
    Body(Call<RecvBody>),
    /// The response ended; `reusable`: the connection may carry another request.
    Done { reusable: bool },
    /// The exchange failed (sticky: every later call fails the same way).
    Failed(ExchangeError),
}

impl fmt::Debug for Exchange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let phase = match &self.phase {
            Phase::Head(_) => "head",
            Phase::Body(_) => "body",
            Phase::Done { .. } => "done",
            Phase::Failed(_) => "failed",
        };
        write!(f, "Exchange({phase}, {} B pending)", self.pending.len())
    }
}

/// Whether the body was read to its end (a close-delimited body ends only at end of stream).
fn body_ended(call: &Call<RecvBody>) -> bool {
    call.body_mode() != BodyMode::CloseDelimited && call.can_proceed()
}

fn bad_request(e: impl fmt::Display) -> ExchangeError {
    ExchangeError::BadRequest(e.to_string())
}

fn bad_response(e: impl fmt::Display) -> ExchangeError {
    ExchangeError::BadResponse(e.to_string())
}

/// Whether `name: value` can be sent as a header (RFC 9110: a token name, a value without
/// control characters such as CR or LF), and is not one the exchange writes itself.
///
/// # Errors
/// Why not, one line.
pub fn check_header(name: &str, value: &str) -> Result<(), String> {
    http::HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("'{name}' is not a valid header name"))?;
    http::HeaderValue::from_str(value)
        .map_err(|_| format!("the value of '{name}' has characters a header cannot carry"))?;
    if name.eq_ignore_ascii_case("content-length") || name.eq_ignore_ascii_case("host") {
        return Err(format!("'{name}' is set by the agent"));
    }
    Ok(())
}

/// The origin of an absolute `http(s)` URL.
///
/// # Errors
/// [`ExchangeError::BadRequest`] for anything else.
pub fn origin_of(url: &str) -> Result<Origin, ExchangeError> {
    let uri: http::Uri = url.parse().map_err(bad_request)?;
    uri_origin(&uri)
}

fn uri_origin(uri: &http::Uri) -> Result<Origin, ExchangeError> {
    let tls = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        Some(other) => return Err(bad_request(format!("scheme '{other}' is not http(s)"))),
        None => return Err(bad_request("the URL is not absolute")),
    };
    let host = uri
        .host()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| bad_request("the URL has no host"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Ok(Origin {
        tls,
        host: host.to_string(),
        port: uri.port_u16().unwrap_or(if tls { 443 } else { 80 }),
    })
}

impl Exchange {
    /// Starts `request`: its origin and head (`host`, `user-agent` when the request has none,
    /// `content-length` for a body, then the request's headers in order).
    ///
    /// # Errors
    /// [`ExchangeError::BadRequest`] when the URL or a header cannot be sent.
    pub fn start(request: &Request, user_agent: &str) -> Result<Started, ExchangeError> {
        let uri: http::Uri = request.url.parse().map_err(bad_request)?;
        let origin = uri_origin(&uri)?;
        let method = match request.method {
            Method::Get => http::Method::GET,
            Method::Post => http::Method::POST,
            Method::Delete => http::Method::DELETE,
        };
        let mut builder = http::Request::builder().method(method).uri(uri);
        let has_agent = request
            .headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("user-agent"));
        if !has_agent {
            builder = builder.header("user-agent", user_agent);
        }
        for (k, v) in &request.headers {
            if k.eq_ignore_ascii_case("content-length") || k.eq_ignore_ascii_case("host") {
                return Err(bad_request(format!("the header '{k}' is the exchange's")));
            }
            builder = builder.header(k.as_str(), v.as_str());
        }
        let body_len = request.body.len();
        if body_len > 0 || request.method == Method::Post {
            builder = builder.header("content-length", body_len.to_string());
        }
        let http_request = builder.body(()).map_err(bad_request)?;
        let mut call = Call::new(http_request).map_err(bad_request)?;
        if body_len > 0 && request.method != Method::Post {
            call.force_send_body();
        }
        let mut send = call.proceed();
        let mut head = Vec::new();
        let mut buf = vec![0u8; 1024];
        while !send.can_proceed() {
            match send.write(&mut buf) {
                Ok(n) => head.extend_from_slice(buf.get(..n).unwrap_or(&[])),
                // A header line longer than the buffer: grow it (bounded by the request).
                Err(ureq_proto::Error::OutputOverflow) => buf.resize(buf.len() * 2, 0),
                Err(e) => return Err(bad_request(e)),
            }
        }
        let recv = match send.proceed().map_err(bad_request)? {
            Some(SendRequestResult::RecvResponse(recv)) => recv,
            Some(SendRequestResult::SendBody(mut body)) => {
                body.consume_direct_write(body_len).map_err(bad_request)?;
                body.proceed()
                    .ok_or_else(|| bad_request("the body was not accepted whole"))?
            }
            Some(SendRequestResult::Await100(_)) => {
                return Err(bad_request("expect: 100-continue is not supported"));
            }
            None => return Err(bad_request("the request head is incomplete")),
        };
        Ok(Started {
            exchange: Exchange {
                phase: Phase::Head(recv),
                pending: Vec::new(),
            },
            origin,
            head,
        })
    }

    /// Whether the response ended (or the exchange failed): nothing more will be read.
    #[must_use]
    pub fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Done { .. } | Phase::Failed(_))
    }

    /// Whether the response ended and the connection may carry the next request.
    #[must_use]
    pub fn reusable(&self) -> bool {
        matches!(self.phase, Phase::Done { reusable: true })
    }

    /// Response bytes as read, split anywhere: appends the [`HttpEvent::Head`] (once), the
    /// decoded body chunks and [`HttpEvent::End`] to `events`. Bytes after the end of the
    /// response make the connection unusable for another request.
    ///
    /// # Errors
    /// Why the response cannot be read; the exchange is then failed for good.
    pub fn push(&mut self, input: &[u8], events: &mut Vec<HttpEvent>) -> Result<(), ExchangeError> {
        let result = self.push_inner(input, events);
        if let Err(e) = &result {
            self.phase = Phase::Failed(e.clone());
        }
        result
    }

    fn push_inner(
        &mut self,
        input: &[u8],
        events: &mut Vec<HttpEvent>,
    ) -> Result<(), ExchangeError> {
        match std::mem::replace(&mut self.phase, Phase::Done { reusable: false }) {
            Phase::Failed(e) => Err(e),
            Phase::Done { reusable } => {
                // Bytes after the response: the connection is out of step.
                self.phase = Phase::Done {
                    reusable: reusable && input.is_empty(),
                };
                Ok(())
            }
            Phase::Head(call) => self.read_head(call, input, events),
            Phase::Body(call) => {
                self.phase = Phase::Body(call);
                self.read_body(input, events)
            }
        }
    }

    /// Collects the response head; once it is whole, reports it and reads on into the body.
    fn read_head(
        &mut self,
        mut call: Call<RecvResponse>,
        input: &[u8],
        events: &mut Vec<HttpEvent>,
    ) -> Result<(), ExchangeError> {
        self.pending.extend_from_slice(input);
        let (used, response) = call
            .try_response(&self.pending, false)
            .map_err(bad_response)?;
        let Some(response) = response else {
            // A consumed 1xx leaves its bytes behind; drop them.
            self.pending.drain(..used.min(self.pending.len()));
            if self.pending.len() > MAX_RESPONSE_HEAD_BYTES {
                return Err(ExchangeError::HeadTooLarge);
            }
            self.phase = Phase::Head(call);
            return Ok(());
        };
        let headers = response
            .headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_ascii_lowercase(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        events.push(HttpEvent::Head {
            status: response.status().as_u16(),
            headers,
        });
        let rest = self.pending.split_off(used.min(self.pending.len()));
        self.pending = Vec::new();
        let must_close = match call.proceed() {
            Some(RecvResponseResult::RecvBody(body)) => {
                self.phase = Phase::Body(body);
                return self.read_body(&rest, events);
            }
            Some(RecvResponseResult::Redirect(r)) => r.must_close_connection(),
            Some(RecvResponseResult::Cleanup(c)) => c.must_close_connection(),
            None => return Err(bad_response("incomplete response head")),
        };
        events.push(HttpEvent::End);
        self.phase = Phase::Done {
            reusable: !must_close && rest.is_empty(),
        };
        Ok(())
    }

    /// Decodes body bytes in [`Phase::Body`]; bytes the decoder cannot take yet (a chunk-size
    /// line cut in two) wait in `pending` for the next read.
    fn read_body(
        &mut self,
        input: &[u8],
        events: &mut Vec<HttpEvent>,
    ) -> Result<(), ExchangeError> {
        let Phase::Body(call) = &mut self.phase else {
            return Ok(());
        };
        let joined;
        let mut input = if self.pending.is_empty() {
            input
        } else {
            self.pending.extend_from_slice(input);
            joined = std::mem::take(&mut self.pending);
            &joined[..]
        };
        let mut out = vec![0u8; input.len()];
        let mut filled = 0;
        while !input.is_empty() && !body_ended(call) {
            let (used, wrote) = call
                .read(input, out.get_mut(filled..).unwrap_or(&mut []))
                .map_err(bad_response)?;
            if used == 0 && wrote == 0 {
                break;
            }
            filled += wrote;
            input = input.get(used..).unwrap_or(&[]);
        }
        out.truncate(filled);
        if !out.is_empty() {
            events.push(HttpEvent::Body(out));
        }
        if body_ended(call) {
            let Phase::Body(call) =
                std::mem::replace(&mut self.phase, Phase::Done { reusable: false })
            else {
                return Ok(());
            };
            let must_close = match call.proceed() {
                Some(RecvBodyResult::Cleanup(c)) => c.must_close_connection(),
                Some(RecvBodyResult::Redirect(r)) => r.must_close_connection(),
                None => true,
            };
            events.push(HttpEvent::End);
            self.phase = Phase::Done {
                reusable: !must_close && input.is_empty(),
            };
        } else if !input.is_empty() {
            if input.len() > MAX_CHUNK_LINE_BYTES {
                return Err(bad_response("a chunk-size line is too long"));
            }
            self.pending = input.to_vec();
        }
        Ok(())
    }

    /// The connection reached end of stream: a body that runs to the close ends with
    /// [`HttpEvent::End`]; any other unfinished response is an error.
    ///
    /// # Errors
    /// [`ExchangeError::Closed`] when the response was not complete.
    pub fn finish(&mut self, events: &mut Vec<HttpEvent>) -> Result<(), ExchangeError> {
        let result = match std::mem::replace(&mut self.phase, Phase::Done { reusable: false }) {
            Phase::Done { .. } => Ok(()),
            Phase::Failed(e) => Err(e),
            Phase::Head(_) if self.pending.is_empty() => {
                Err(ExchangeError::Closed("before a response"))
            }
            Phase::Head(_) => Err(ExchangeError::Closed("in the middle of the response head")),
            Phase::Body(call) => {
                if call.body_mode() == BodyMode::CloseDelimited {
                    events.push(HttpEvent::End);
                    Ok(())
                } else {
                    Err(ExchangeError::Closed("before the response body ended"))
                }
            }
        };
        if let Err(e) = &result {
            self.phase = Phase::Failed(e.clone());
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn post(url: &str, headers: &[(&str, &str)], body: &[&[u8]]) -> Request {
        let mut b = Body::default();
        for piece in body {
            b.push(piece.to_vec());
        }
        Request {
            method: Method::Post,
            url: url.into(),
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: b,
        }
    }

    fn start(request: &Request) -> Started {
        Exchange::start(request, "buzz-agent/9").expect("a valid request")
    }

    /// Feeds `response` in pieces of `split` bytes; the events and whether it failed.
    fn feed(
        ex: &mut Exchange,
        response: &[u8],
        split: usize,
    ) -> (Vec<HttpEvent>, Option<ExchangeError>) {
        let mut events = Vec::new();
        for piece in response.chunks(split.max(1)) {
            if let Err(e) = ex.push(piece, &mut events) {
                return (events, Some(e));
            }
        }
        (events, None)
    }

    /// Head status, then the body bytes joined, then whether it ended.
    fn summary(events: &[HttpEvent]) -> (Option<u16>, Vec<u8>, bool) {
        let mut status = None;
        let mut body = Vec::new();
        let mut ended = false;
        for e in events {
            match e {
                HttpEvent::Head { status: s, .. } => status = Some(*s),
                HttpEvent::Body(b) => body.extend_from_slice(b),
                HttpEvent::End => ended = true,
                HttpEvent::Failed(f) => panic!("the codec never reports Failed: {f}"),
            }
        }
        (status, body, ended)
    }

    #[test]
    fn a_post_head_has_host_agent_length_and_the_headers_in_order_and_the_body_stays_out() {
        let r = post(
            "https://api.example.com/v1/messages",
            &[("content-type", "application/json"), ("x-api-key", "k")],
            &[b"{\"a\":", b"1}"],
        );
        let s = start(&r);
        assert_eq!(
            s.origin,
            Origin {
                tls: true,
                host: "api.example.com".into(),
                port: 443
            }
        );
        let head = String::from_utf8(s.head).expect("ASCII");
        assert!(head.starts_with("POST /v1/messages HTTP/1.1\r\n"), "{head}");
        assert!(
            head.ends_with("\r\n\r\n"),
            "the body is not in the head: {head}"
        );
        let lines: Vec<&str> = head.trim_end().split("\r\n").skip(1).collect();
        let names: Vec<String> = lines
            .iter()
            .map(|l| l.split(':').next().unwrap_or("").to_ascii_lowercase())
            .collect();
        assert!(names.contains(&"host".to_string()), "{head}");
        let pos = |n: &str| names.iter().position(|x| x == n).expect(n);
        assert!(
            pos("content-type") < pos("x-api-key"),
            "in the order given: {head}"
        );
        assert!(head.contains("user-agent: buzz-agent/9\r\n"), "{head}");
        assert!(head.contains("content-length: 7\r\n"), "{head}");
        assert!(
            !head.to_ascii_lowercase().contains("transfer-encoding"),
            "{head}"
        );
    }

    #[test]
    fn m10_a_get_and_a_delete_have_no_length_and_an_origin_with_its_port() {
        for method in [Method::Get, Method::Delete] {
            let r = Request {
                method,
                url: "http://127.0.0.1:8931/mcp?x=1".into(),
                headers: vec![("accept".into(), "text/event-stream".into())],
                body: Body::default(),
            };
            let s = start(&r);
            assert_eq!(s.origin.to_string(), "http://127.0.0.1:8931");
            let head = String::from_utf8(s.head).expect("ASCII");
            assert!(
                head.starts_with(&format!("{} /mcp?x=1 HTTP/1.1\r\n", method.as_str())),
                "{head}"
            );
            assert!(!head.contains("content-length"), "{head}");
        }
        let v6 = origin_of("http://[::1]:9/").expect("an origin");
        assert_eq!((v6.host.as_str(), v6.port), ("::1", 9));
        assert_eq!(v6.to_string(), "http://[::1]:9");
    }

    #[test]
    fn a_request_that_cannot_be_sent_is_refused_whole() {
        for (url, headers) in [
            ("ftp://example.com/", vec![]),
            ("/relative", vec![]),
            (
                "http://example.com/",
                vec![("x-evil", "a\r\nx-injected: 1")],
            ),
            ("http://example.com/", vec![("bad name", "v")]),
            ("http://example.com/", vec![("content-length", "3")]),
            ("http://example.com/", vec![("Host", "elsewhere")]),
        ] {
            let r = post(url, &headers, &[]);
            assert!(
                matches!(Exchange::start(&r, "ua"), Err(ExchangeError::BadRequest(_))),
                "{url} {headers:?}"
            );
        }
    }

    #[test]
    fn l6_a_length_delimited_answer_ends_reusable_and_any_extra_byte_spoils_the_connection() {
        let response =
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 5\r\n\r\nhello";
        let mut s = start(&post("http://h/", &[], &[b"x"]));
        let mut events = Vec::new();
        s.exchange.push(response, &mut events).expect("valid");
        let HttpEvent::Head { status, headers } = &events[0] else {
            panic!("{events:?}");
        };
        assert_eq!(*status, 200);
        assert!(headers.contains(&("content-type".into(), "text/event-stream".into())));
        assert_eq!(summary(&events), (Some(200), b"hello".to_vec(), true));
        assert!(s.exchange.is_done() && s.exchange.reusable());

        let mut s = start(&post("http://h/", &[], &[b"x"]));
        let mut events = Vec::new();
        let mut spoiled = response.to_vec();
        spoiled.extend_from_slice(b"junk");
        s.exchange.push(&spoiled, &mut events).expect("valid");
        assert!(s.exchange.is_done() && !s.exchange.reusable());
    }

    #[test]
    fn l5_a_server_closing_or_http_1_0_makes_the_connection_single_use() {
        for response in [
            &b"HTTP/1.1 429 Too Many\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"[..],
            b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n",
        ] {
            let mut s = start(&post("http://h/", &[], &[]));
            let (events, err) = feed(&mut s.exchange, response, 3);
            assert_eq!(err, None);
            assert!(summary(&events).2);
            assert!(
                !s.exchange.reusable(),
                "{}",
                String::from_utf8_lossy(response)
            );
        }
    }

    #[test]
    fn a_body_to_the_close_ends_at_end_of_stream_and_a_cut_body_is_an_error() {
        let mut s = start(&post("http://h/", &[], &[]));
        let (mut events, err) = feed(&mut s.exchange, b"HTTP/1.1 200 OK\r\n\r\nto the end", 4);
        assert_eq!(err, None);
        assert!(
            !s.exchange.is_done(),
            "a close-delimited body runs to the close"
        );
        s.exchange.finish(&mut events).expect("ends at the close");
        assert_eq!(summary(&events), (Some(200), b"to the end".to_vec(), true));
        assert!(!s.exchange.reusable());

        for (response, what) in [
            (&b""[..], "before a response"),
            (
                b"HTTP/1.1 200 OK\r\nContent-Le",
                "in the middle of the response head",
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nhalf",
                "before the response body ended",
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nhalf\r\n",
                "before the response body ended",
            ),
        ] {
            let mut s = start(&post("http://h/", &[], &[]));
            let (mut events, err) = feed(&mut s.exchange, response, 7);
            assert_eq!(err, None);
            assert_eq!(
                s.exchange.finish(&mut events),
                Err(ExchangeError::Closed(what))
            );
            assert!(!events.contains(&HttpEvent::End));
            // Sticky: the failed exchange stays failed.
            assert!(s.exchange.push(b"more", &mut events).is_err());
        }
    }

    #[test]
    fn a_head_over_32_kib_or_a_bad_status_line_fails_the_exchange() {
        let mut s = start(&post("http://h/", &[], &[]));
        let mut big = b"HTTP/1.1 200 OK\r\n".to_vec();
        while big.len() <= MAX_RESPONSE_HEAD_BYTES {
            big.extend_from_slice(
                b"x-filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n",
            );
        }
        let (_, err) = feed(&mut s.exchange, &big, 4096);
        // httparse stops at 128 headers before the byte cap: either way the exchange fails.
        assert!(
            matches!(
                err,
                Some(ExchangeError::HeadTooLarge | ExchangeError::BadResponse(_))
            ),
            "{err:?}"
        );
        let mut s = start(&post("http://h/", &[], &[]));
        let mut endless = b"HTTP/1.1 200 OK\r\nx-long: ".to_vec();
        endless.resize(MAX_RESPONSE_HEAD_BYTES + 10, b'a');
        let (_, err) = feed(&mut s.exchange, &endless, 1000);
        assert_eq!(err, Some(ExchangeError::HeadTooLarge));

        let mut s = start(&post("http://h/", &[], &[]));
        let (events, err) = feed(&mut s.exchange, b"<html>Bad Gateway</html>\r\n\r\n", 5);
        assert!(
            matches!(err, Some(ExchangeError::BadResponse(_))),
            "{err:?}"
        );
        assert!(events.is_empty());
    }

    #[test]
    fn an_informational_answer_is_skipped_and_a_redirect_is_a_response_never_followed() {
        let mut s = start(&post("http://h/", &[], &[]));
        let (events, err) = feed(
            &mut s.exchange,
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 307 Temporary Redirect\r\nLocation: http://evil/\r\nContent-Length: 0\r\n\r\n",
            2,
        );
        assert_eq!(err, None);
        let HttpEvent::Head { status, headers } = &events[0] else {
            panic!("{events:?}");
        };
        assert_eq!(*status, 307);
        assert!(headers.contains(&("location".into(), "http://evil/".into())));
        assert_eq!(events.last(), Some(&HttpEvent::End));
    }

    proptest! {
        #[test]
        fn any_split_of_a_chunked_answer_gives_the_same_body(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..40), 0..8),
            split in 1usize..64,
        ) {
            let mut response = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            let mut body = Vec::new();
            for c in &chunks {
                response.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
                response.extend_from_slice(c);
                response.extend_from_slice(b"\r\n");
                body.extend_from_slice(c);
            }
            response.extend_from_slice(b"0\r\n\r\n");
            let mut s = start(&post("http://h/", &[], &[b"q"]));
            let (events, err) = feed(&mut s.exchange, &response, split);
            prop_assert_eq!(err, None);
            prop_assert_eq!(summary(&events), (Some(200), body, true));
            prop_assert!(s.exchange.reusable());
        }
    }
}
