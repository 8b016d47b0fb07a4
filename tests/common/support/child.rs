//! This test binary re-run as a server process: one `#[test]` that serves when
//! its environment says so, started from a parent test that talks to it over
//! loopback and can kill it with SIGKILL.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// A server process, killed (SIGKILL) when dropped.
pub struct ChildServer {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    lines: Arc<Mutex<Vec<String>>>,
}

impl ChildServer {
    /// Re-runs this test binary with only `test` (which must print
    /// `listening on http://ADDR`) and `env`, and waits for its address.
    /// `module` is the `module_path!()` of the test, which names it within
    /// the binary (without the crate's name).
    pub fn spawn(module: &str, test: &str, env: &[(&str, String)]) -> Self {
        let test = match module.split_once("::") {
            Some((_crate, path)) => format!("{path}::{test}"),
            None => test.to_owned(),
        };
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .args(["--exact", &test, "--nocapture", "--test-threads=1"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command.spawn().expect("spawn the server process");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        // Reads the address, then keeps every line so the child never blocks on output.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // The harness may have printed `test NAME ... ` on this line.
                if let Some((_, addr)) = line.split_once("listening on http://") {
                    let _ = tx.send(addr.trim().to_owned());
                }
                sink.lock().unwrap().push(line);
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(addr) => addr.parse().expect("server address"),
            Err(_) => {
                let _ = child.kill();
                panic!("the server process did not start");
            }
        };
        Self { child, addr, lines }
    }

    /// Waits (up to `limit`) until the child printed a line containing `needle`.
    pub async fn printed(&self, needle: &str, limit: Duration) {
        let start = std::time::Instant::now();
        while !self
            .lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains(needle))
        {
            assert!(
                start.elapsed() < limit,
                "the child never printed {needle:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// `kill -9`: no destructor, no release, no completion runs.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The child side of [`ChildServer`]: serves `router` on a free loopback port,
/// behind [`scope_from_header`], and announces the address as `spawn` reads it.
pub async fn serve(router: axum::Router) {
    let router = router.layer(axum::middleware::map_request(scope_from_header));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    println!("listening on http://{}", listener.local_addr().unwrap());
    axum::serve(listener, router).await.unwrap();
}

/// Stands in for authentication: the tenant comes from `x-tenant`.
pub async fn scope_from_header(mut req: axum::extract::Request) -> axum::extract::Request {
    let tenant = req
        .headers()
        .get("x-tenant")
        .and_then(|v| v.to_str().ok())
        .map(tower_idempotency::Scope::new);
    if let Some(scope) = tenant {
        req.extensions_mut().insert(scope);
    }
    req
}

/// The body of a server process: runs `server` on a two-worker runtime, and
/// exits when the parent does (it holds our stdin).
pub fn run_until_parent_exits(server: impl std::future::Future<Output = ()>) {
    use std::io::Read;
    std::thread::spawn(|| {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        std::process::exit(0);
    });
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(server);
}
