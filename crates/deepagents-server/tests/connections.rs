//! Connections that send nothing are closed, the connection limit holds, and a stop does not
//! wait on a stalled client.

use std::io::{Read as _, Write as _};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deepagents::backends::InMemoryStore;
use deepagents::core::InMemoryCheckpointer;
use deepagents_server::{Assistant, ConnectionLimits, ServerOptions, StepWatch};

async fn start(
    limits: ConnectionLimits,
) -> (
    std::net::SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let watch = StepWatch::new(Arc::new(InMemoryCheckpointer::new()));
    let mut options = ServerOptions::new(
        vec![Assistant::new("agent", super::agent(watch.clone()))],
        Arc::new(InMemoryStore::new()),
        watch,
    );
    options.connections = limits;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(deepagents_server::serve(listener, options, async {
        let _ = stopped.await;
    }));
    (address, stop, server)
}

/// Whether the server closes `stream` (EOF) within `within`.
fn closed_within(stream: &mut std::net::TcpStream, within: Duration) -> bool {
    stream.set_read_timeout(Some(within)).unwrap();
    let mut buffer = [0u8; 256];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return true,
            // A timeout answer (408) may come first; the close follows.
            Ok(_) => {}
            Err(_) => return false,
        }
    }
}

fn get_ok(address: std::net::SocketAddr) -> String {
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_and_cannot_hold_the_server() {
    let limits = ConnectionLimits {
        max_connections: 2,
        header_read_timeout: Duration::from_millis(400),
        shutdown_grace: Duration::from_millis(300),
    };
    let (address, stop, server) = start(limits).await;
    tokio::task::spawn_blocking(move || {
        // Two connections that send nothing take every slot…
        let mut idle: Vec<_> = (0..2)
            .map(|_| std::net::TcpStream::connect(address).unwrap())
            .collect();
        // …yet a request on a third is answered once they time out.
        let started = Instant::now();
        let response = get_ok(address);
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        for stream in &mut idle {
            assert!(
                closed_within(stream, Duration::from_secs(3)),
                "an idle connection stayed open"
            );
        }
        // A kept-alive connection that sends no next request is closed too.
        let mut kept = std::net::TcpStream::connect(address).unwrap();
        write!(kept, "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert!(closed_within(&mut kept, Duration::from_secs(3)));
    })
    .await
    .unwrap();
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_does_not_wait_on_a_stalled_client() {
    let limits = ConnectionLimits {
        max_connections: 8,
        header_read_timeout: Duration::from_secs(60),
        shutdown_grace: Duration::from_millis(300),
    };
    let (address, stop, server) = start(limits).await;
    // Half a request, then nothing: the connection is busy reading it.
    let mut stalled = std::net::TcpStream::connect(address).unwrap();
    write!(
        stalled,
        "POST /threads HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{{"
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("the stop waited on the stalled client")
        .unwrap()
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    drop(stalled);
}
