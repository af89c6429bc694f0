//! LLM calls (SPEC L5–L8, C24): one [`LlmAttempt`] is the state of one HTTP call while it
//! streams — status, error body, body size cap, the route's stream decoder — and turns each
//! [`LlmEvent`] into a [`Step`] for the turn to act on. [`LlmCalls`] is the table of calls in
//! flight (call → session), the seeded backoff jitter and what the provider taught the agent.

use crate::config::ProviderKind;
use crate::ids::{LlmCallId, SessionId};
use crate::io::{Action, LlmEvent};
use crate::llm::Learned;
use crate::llm::{LlmResponse, StreamDecoder, StreamDelta, StreamError};
use crate::outbox::Outbox;
use std::collections::BTreeMap;

/// Bytes of a failed response body kept for the error message (SPEC A3).
pub const ERROR_BODY_CAP: usize = 4096;
/// Longest successful response body an attempt reads, in bytes (256 MiB): a provider that
/// streams without end (an endless answer, a loop of deltas) cannot grow the response held in
/// memory without bound; the attempt fails, not retried. A real response, even 128k output
/// tokens in Chat SSE framing, is a few tens of MiB.
pub const MAX_RESPONSE_BODY_BYTES: u64 = 256 * 1024 * 1024;
/// How long to wait for more bytes once the decoder has the whole answer (case C24 b), in ms.
pub(crate) const FINAL_ANSWER_GRACE_MS: u64 = 1500;

/// Bytes of a 2xx body kept to recognise (and quote) a JSON body where a stream was expected.
const BODY_HEAD_BYTES: usize = 512;

/// What an LLM call is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallPurpose {
    /// A round of the loop (history + tools).
    Round,
    /// A compaction summary (no tools, never streamed to the client; SPEC K1).
    Summary,
}

/// What one event did to an attempt, for the turn to act on.
pub(crate) enum Step {
    /// The head was stored, or an error body collected: nothing to do.
    Nothing,
    /// A 2xx body grew over [`MAX_RESPONSE_BODY_BYTES`]: the attempt fails, not retried.
    TooLarge,
    /// Body bytes were decoded: stream `deltas`; `grace_started` when the decoder now has the
    /// whole answer but the stream did not end (C24 b); `result` is whether the stream's own
    /// terminator was seen, or the decoder's (sticky) error.
    Fed {
        deltas: Vec<StreamDelta>,
        grace_started: bool,
        result: Result<bool, StreamError>,
    },
    /// The body ended cleanly; `status` is `None` when no head came.
    Ended {
        status: Option<u16>,
        headers: Vec<(String, String)>,
        error_body: Vec<u8>,
    },
    /// The connection broke (`message`). `answer`: a 2xx body the decoder accepts as complete
    /// is the answer anyway (C24 a), with its last deltas.
    Broken {
        message: String,
        answer: Option<(LlmResponse, Vec<StreamDelta>)>,
    },
}

/// One attempt of one LLM call, while it streams.
pub(crate) struct LlmAttempt {
    call: LlmCallId,
    purpose: CallPurpose,
    /// 1 for the first attempt of a call, +1 per retry (SPEC L5).
    attempt: u32,
    status: Option<u16>,
    headers: Vec<(String, String)>,
    /// The first [`ERROR_BODY_CAP`] bytes of a non-2xx body.
    error_body: Vec<u8>,
    /// Bytes of a 2xx body read so far.
    body_bytes: u64,
    decoder: Box<dyn StreamDecoder>,
    /// The route that built the request (its error reaction and what it learns apply).
    route: ProviderKind,
    /// `POST <url>`: named in every failure (issue 12: a missing `/v1` shows as a 404 on
    /// `…/chat/completions`).
    url: String,
    /// The first [`BODY_HEAD_BYTES`] of a 2xx body, to tell a JSON body from a stream.
    body_head: Vec<u8>,
    /// Whether any text of this response reached the client (no retry after that, SPEC L5).
    streamed: bool,
    /// The decoder has the whole answer but the stream did not end (C24 b).
    grace: bool,
}

impl LlmAttempt {
    /// Attempt number `attempt` of call `call` to `url` on `route`, decoding with `decoder`.
    pub(crate) fn new(
        call: LlmCallId,
        purpose: CallPurpose,
        attempt: u32,
        route: ProviderKind,
        url: String,
        decoder: Box<dyn StreamDecoder>,
    ) -> LlmAttempt {
        LlmAttempt {
            call,
            purpose,
            attempt,
            route,
            url,
            body_head: Vec::new(),
            status: None,
            headers: Vec::new(),
            error_body: Vec::new(),
            body_bytes: 0,
            decoder,
            streamed: false,
            grace: false,
        }
    }

    /// The call.
    pub(crate) fn call(&self) -> LlmCallId {
        self.call
    }

    /// What the call is for.
    pub(crate) fn purpose(&self) -> CallPurpose {
        self.purpose
    }

    /// The attempt number (from 1).
    pub(crate) fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The route that built the request.
    pub(crate) fn route(&self) -> ProviderKind {
        self.route
    }

    /// The request as failures name it: `POST <url>`, the URL's credentials redacted (SPEC S2).
    pub(crate) fn target(&self) -> String {
        format!("POST {}", crate::text::redact_url(&self.url))
    }

    /// Whether text of this response already reached the client.
    pub(crate) fn streamed(&self) -> bool {
        self.streamed
    }

    /// Whether the answer is whole and only the stream's end is awaited (C24 b).
    pub(crate) fn in_grace(&self) -> bool {
        self.grace
    }

    /// Feeds one event of the call.
    pub(crate) fn on_event(&mut self, event: LlmEvent) -> Step {
        match event {
            LlmEvent::Head { status, headers } => {
                self.status = Some(status);
                self.headers = headers;
                Step::Nothing
            }
            LlmEvent::Body(bytes) => {
                if self.status.is_some_and(|s| !(200..300).contains(&s)) {
                    let room = ERROR_BODY_CAP.saturating_sub(self.error_body.len());
                    self.error_body
                        .extend_from_slice(&bytes[..bytes.len().min(room)]);
                    return Step::Nothing;
                }
                self.body_bytes = self
                    .body_bytes
                    .saturating_add(u64::try_from(bytes.len()).unwrap_or(u64::MAX));
                if self.body_bytes > MAX_RESPONSE_BODY_BYTES {
                    return Step::TooLarge;
                }
                let room = BODY_HEAD_BYTES.saturating_sub(self.body_head.len());
                self.body_head
                    .extend_from_slice(&bytes[..bytes.len().min(room)]);
                let mut deltas = Vec::new();
                let res = self.decoder.feed(&bytes, &mut deltas);
                // A summary call (K1) is internal: nothing of it reaches the client.
                if !deltas.is_empty() && self.purpose == CallPurpose::Round {
                    self.streamed = true;
                }
                let complete = self.decoder.is_complete();
                let grace_started = !complete && self.decoder.has_final_answer();
                if grace_started {
                    self.grace = true;
                }
                Step::Fed {
                    deltas,
                    grace_started,
                    result: res.map(|()| complete),
                }
            }
            LlmEvent::End => Step::Ended {
                status: self.status,
                headers: std::mem::take(&mut self.headers),
                error_body: std::mem::take(&mut self.error_body),
            },
            LlmEvent::Failed(message) => {
                let ok = self.status.is_some_and(|s| (200..300).contains(&s));
                let answer = if ok {
                    let mut deltas = Vec::new();
                    self.decoder
                        .finish(&mut deltas)
                        .ok()
                        .map(|resp| (resp, deltas))
                } else {
                    None
                };
                Step::Broken { message, answer }
            }
        }
    }

    /// The stream is over: the decoder's last deltas and the whole response, or why it is not
    /// one.
    pub(crate) fn finish(&mut self) -> (Vec<StreamDelta>, Result<LlmResponse, StreamError>) {
        let mut deltas = Vec::new();
        let res = self.decoder.finish(&mut deltas);
        let res = match res {
            Err(StreamError::Truncated(why)) => {
                Err(self.not_a_stream().unwrap_or(StreamError::Truncated(why)))
            }
            other => other,
        };
        (deltas, res)
    }

    /// Issue 12: a 2xx body that is JSON (a non-streaming answer, a gateway's error object),
    /// not an event stream, says so, with the provider's message or the body's start; not
    /// retried (the same request gets the same body).
    fn not_a_stream(&self) -> Option<StreamError> {
        let text = String::from_utf8_lossy(&self.body_head);
        let trimmed = text.trim_start_matches(|c: char| c.is_whitespace() || c == '\u{feff}');
        let json_type = self
            .headers
            .iter()
            .any(|(k, v)| k.eq_ignore_ascii_case("content-type") && v.contains("json"));
        if !(trimmed.starts_with('{') || trimmed.starts_with('[') || json_type) {
            return None;
        }
        let detail = crate::llm::error_message(trimmed.as_bytes());
        let detail = crate::text::utf8_prefix(&detail, 300);
        Some(StreamError::NotAStream(format!(
            "{} answered with a JSON body where an event stream was expected (a streaming endpoint answers text/event-stream): {detail}",
            self.target()
        )))
    }
}

/// The LLM calls in flight and what outlives them.
#[derive(Debug)]
pub(crate) struct LlmCalls {
    in_flight: BTreeMap<LlmCallId, SessionId>,
    /// xorshift64* state for the backoff jitter, from `Config::seed` (DESIGN I12).
    rng: u64,
    /// What the provider taught us while running, kept for the process (SPEC L7 C41, L10).
    pub(crate) learned: Learned,
}

impl LlmCalls {
    /// No call in flight; jitter seeded from `seed`.
    pub(crate) fn new(seed: u64) -> LlmCalls {
        let rng = seed ^ 0x9e37_79b9_7f4a_7c15;
        LlmCalls {
            in_flight: BTreeMap::new(),
            rng: if rng == 0 { 1 } else { rng },
            learned: Learned::default(),
        }
    }

    /// Call `call` of `session` started.
    pub(crate) fn insert(&mut self, call: LlmCallId, session: SessionId) {
        self.in_flight.insert(call, session);
    }

    /// The session of a call in flight (events of released calls find none).
    pub(crate) fn session_of(&self, call: LlmCallId) -> Option<SessionId> {
        self.in_flight.get(&call).copied()
    }

    /// Forget `call` and ask the runtime to drop it (done or abandoned); whether it was in
    /// flight.
    pub(crate) fn release(&mut self, call: LlmCallId, out: &mut Outbox) -> bool {
        if self.in_flight.remove(&call).is_some() {
            out.push(Action::CancelLlm { call });
            true
        } else {
            false
        }
    }

    /// Drop every call (shutdown).
    pub(crate) fn release_all(&mut self, out: &mut Outbox) {
        for call in std::mem::take(&mut self.in_flight).into_keys() {
            out.push(Action::CancelLlm { call });
        }
    }

    /// The delay before attempt `attempt + 1`, in ms (SPEC L5): 0.5 s · 2^(attempt−1), capped
    /// at 8 s, with ±25 % jitter.
    pub(crate) fn backoff_ms(&mut self, attempt: u32) -> u64 {
        let base = 500u64
            .saturating_mul(1u64 << (attempt.saturating_sub(1)).min(5))
            .min(8000);
        let r = self.next_random() % 1000;
        (base * (750 + r / 2) / 1000).min(8000)
    }

    /// xorshift64*.
    fn next_random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, ProviderKind};

    fn attempt(purpose: CallPurpose) -> LlmAttempt {
        let cfg = Config::for_tests(ProviderKind::OpenAiChat, "http://h/v1");
        LlmAttempt::new(
            LlmCallId(1),
            purpose,
            1,
            cfg.provider,
            "http://h/v1/chat/completions".into(),
            crate::llm::route(cfg.provider).decoder("call_1".into()),
        )
    }

    fn chunk(text: &str) -> Vec<u8> {
        format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n")
            .into_bytes()
    }

    const STOP: &[u8] =
        b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";

    #[test]
    fn l5_a_streamed_round_is_marked_and_a_summary_never_is() {
        for (purpose, streamed) in [(CallPurpose::Round, true), (CallPurpose::Summary, false)] {
            let mut a = attempt(purpose);
            a.on_event(LlmEvent::Head {
                status: 200,
                headers: vec![],
            });
            let Step::Fed { deltas, result, .. } = a.on_event(LlmEvent::Body(chunk("Hi"))) else {
                panic!("body bytes are fed");
            };
            assert_eq!(deltas, vec![StreamDelta::Text("Hi".into())]);
            assert_eq!(result.ok(), Some(false), "not complete yet");
            assert_eq!(a.streamed(), streamed, "{purpose:?}");
        }
    }

    #[test]
    fn c24_a_whole_answer_without_the_stream_end_starts_the_grace() {
        let mut a = attempt(CallPurpose::Round);
        a.on_event(LlmEvent::Head {
            status: 200,
            headers: vec![],
        });
        let Step::Fed {
            grace_started,
            result,
            ..
        } = a.on_event(LlmEvent::Body(STOP.to_vec()))
        else {
            panic!("fed");
        };
        assert!(
            grace_started && a.in_grace(),
            "finish_reason seen, no [DONE] yet"
        );
        assert_eq!(result.ok(), Some(false));
        let Step::Fed { result, .. } = a.on_event(LlmEvent::Body(b"data: [DONE]\n\n".to_vec()))
        else {
            panic!("fed");
        };
        assert_eq!(result.ok(), Some(true), "the terminator completes it");
        let (_, resp) = a.finish();
        assert!(resp.is_ok());
    }

    #[test]
    fn c24_a_broken_connection_after_a_whole_answer_keeps_the_answer() {
        let mut a = attempt(CallPurpose::Round);
        a.on_event(LlmEvent::Head {
            status: 200,
            headers: vec![],
        });
        a.on_event(LlmEvent::Body(chunk("done")));
        a.on_event(LlmEvent::Body(STOP.to_vec()));
        let Step::Broken { message, answer } = a.on_event(LlmEvent::Failed("reset".into())) else {
            panic!("broken");
        };
        assert_eq!(message, "reset");
        assert_eq!(answer.map(|(r, _)| r.text), Some("done".to_string()));
        let mut b = attempt(CallPurpose::Round);
        b.on_event(LlmEvent::Head {
            status: 200,
            headers: vec![],
        });
        b.on_event(LlmEvent::Body(chunk("half")));
        let Step::Broken { answer, .. } = b.on_event(LlmEvent::Failed("reset".into())) else {
            panic!("broken");
        };
        assert!(
            answer.is_none(),
            "an unfinished answer is a transport error"
        );
    }

    #[test]
    fn a3_an_error_body_is_kept_up_to_its_cap_with_the_head() {
        let mut a = attempt(CallPurpose::Round);
        a.on_event(LlmEvent::Head {
            status: 429,
            headers: vec![("retry-after".into(), "2".into())],
        });
        assert!(matches!(
            a.on_event(LlmEvent::Body(vec![b'x'; ERROR_BODY_CAP + 10])),
            Step::Nothing
        ));
        let Step::Ended {
            status,
            headers,
            error_body,
        } = a.on_event(LlmEvent::End)
        else {
            panic!("ended");
        };
        assert_eq!(status, Some(429));
        assert_eq!(headers[0].0, "retry-after");
        assert_eq!(error_body.len(), ERROR_BODY_CAP);
    }

    #[test]
    fn l5_backoff_doubles_from_half_a_second_with_a_quarter_of_jitter_and_caps_at_8_s() {
        let mut calls = LlmCalls::new(7);
        for (attempt, base) in [(1u32, 500u64), (2, 1000), (3, 2000), (4, 4000), (5, 8000)] {
            let d = calls.backoff_ms(attempt);
            assert!(
                d >= base * 3 / 4 && d <= (base * 5 / 4).min(8000),
                "{attempt}: {d}"
            );
        }
        assert!(calls.backoff_ms(30) <= 8000);
        let (mut a, mut b) = (LlmCalls::new(7), LlmCalls::new(7));
        assert_eq!(
            (1..6).map(|k| a.backoff_ms(k)).collect::<Vec<_>>(),
            (1..6).map(|k| b.backoff_ms(k)).collect::<Vec<_>>(),
            "I12: the same seed gives the same delays"
        );
    }

    #[test]
    fn a_released_call_is_dropped_once_and_its_events_find_no_session() {
        let mut calls = LlmCalls::new(0);
        let mut out = Outbox::new(crate::config::LogLevel::Info, crate::time::MonoTime::ZERO);
        calls.insert(LlmCallId(4), SessionId(2));
        assert_eq!(calls.session_of(LlmCallId(4)), Some(SessionId(2)));
        assert!(calls.release(LlmCallId(4), &mut out));
        assert!(!calls.release(LlmCallId(4), &mut out));
        assert_eq!(calls.session_of(LlmCallId(4)), None);
        assert_eq!(out.pop(), Some(Action::CancelLlm { call: LlmCallId(4) }));
        assert_eq!(out.pop(), None);
    }

    /// The attempt after a 200 head with `headers` and `body`, finished.
    fn finish_after(headers: &[(&str, &str)], body: &[u8]) -> Result<LlmResponse, StreamError> {
        let mut a = attempt(CallPurpose::Round);
        a.on_event(LlmEvent::Head {
            status: 200,
            headers: headers
                .iter()
                .map(|&(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        });
        a.on_event(LlmEvent::Body(body.to_vec()));
        a.finish().1
    }

    #[test]
    fn a3_a_json_body_where_a_stream_was_expected_says_so_with_the_provider_s_message() {
        let expected = |detail: &str| {
            Err(StreamError::NotAStream(format!(
                "POST http://h/v1/chat/completions answered with a JSON body where an event \
                 stream was expected (a streaming endpoint answers text/event-stream): {detail}"
            )))
        };
        // Recognised by its first character, after a BOM and blanks, whatever the headers.
        assert_eq!(
            finish_after(
                &[],
                "\u{feff} \n{\"error\":{\"message\":\"no such model\"}}".as_bytes()
            ),
            expected("no such model")
        );
        assert_eq!(finish_after(&[], b"[1,2]"), expected("[1,2]"));
        // Or by its content type, whatever the first character.
        assert_eq!(
            finish_after(
                &[("Content-Type", "application/json; charset=utf-8")],
                b"upstream failed"
            ),
            expected("upstream failed")
        );
        let long = format!("{{\"message\":\"{}\"}}", "m".repeat(400));
        assert_eq!(
            finish_after(&[], long.as_bytes()),
            expected(&"m".repeat(300)),
            "the message is cut to 300 bytes"
        );
        assert!(!expected("").unwrap_err().is_retryable());
    }

    #[test]
    fn c24_a_cut_event_stream_stays_a_truncated_stream() {
        // An event stream's own content type, or none, and a body that starts as a stream.
        for headers in [
            &[("content-type", "text/event-stream")][..],
            &[("x-json", "application/json")][..],
            &[][..],
        ] {
            let res = finish_after(headers, &chunk("half"));
            assert!(
                matches!(res, Err(StreamError::Truncated(_))),
                "{headers:?}: {res:?}"
            );
        }
    }

    #[test]
    fn c52_a_successful_body_is_read_up_to_256_mib_and_a_byte_more_is_too_large() {
        let mut a = attempt(CallPurpose::Round);
        a.on_event(LlmEvent::Head {
            status: 200,
            headers: vec![],
        });
        // A 16 MiB line without an end fails the decoder (sticky), so the rest is counted,
        // not parsed; zeroed pages cost no memory until read.
        let first = 16 * 1024 * 1024 + 1;
        assert!(matches!(
            a.on_event(LlmEvent::Body(vec![0u8; first])),
            Step::Fed { result: Err(_), .. }
        ));
        let rest = usize::try_from(256 * 1024 * 1024 - first as u64).unwrap();
        assert!(
            matches!(
                a.on_event(LlmEvent::Body(vec![0u8; rest])),
                Step::Fed { .. }
            ),
            "exactly 256 MiB is read"
        );
        assert!(
            matches!(a.on_event(LlmEvent::Body(vec![0u8; 1])), Step::TooLarge),
            "one byte more is too large"
        );
    }

    #[test]
    fn l5_i12_the_backoff_of_a_seed_is_the_same_in_every_build_and_its_jitter_spreads() {
        let mut calls = LlmCalls::new(7);
        assert_eq!(
            (1..=4).map(|k| calls.backoff_ms(k)).collect::<Vec<_>>(),
            vec![456, 1194, 1534, 3332],
            "xorshift64* from the seed: known answers"
        );
        let firsts: Vec<u64> = (0..100).map(|s| LlmCalls::new(s).backoff_ms(1)).collect();
        assert!(firsts.iter().all(|d| (375..=625).contains(d)), "{firsts:?}");
        let (min, max) = (firsts.iter().min(), firsts.iter().max());
        assert!(
            min < Some(&400) && max > Some(&600),
            "the jitter spans ±25 %: {min:?}..{max:?}"
        );
    }

    #[test]
    fn p1_at_shutdown_every_call_in_flight_is_dropped_once() {
        let mut calls = LlmCalls::new(0);
        let mut out = Outbox::new(crate::config::LogLevel::Info, crate::time::MonoTime::ZERO);
        calls.insert(LlmCallId(3), SessionId(1));
        calls.insert(LlmCallId(5), SessionId(2));
        calls.release_all(&mut out);
        assert_eq!(out.pop(), Some(Action::CancelLlm { call: LlmCallId(3) }));
        assert_eq!(out.pop(), Some(Action::CancelLlm { call: LlmCallId(5) }));
        assert_eq!(out.pop(), None);
        assert_eq!(calls.session_of(LlmCallId(5)), None);
        assert!(!calls.release(LlmCallId(3), &mut out), "already dropped");
    }

    #[test]
    fn c24_the_grace_starts_only_while_a_whole_answer_waits_for_its_stream_end() {
        let mut a = attempt(CallPurpose::Round);
        a.on_event(LlmEvent::Head {
            status: 200,
            headers: vec![],
        });
        let grace = |step: Step| {
            let Step::Fed { grace_started, .. } = step else {
                panic!("body bytes are fed");
            };
            grace_started
        };
        assert!(!grace(a.on_event(LlmEvent::Body(chunk("Hi")))), "text: no");
        assert!(!a.in_grace());
        let whole = [STOP, b"data: [DONE]\n\n"].concat();
        assert!(
            !grace(a.on_event(LlmEvent::Body(whole))),
            "the answer and its terminator together: no grace"
        );
        assert!(!a.in_grace());
    }
}
