//! Provider client overheads, each measured against a trivial baseline in the same run so the
//! ratios hold across machines:
//!
//! - SSE parsing: our incremental parser, and parser + Anthropic event decoding, against a bare
//!   newline scan of the same bytes.
//! - Per request: a `generate` call through the whole client (request building, retry wrapper,
//!   response parsing) against a raw reqwest POST of the same body, both to a local server.
//!
//! Run with `cargo bench -p deepagents-models`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use deepagents_core::Message;
use deepagents_core::model::ModelRequest;
use deepagents_models::anthropic::AnthropicWire;
use deepagents_models::http::sse::SseParser;
use deepagents_models::http::{HttpConfig, Secret};
use deepagents_models::openai_chat::ChatWire;
use deepagents_models::provider::Wire;
use deepagents_models::{ModelOptions, from_spec_with};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn anthropic_stream(target_bytes: usize) -> Vec<u8> {
    let mut out = String::new();
    out.push_str("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10}}}\n\n");
    out.push_str("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n");
    let delta = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"the quick brown fox \"}}\n\n";
    while out.len() < target_bytes {
        out.push_str(delta);
    }
    out.push_str("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":5}}\n\n");
    out.push_str("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    out.into_bytes()
}

/// Best of `rounds` timings of `f`.
fn best(rounds: usize, mut f: impl FnMut()) -> Duration {
    (0..rounds)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .min()
        .unwrap()
}

fn mb_per_s(bytes: usize, time: Duration) -> f64 {
    bytes as f64 / 1e6 / time.as_secs_f64()
}

fn sse_throughput() {
    let body = anthropic_stream(16 << 20);
    let chunk = 16 * 1024;
    let baseline = best(5, || {
        let mut lines = 0usize;
        for piece in body.chunks(chunk) {
            lines += piece.iter().filter(|b| **b == b'\n').count();
        }
        black_box(lines);
    });
    let parse = best(5, || {
        let mut parser = SseParser::new();
        let mut events = Vec::new();
        let mut count = 0;
        for piece in body.chunks(chunk) {
            parser.feed(piece, &mut events);
            count += events.len();
            events.clear();
        }
        black_box(count);
    });
    let wire = AnthropicWire {
        base_url: String::new(),
        model: "m".into(),
        default_max_tokens: 1,
        prompt_caching: false,
        reasoning: None,
        modalities: deepagents_core::model::InputModalities::ALL,
    };
    let decode = best(5, || {
        let mut parser = SseParser::new();
        let mut decoder = wire.decoder();
        let mut events = Vec::new();
        let mut done = false;
        for piece in body.chunks(chunk) {
            parser.feed(piece, &mut events);
            for event in events.drain(..) {
                let step = decoder.event(&event).unwrap();
                done |= step.done.is_some();
                black_box(step.deltas);
            }
        }
        assert!(done);
    });
    let n = body.len();
    println!(
        "SSE, {:.1} MB of Anthropic text deltas in 16 KiB chunks (best of 5):",
        n as f64 / 1e6
    );
    println!(
        "  baseline newline scan      {:>9.0} MB/s",
        mb_per_s(n, baseline)
    );
    println!(
        "  SseParser                  {:>9.0} MB/s  ({:.1}x the baseline's time)",
        mb_per_s(n, parse),
        parse.as_secs_f64() / baseline.as_secs_f64()
    );
    println!(
        "  SseParser + event decoding {:>9.0} MB/s  ({:.1}x the baseline's time)",
        mb_per_s(n, decode),
        decode.as_secs_f64() / baseline.as_secs_f64()
    );
}

/// A local HTTP/1.1 server answering every request with one Chat Completions response.
async fn serve() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let body = json!({"choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                      "usage": {"prompt_tokens": 5, "completion_tokens": 1}})
    .to_string();
    let response = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let response = response.clone();
            tokio::spawn(async move {
                let mut buffer = vec![0u8; 64 * 1024];
                let mut pending = Vec::new();
                loop {
                    let n = match socket.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    pending.extend_from_slice(&buffer[..n]);
                    // One response per complete request (headers + content-length body).
                    while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&pending[..end]).to_ascii_lowercase();
                        let length: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse().unwrap());
                        if pending.len() < end + 4 + length {
                            break;
                        }
                        pending.drain(..end + 4 + length);
                        if socket.write_all(response.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    port
}

fn request_overhead() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let port = serve().await;
        let base = format!("http://127.0.0.1:{port}/v1");
        let model = from_spec_with(
            "openai_chat:gpt-4o",
            &ModelOptions {
                base_url: Some(base.clone()),
                api_key: Some(Secret::new("sk-bench")),
                http: Some(HttpConfig::default()),
                ..ModelOptions::default()
            },
        )
        .unwrap();
        let request = ModelRequest {
            system_prompt: Some("You are terse.".into()),
            messages: vec![Message::user("hello"); 20].into(),
            ..ModelRequest::default()
        };
        let client = deepagents_models::http_client().build().expect("an HTTP client");
        // The baseline sends the very body the client would build, prepared once.
        let wire = ChatWire {
            provider: "openai_chat".into(),
            base_url: base.clone(),
            model: "gpt-4o".into(),
            stream_usage: true,
            extra_headers: Vec::new(),
            reasoning: None,
            modalities: deepagents_core::model::InputModalities::ALL,
            max_output_tokens: None,
            legacy_max_tokens: false,
        };
        let body = serde_json::to_vec(&wire.request(&request, false).unwrap().1).unwrap();
        let n = 2000;
        let mut raw_best = Duration::MAX;
        let mut ours_best = Duration::MAX;
        for _ in 0..3 {
            let start = Instant::now();
            for _ in 0..n {
                let response = client
                    .post(format!("{base}/chat/completions"))
                    .header("content-type", "application/json")
                    .header("authorization", "Bearer sk-bench")
                    .body(body.clone())
                    .send()
                    .await
                    .unwrap();
                let bytes = response.bytes().await.unwrap();
                black_box(serde_json::from_slice::<serde_json::Value>(&bytes).unwrap());
            }
            raw_best = raw_best.min(start.elapsed());
            let start = Instant::now();
            for _ in 0..n {
                black_box(model.generate(&request).await.unwrap());
            }
            ours_best = ours_best.min(start.elapsed());
        }
        let per = |d: Duration| d.as_secs_f64() * 1e6 / n as f64;
        println!("Per request, {n} sequential calls to a local server (best of 3):");
        println!("  baseline raw reqwest POST  {:>7.1} µs", per(raw_best));
        println!(
            "  model.generate             {:>7.1} µs  ({:.2}x the baseline; +{:.1} µs for building, retry wrapper and parsing)",
            per(ours_best),
            ours_best.as_secs_f64() / raw_best.as_secs_f64(),
            per(ours_best) - per(raw_best)
        );
    });
}

fn main() {
    sse_throughput();
    request_overhead();
}
