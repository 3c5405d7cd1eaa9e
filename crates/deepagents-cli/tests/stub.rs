//! A tiny Chat Completions server for the CLI tests: it answers every request and keeps the
//! request bodies, so a test can check what the CLI sent.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

/// A tiny Chat Completions server answering `answer` to every request (or `status` with an
/// error body when that is not 200); keeps the request bodies.
pub struct Stub {
    /// Its base URL, `http://127.0.0.1:PORT/v1`.
    pub url: String,
    /// The JSON bodies of the requests it received, in order.
    pub bodies: Arc<Mutex<Vec<Value>>>,
}

pub fn stub(answer: &'static str, status: u16) -> Stub {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let seen = bodies.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let _ = answer_one(stream, answer, status, &seen);
        }
    });
    Stub { url, bodies }
}

fn answer_one(
    stream: TcpStream,
    answer: &str,
    status: u16,
    seen: &Mutex<Vec<Value>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut length = 0;
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    if request_line.starts_with("GET ") {
        // Questions such as a local server's window (`/v1/models`, `/props`) go unanswered.
        let mut stream = stream;
        write!(
            stream,
            "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )?;
        return stream.flush();
    }
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let streamed = body["stream"] == true;
    seen.lock().unwrap().push(body);
    let (content_type, payload) = if status != 200 {
        (
            "application/json",
            json!({"error": {"type": "invalid_request_error", "message": "refused by the stub"}})
                .to_string(),
        )
    } else if streamed {
        let chunk = json!({"id": "c1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": answer}, "finish_reason": "stop"}]});
        (
            "text/event-stream",
            format!("data: {chunk}\n\ndata: [DONE]\n\n"),
        )
    } else {
        let body = json!({"id": "c1", "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}]});
        ("application/json", body.to_string())
    };
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 {status} Stub\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{payload}",
        payload.len()
    )?;
    stream.flush()
}
