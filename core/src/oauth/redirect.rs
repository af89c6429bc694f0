//! The loopback redirect (RFC 8252 §7.3): the runtime accepts a connection on
//! `127.0.0.1:<port>`, reads the request head (at most [`MAX_CALLBACK_HEAD_BYTES`]) and hands
//! it here; what to write back — a whole HTTP/1.1 response, after which the runtime closes the
//! connection — comes from [`callback_response`]. Parsing and the page are protocol work, so
//! they are in the core; the runtime only moves the bytes.

use super::flow::{CALLBACK_PATH, CallbackPage};
use crate::url::form_decode;

/// The most bytes of a request head the runtime reads from one loopback connection; a head
/// still unfinished then is answered `431` and closed.
pub(crate) const MAX_CALLBACK_HEAD_BYTES: usize = 8 * 1024;

/// What arrived at the loopback listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallbackRequest {
    /// `GET /callback?…`: the authorization answer's query parameters, decoded.
    Callback(Vec<(String, String)>),
    /// Another path (a browser's `/favicon.ico`, …): `404`.
    NotFound,
    /// Another method: `405`.
    WrongMethod,
    /// Not an HTTP request head (or over the size limit): `400`.
    Malformed,
}

/// Reads the request head `head` (the bytes up to and including the blank line; more or less
/// is tolerated).
pub(crate) fn parse_callback_head(head: &[u8]) -> CallbackRequest {
    if head.len() > MAX_CALLBACK_HEAD_BYTES {
        return CallbackRequest::Malformed;
    }
    let line_end = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    let Ok(line) = std::str::from_utf8(&head[..line_end]) else {
        return CallbackRequest::Malformed;
    };
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return CallbackRequest::Malformed;
    };
    if !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return CallbackRequest::Malformed;
    }
    if method != "GET" {
        return CallbackRequest::WrongMethod;
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    if path != CALLBACK_PATH {
        return CallbackRequest::NotFound;
    }
    CallbackRequest::Callback(form_decode(query))
}

/// What the listener answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallbackAnswer<'a> {
    /// The flow's verdict on a callback.
    Page(&'a CallbackPage),
    /// No authorization waits on this listener any more (it ended or timed out).
    Expired,
    /// What [`parse_callback_head`] refused.
    Refused(&'a CallbackRequest),
}

/// The whole HTTP/1.1 response to write (`Connection: close`, `Cache-Control: no-store`, a
/// small HTML page naming the MCP server `server`; peer text is HTML-escaped).
pub(crate) fn callback_response(answer: &CallbackAnswer<'_>, server: &str) -> Vec<u8> {
    let server = escape_html(server);
    let (status, title, text) = match answer {
        CallbackAnswer::Page(CallbackPage::Received) => (
            "200 OK",
            "Authorized",
            format!("buzz-agent is now authorized for the MCP server <b>{server}</b>. You can close this window."),
        ),
        CallbackAnswer::Page(CallbackPage::Refused(reason)) => (
            "200 OK",
            "Not authorized",
            format!(
                "buzz-agent was not authorized for the MCP server <b>{server}</b>: {}. You can close this window.",
                escape_html(reason)
            ),
        ),
        CallbackAnswer::Page(CallbackPage::Foreign) => (
            "400 Bad Request",
            "Unexpected answer",
            "This answer does not belong to the authorization buzz-agent is waiting for (its state does not match). Start again from the link buzz-agent gave.".to_owned(),
        ),
        CallbackAnswer::Expired => (
            "410 Gone",
            "Too late",
            format!("buzz-agent is no longer waiting for this authorization of <b>{server}</b>."),
        ),
        CallbackAnswer::Refused(CallbackRequest::NotFound | CallbackRequest::Callback(_)) => {
            ("404 Not Found", "Not found", "Nothing here.".to_owned())
        }
        CallbackAnswer::Refused(CallbackRequest::WrongMethod) => (
            "405 Method Not Allowed",
            "Not allowed",
            "Only GET is answered here.".to_owned(),
        ),
        CallbackAnswer::Refused(CallbackRequest::Malformed) => (
            "400 Bad Request",
            "Bad request",
            "Not an HTTP request.".to_owned(),
        ),
    };
    let body = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>buzz-agent: {title}</title></head><body><h1>{title}</h1><p>{text}</p></body></html>\n"
    );
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

/// `<`, `>`, `&`, `"` and `'` as entities.
fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(bytes: &[u8]) -> String {
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[test]
    fn the_callback_request_gives_its_decoded_parameters() {
        let head = b"GET /callback?code=a%2Bb&state=xyz HTTP/1.1\r\nHost: 127.0.0.1:5\r\n\r\n";
        assert_eq!(
            parse_callback_head(head),
            CallbackRequest::Callback(vec![
                ("code".into(), "a+b".into()),
                ("state".into(), "xyz".into())
            ])
        );
        assert_eq!(
            parse_callback_head(b"GET /callback HTTP/1.0\n\n"),
            CallbackRequest::Callback(vec![])
        );
    }

    #[test]
    fn other_requests_are_told_apart() {
        assert_eq!(
            parse_callback_head(b"GET /favicon.ico HTTP/1.1\r\n\r\n"),
            CallbackRequest::NotFound
        );
        assert_eq!(
            parse_callback_head(b"POST /callback HTTP/1.1\r\n\r\n"),
            CallbackRequest::WrongMethod
        );
        for bad in [
            &b""[..],
            b"hello",
            b"GET  HTTP/1.1\r\n",
            b"GET /callback SPDY/3\r\n",
            b"GET http://x/callback HTTP/1.1\r\n",
            b"\xff\xfe /callback HTTP/1.1\r\n",
        ] {
            assert_eq!(
                parse_callback_head(bad),
                CallbackRequest::Malformed,
                "{bad:?}"
            );
        }
        let huge = vec![b'a'; MAX_CALLBACK_HEAD_BYTES + 1];
        assert_eq!(parse_callback_head(&huge), CallbackRequest::Malformed);
    }

    #[test]
    fn responses_are_complete_http_and_escape_peer_text() {
        let r = text(&callback_response(
            &CallbackAnswer::Page(&CallbackPage::Received),
            "git<hub>",
        ));
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(r.contains("Connection: close\r\n") && r.contains("Cache-Control: no-store\r\n"));
        assert!(r.contains("git&lt;hub&gt;") && !r.contains("<hub>"));
        let (head, body) = r.split_once("\r\n\r\n").unwrap();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(length, body.len());
        let refused =
            CallbackPage::Refused("the authorization server refused: \"<script>\"".into());
        let r = text(&callback_response(&CallbackAnswer::Page(&refused), "s"));
        assert!(
            r.contains("&lt;script&gt;") && !r.contains("<script>"),
            "{r}"
        );
        let r = text(&callback_response(
            &CallbackAnswer::Page(&CallbackPage::Foreign),
            "s",
        ));
        assert!(r.starts_with("HTTP/1.1 400 "));
        assert!(
            text(&callback_response(&CallbackAnswer::Expired, "s")).starts_with("HTTP/1.1 410 ")
        );
        assert!(
            text(&callback_response(
                &CallbackAnswer::Refused(&CallbackRequest::NotFound),
                "s"
            ))
            .starts_with("HTTP/1.1 404 ")
        );
        assert!(
            text(&callback_response(
                &CallbackAnswer::Refused(&CallbackRequest::WrongMethod),
                "s"
            ))
            .starts_with("HTTP/1.1 405 ")
        );
        assert!(
            text(&callback_response(
                &CallbackAnswer::Refused(&CallbackRequest::Malformed),
                "s"
            ))
            .starts_with("HTTP/1.1 400 ")
        );
    }
}
