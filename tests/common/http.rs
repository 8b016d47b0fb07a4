//! A real HTTP/1.1 client and an in-process loopback server for tests.
#![allow(dead_code)]

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;

/// A response read whole.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    pub fn code(&self) -> String {
        self.json()["code"].as_str().unwrap_or_default().to_owned()
    }

    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }
}

#[derive(Clone)]
pub struct HttpClient {
    base: String,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl HttpClient {
    pub fn new(addr: SocketAddr) -> Self {
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(64)
            .build_http();
        Self {
            base: format!("http://{addr}"),
            client,
        }
    }

    pub async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Reply {
        let mut builder = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let response = self
            .client
            .request(builder.body(Full::new(body.into())).unwrap())
            .await
            .expect("request failed");
        let (parts, body) = response.into_parts();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body: body.collect().await.expect("response body").to_bytes(),
        }
    }

    pub async fn post_json(&self, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
        let mut all = vec![("content-type", "application/json")];
        all.extend_from_slice(headers);
        self.send(Method::POST, path, &all, body.to_owned()).await
    }

    pub async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        self.send(Method::GET, path, headers, Bytes::new()).await
    }
}

/// Serves `app` on a loopback port until the test's runtime ends.
pub async fn serve(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// The features this test binary was built with (the library's, of the same
/// names), so an example built from a test has them too.
pub fn enabled_features() -> Vec<&'static str> {
    let mut features = Vec::new();
    if cfg!(feature = "postgres") {
        features.push("postgres");
    }
    if cfg!(feature = "metrics") {
        features.push("metrics");
    }
    if cfg!(feature = "client") {
        features.push("client");
    }
    if cfg!(feature = "leases") {
        features.push("leases");
    }
    if cfg!(feature = "redis") {
        features.push("redis");
    }
    features
}

/// The examples that are packages of their own (so that their dependencies
/// are not the library's), each with its package and the features it has.
const EXAMPLE_PACKAGES: &[(&str, &str, &[&str])] = &[
    ("grpc_web", "tower-idempotency-grpc-web", &[]),
    (
        "axum_per_route",
        "tower-idempotency-axum-per-route",
        &["metrics", "utoipa"],
    ),
];

/// Builds example `name` with this test's features (a no-op when fresh) and
/// returns the path of its binary, as cargo reports it (wherever the target
/// directory is). An example of the library is built as one; an example
/// package (`examples/<name>/`) as its binary, with those of this test's
/// features it has and the library's others.
pub fn example_binary(name: &str) -> std::path::PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = std::process::Command::new(&cargo);
    build.args([
        "build",
        "--quiet",
        "--message-format=json-render-diagnostics",
    ]);
    let mut features: Vec<String> = enabled_features().iter().map(|f| f.to_string()).collect();
    match EXAMPLE_PACKAGES
        .iter()
        .find(|(example, ..)| *example == name)
    {
        Some((_, package, own)) => {
            build.args(["-p", package, "--bin", name]);
            for feature in &mut features {
                if !own.contains(&feature.as_str()) {
                    *feature = format!("tower-idempotency/{feature}");
                }
            }
        }
        None => {
            build.args(["-p", "tower-idempotency", "--example", name]);
        }
    }
    if !features.is_empty() {
        build.args(["--features", &features.join(",")]);
    }
    let output = build
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("run cargo");
    assert!(output.status.success(), "example {name} builds");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| message["target"]["name"] == name)
        .find_map(|message| message["executable"].as_str().map(Into::into))
        .unwrap_or_else(|| panic!("cargo names no executable for example {name}"))
}

/// An example process started on a loopback port, killed (and reaped) on drop;
/// its stdout lines after `listening on` are collected.
pub struct RunningExample {
    child: std::process::Child,
    /// Where it listens.
    pub addr: SocketAddr,
    /// What it printed before `listening on`.
    pub banner: Vec<String>,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Drop for RunningExample {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl RunningExample {
    /// Builds example `name` with this test's features and starts it with
    /// `BIND=127.0.0.1:0` and `env`, waiting for `listening on http://ADDR`.
    pub fn start(name: &str, env: &[(&str, Option<&str>)]) -> Self {
        use std::io::{BufRead, BufReader};
        let mut command = std::process::Command::new(example_binary(name));
        command
            .env("BIND", "127.0.0.1:0")
            .stdout(std::process::Stdio::piped());
        for (key, value) in env {
            match value {
                Some(value) => command.env(key, value),
                None => command.env_remove(key),
            };
        }
        let mut child = command.spawn().expect("start the example");
        let mut reader = BufReader::new(child.stdout.take().unwrap());
        let mut banner = Vec::new();
        let addr = loop {
            let mut line = String::new();
            assert!(
                reader.read_line(&mut line).unwrap() > 0,
                "{name} exited early"
            );
            if let Some(url) = line.trim().strip_prefix("listening on http://") {
                break url.parse().expect("an address");
            }
            banner.push(line.trim().to_owned());
        };
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in reader.lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Self {
            child,
            addr,
            banner,
            lines,
        }
    }

    /// `kill -9`: no destructor, no release, no completion runs.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM, as a process manager does to stop a service.
    pub fn terminate(&self) {
        let status = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
    }

    /// Waits (up to `limit`) for the process to exit by itself.
    pub async fn exited_within(&mut self, limit: std::time::Duration) -> std::process::ExitStatus {
        let start = std::time::Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(start.elapsed() < limit, "still running after {limit:?}");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// The lines printed after `listening on` so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Waits (up to 5 s) for a stdout line containing every one of `parts`.
    pub async fn line_with(&self, parts: &[&str]) -> String {
        for _ in 0..100 {
            let found = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .find(|l| parts.iter().all(|p| l.contains(p)))
                .cloned();
            if let Some(line) = found {
                return line;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!(
            "no line with {parts:?} in {:#?}",
            self.lines.lock().unwrap()
        );
    }
}
