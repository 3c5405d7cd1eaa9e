//! Against raw TCP servers, for what an HTTP mock cannot do: connections refused, closed or
//! reset without an answer, connects that never complete, and bodies that stall halfway. Each
//! server counts the connections it accepted, so the retries are visible.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use deepagents_core::model::{Model, ModelError};
use deepagents_models::http::{HttpConfig, Secret};
use deepagents_models::{ModelOptions, from_spec_with};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use crate::common::*;

/// What the server does with one connection.
#[derive(Clone, Debug)]
enum Conn {
    /// Reads the request, then closes the connection without a word.
    Close,
    /// Reads the request, then resets the connection (RST).
    Reset,
    /// Sends the headers and part of a JSON body, then goes silent.
    Stall,
    /// Answers with this status, content type and body.
    Answer(u16, &'static str, String),
}

struct RawServer {
    port: u16,
    accepts: Arc<AtomicUsize>,
}

impl RawServer {
    /// Serves connection `n` as `script[n]`; the last entry serves every later connection.
    async fn start(script: Vec<Conn>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepts = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepts);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let n = counter.fetch_add(1, Ordering::SeqCst);
                let conn = script.get(n).or(script.last()).cloned();
                tokio::spawn(serve(stream, conn));
            }
        });
        Self { port, accepts }
    }

    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    fn accepts(&self) -> usize {
        self.accepts.load(Ordering::SeqCst)
    }
}

/// Reads one HTTP/1.1 request: the head, then `content-length` bytes of body.
async fn read_request(stream: &mut TcpStream) {
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let Ok(n) = stream.read(&mut buf).await else {
            return;
        };
        if n == 0 {
            return;
        }
        raw.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&raw);
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if raw.len() >= end + 4 + length {
                return;
            }
        }
    }
}

async fn serve(mut stream: TcpStream, conn: Option<Conn>) {
    read_request(&mut stream).await;
    match conn {
        None | Some(Conn::Close) => {}
        Some(Conn::Reset) => {
            stream.set_zero_linger().unwrap();
        }
        Some(Conn::Stall) => {
            let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 400\r\n\r\n{\"choices\": [";
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.flush().await;
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        Some(Conn::Answer(status, content_type, body)) => {
            let response = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
    }
}

fn ok() -> Conn {
    Conn::Answer(
        200,
        "application/json",
        r#"{"choices": [{"message": {"role": "assistant", "content": "Fine."}, "finish_reason": "stop"}]}"#.to_owned(),
    )
}

fn ok_stream() -> Conn {
    Conn::Answer(
        200,
        "text/event-stream",
        "data: {\"choices\": [{\"index\": 0, \"delta\": {\"content\": \"Fine.\"}, \"finish_reason\": \"stop\"}]}\n\ndata: [DONE]\n\n".to_owned(),
    )
}

fn config() -> HttpConfig {
    HttpConfig {
        connect_timeout: Duration::from_millis(300),
        first_byte_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_millis(500),
        ..fast_config()
    }
}

fn chat(base_url: String, retries: u32) -> Arc<dyn Model> {
    from_spec_with(
        "openai_chat:gpt-4o",
        &ModelOptions {
            base_url: Some(base_url),
            api_key: Some(Secret::new(TEST_KEY)),
            http: Some(config()),
            max_retries: Some(retries),
            ..ModelOptions::default()
        },
    )
    .unwrap()
}

fn assert_gave_up(error: &ModelError, retries: &str) {
    assert!(matches!(error, ModelError::Transient { .. }), "{error:?}");
    assert!(error.is_retryable(), "{error:?}");
    assert!(
        error
            .to_string()
            .contains(&format!("gave up after {retries})")),
        "{error}"
    );
    assert!(!error.to_string().contains(TEST_KEY), "{error}");
}

#[tokio::test]
async fn refused_connections_are_retried_then_reported_as_transient() {
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let model = chat(format!("http://127.0.0.1:{port}/v1"), 2);
    let error = model.generate(&ask("hi")).await.unwrap_err();
    assert_gave_up(&error, "2 retries");
    assert!(
        error.to_string().contains("cannot reach openai_chat"),
        "{error}"
    );
    let (_, outcome) = stream_all(model.as_ref(), &ask("hi")).await;
    assert_gave_up(&outcome.unwrap_err(), "2 retries");
}

#[tokio::test]
async fn connections_closed_without_an_answer_are_retried_up_to_max_retries() {
    let server = RawServer::start(vec![Conn::Close, Conn::Close, ok()]).await;
    let model = chat(server.base_url(), 2);
    let response = model.generate(&ask("hi")).await.unwrap();
    assert_eq!(text_of(&response), "Fine.");
    assert_eq!(server.accepts(), 3, "two retries, then the answer");

    let server = RawServer::start(vec![Conn::Close]).await;
    let error = chat(server.base_url(), 2)
        .generate(&ask("hi"))
        .await
        .unwrap_err();
    assert_gave_up(&error, "2 retries");
    assert_eq!(server.accepts(), 3, "the first attempt and two retries");

    let server = RawServer::start(vec![Conn::Close, ok_stream()]).await;
    let (deltas, outcome) = stream_all(chat(server.base_url(), 2).as_ref(), &ask("hi")).await;
    assert_eq!(text_of(&outcome.unwrap()), "Fine.");
    assert_eq!(streamed_text(&deltas), "Fine.");
    assert_eq!(server.accepts(), 2);

    let server = RawServer::start(vec![Conn::Close]).await;
    let (_, outcome) = stream_all(chat(server.base_url(), 1).as_ref(), &ask("hi")).await;
    assert_gave_up(&outcome.unwrap_err(), "1 retry");
    assert_eq!(server.accepts(), 2);
}

#[tokio::test]
async fn reset_connections_are_retried_up_to_max_retries() {
    let server = RawServer::start(vec![Conn::Reset, ok()]).await;
    let response = chat(server.base_url(), 2)
        .generate(&ask("hi"))
        .await
        .unwrap();
    assert_eq!(text_of(&response), "Fine.");
    assert_eq!(server.accepts(), 2);

    let server = RawServer::start(vec![Conn::Reset]).await;
    let error = chat(server.base_url(), 2)
        .generate(&ask("hi"))
        .await
        .unwrap_err();
    assert_gave_up(&error, "2 retries");
    assert_eq!(server.accepts(), 3);

    let server = RawServer::start(vec![Conn::Reset]).await;
    let error = chat(server.base_url(), 0)
        .generate(&ask("hi"))
        .await
        .unwrap_err();
    assert!(matches!(error, ModelError::Transient { .. }), "{error:?}");
    assert_eq!(server.accepts(), 1, "max_retries 0 sends once");
}

#[tokio::test]
async fn a_connect_that_never_completes_hits_the_connect_timeout_and_is_retried() {
    // A listener whose accept queue is full drops further SYNs, so connects hang.
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(0).unwrap();
    let address = listener.local_addr().unwrap();
    let mut held = Vec::new();
    let mut hanging = false;
    for _ in 0..64 {
        match tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(address)).await {
            Ok(Ok(stream)) => held.push(stream),
            Ok(Err(e)) => panic!("cannot fill the accept queue: {e}"),
            Err(_) => {
                hanging = true;
                break;
            }
        }
    }
    assert!(hanging, "connects to a full accept queue should hang");

    let model = chat(format!("http://{address}/v1"), 2);
    let started = Instant::now();
    let error = model.generate(&ask("hi")).await.unwrap_err();
    let elapsed = started.elapsed();
    assert_gave_up(&error, "2 retries");
    let text = error.to_string();
    assert!(text.contains("cannot reach openai_chat"), "{text}");
    assert!(
        !text.contains("first-byte"),
        "the connect timeout fired: {text}"
    );
    // Three connects of 300 ms each; the 5 s first-byte timeout never came into play.
    assert!(
        elapsed >= Duration::from_millis(850) && elapsed < Duration::from_secs(4),
        "{elapsed:?}"
    );
    drop(listener);
}

#[tokio::test]
async fn a_body_that_stalls_hits_the_idle_timeout_and_is_retried() {
    let server = RawServer::start(vec![Conn::Stall, ok()]).await;
    let started = Instant::now();
    let response = chat(server.base_url(), 2)
        .generate(&ask("hi"))
        .await
        .unwrap();
    assert_eq!(text_of(&response), "Fine.");
    assert_eq!(server.accepts(), 2, "the stalled body was sent again");
    assert!(started.elapsed() >= Duration::from_millis(450));

    let server = RawServer::start(vec![Conn::Stall]).await;
    let started = Instant::now();
    let error = chat(server.base_url(), 2)
        .generate(&ask("hi"))
        .await
        .unwrap_err();
    assert_gave_up(&error, "2 retries");
    assert!(error.to_string().contains("idle timeout"), "{error}");
    assert_eq!(server.accepts(), 3);
    // Three stalls of 0.5 s, not the 5 s first-byte timeout.
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );

    // Retries of the request and of its body share one budget.
    let server = RawServer::start(vec![
        Conn::Answer(
            503,
            "application/json",
            r#"{"error": {"message": "busy"}}"#.to_owned(),
        ),
        Conn::Stall,
        ok(),
    ])
    .await;
    let error = chat(server.base_url(), 1)
        .generate(&ask("hi"))
        .await
        .unwrap_err();
    assert_gave_up(&error, "1 retry");
    assert!(error.to_string().contains("idle timeout"), "{error}");
    assert_eq!(server.accepts(), 2);
}
