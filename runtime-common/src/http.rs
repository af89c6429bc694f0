//! LLM HTTP on a blocking thread with `ureq`, streaming the body back as inputs (DESIGN:
//! "HTTP goes through ureq on a blocking thread that streams body chunks back as inputs").
//! Idle timeouts, retries and parsing live in the core; this only moves bytes.
//!
//! Memory: the response head must fit ureq's input buffer (`HTTP_INPUT_BUF`, 32 KiB; a longer
//! head is an error), and the body is read in `READ_CHUNK` (16 KiB) pieces that go to the loop
//! as they arrive (no `read_to_end`, no line splitting here), through the loop's bounded input
//! channel: an endless body or an endless SSE line costs this thread one chunk, and the queue at
//! most its capacity. Lines are the core's business (its SSE decoder caps them).

use crate::runtime::InputSender;
use buzz_agent_core::HttpRequest;
use buzz_agent_core::{Input, LlmCallId, LlmEvent};
use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Read buffer size per body read, in bytes.
const READ_CHUNK: usize = 16 * 1024;

/// Starts `request` on a new thread; its events go to `tx` (the thread blocks while the loop's
/// input queue is full). Setting the returned flag makes the thread stop at its next read (the
/// core ignores anything it still sends).
///
/// # Errors
/// When no thread can be started: the `Input` reporting the call as failed (retryable, SPEC L5),
/// for the loop to handle.
pub fn start(
    agent: &ureq::Agent,
    call: LlmCallId,
    request: HttpRequest,
    tx: &InputSender,
) -> Result<Arc<AtomicBool>, Input> {
    let cancelled = Arc::new(AtomicBool::new(false));
    let flag = cancelled.clone();
    let agent = agent.clone();
    let tx = tx.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("llm-{}", call.0))
        .spawn(move || {
            let emit = |event: LlmEvent| tx.send_blocking(Input::Llm { call, event }).is_ok();
            let mut req = agent.post(&request.url);
            for (k, v) in &request.headers {
                req = req.header(k.as_str(), v.as_str());
            }
            let resp = match req.send(&request.body[..]) {
                Ok(r) => r,
                Err(e) => {
                    emit(LlmEvent::Failed(e.to_string()));
                    return;
                }
            };
            if flag.load(Ordering::Relaxed) {
                return;
            }
            let status = resp.status().as_u16();
            let headers = resp
                .headers()
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().to_ascii_lowercase(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect();
            if !emit(LlmEvent::Head { status, headers }) {
                return;
            }
            let mut reader = resp.into_body().into_reader();
            let mut buf = vec![0u8; READ_CHUNK];
            loop {
                if flag.load(Ordering::Relaxed) {
                    return;
                }
                match reader.read(&mut buf) {
                    Ok(0) => {
                        emit(LlmEvent::End);
                        return;
                    }
                    Ok(n) => {
                        if !emit(LlmEvent::Body(buf[..n].to_vec())) {
                            return;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        emit(LlmEvent::Failed(e.to_string()));
                        return;
                    }
                }
            }
        });
    match spawned {
        Ok(_) => Ok(cancelled),
        Err(e) => Err(Input::Llm {
            call,
            event: LlmEvent::Failed(format!("could not start an LLM thread: {e}")),
        }),
    }
}

/// ureq's input buffer per connection, in bytes. It must hold the whole response head (ureq does
/// not grow it), so it is also the response-head limit; 32 KiB is far above what LLM providers
/// send. ureq's default (128 KiB, zero-filled per connection) was the largest heap item.
const HTTP_INPUT_BUF: usize = 32 * 1024;
/// ureq's output buffer per connection (request head, then the body streamed through it).
const HTTP_OUTPUT_BUF: usize = 16 * 1024;

/// The shared HTTP agent: status codes are data (the core classifies them), reads time out a
/// little after the core's own idle timeout so an abandoned thread never lives forever.
#[must_use]
pub fn agent(idle_timeout_ms: u64) -> ureq::Agent {
    let per_read = Duration::from_millis(idle_timeout_ms.saturating_add(5_000));
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_per_read(Some(per_read))
        .input_buffer_size(HTTP_INPUT_BUF)
        .max_response_header_size(HTTP_INPUT_BUF)
        .output_buffer_size(HTTP_OUTPUT_BUF)
        .build()
        .into()
}
