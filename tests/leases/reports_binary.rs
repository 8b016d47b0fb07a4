//! `cargo run --example reports` as users run it: separate processes on
//! loopback ports. In memory by default; with `--features postgres` and
//! `DATABASE_URL`, two instances share their jobs through PostgreSQL (a fresh
//! table per test via `REPORT_JOBS_TABLE`; skipped loudly without
//! `DATABASE_URL`, failing under `REQUIRE_POSTGRES=1`).

use tower_idempotency_tests::http;
#[cfg(feature = "postgres")]
use tower_idempotency_tests::support;

use http::HttpClient;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

pub(crate) struct Server {
    child: Child,
    pub(crate) addr: SocketAddr,
    /// The start-up banner, up to `listening on`.
    banner: Vec<String>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Builds the example with this test's features (a no-op when fresh).
fn example() -> Command {
    let mut command = Command::new(http::example_binary("reports"));
    command
        .env("BIND", "127.0.0.1:0")
        .env("REPORT_WORKER", "off")
        .env_remove("DATABASE_URL")
        .env_remove("REPORT_JOBS_TABLE")
        .env_remove("REPORT_ALLOWANCE");
    command
}

/// Starts the example with `env` and waits for `listening on`.
pub(crate) fn start(env: &[(&str, &str)]) -> Server {
    let mut command = example();
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the reports example");
    let stdout = child.stdout.take().unwrap();
    let mut server = Server {
        child,
        addr: "127.0.0.1:0".parse().unwrap(),
        banner: Vec::new(),
    };
    let mut lines = BufReader::new(stdout).lines();
    loop {
        let line = lines
            .next()
            .expect("example exited before listening")
            .unwrap();
        if let Some(url) = line.strip_prefix("listening on http://") {
            server.addr = url.parse().expect("an address");
            return server;
        }
        server.banner.push(line);
    }
}

/// Runs the example with `env`, expecting it to refuse to start: its stderr.
fn refused(env: &[(&str, &str)]) -> String {
    let mut command = example();
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the reports example");
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success(), "it must not start: {stderr}");
    stderr
}

const START: &str = "/reports/start";
const AUGUST: &str = r#"{"report_type":"customer_health","period":"2026-08"}"#;

#[tokio::test]
async fn in_memory_by_default_and_says_so() {
    let server = start(&[]);
    assert!(
        server
            .banner
            .iter()
            .any(|l| l.starts_with("job store: memory")),
        "{:?}",
        server.banner
    );
    let client = HttpClient::new(server.addr);
    let auth = [("authorization", "Bearer acme")];
    let first = client.post_json(START, &auth, AUGUST).await;
    let again = client.post_json(START, &auth, AUGUST).await;
    assert_eq!((first.status.as_u16(), again.status.as_u16()), (200, 200));
    assert_eq!(
        (
            first.json()["created"] == true,
            again.json()["join"] == true
        ),
        (true, true)
    );
    assert_eq!(first.json()["job_id"], again.json()["job_id"]);
}

#[cfg(not(feature = "postgres"))]
#[test]
fn database_url_without_the_postgres_feature_is_a_clear_error() {
    let stderr = refused(&[("DATABASE_URL", "postgres://postgres@127.0.0.1:1/reports")]);
    assert!(stderr.contains("--features postgres"), "{stderr}");
}

#[cfg(feature = "postgres")]
#[test]
fn an_unreachable_database_fails_at_start_up() {
    // Built first: the time is the start-up's, not cargo's.
    http::example_binary("reports");
    let began = std::time::Instant::now();
    let stderr = refused(&[("DATABASE_URL", "postgres://postgres@127.0.0.1:1/reports")]);
    assert!(stderr.contains("migrate failed"), "{stderr}");
    assert!(
        began.elapsed() < std::time::Duration::from_secs(30),
        "fails fast, not after a hang"
    );
    let stderr = refused(&[
        ("DATABASE_URL", "postgres://postgres@127.0.0.1:1/reports"),
        ("REPORT_JOBS_TABLE", "jobs; drop table x"),
    ]);
    assert!(stderr.contains("REPORT_JOBS_TABLE"), "{stderr}");
}

/// Two instances on one database are one service: a start on either joins
/// the job started on the other; a worker on one writes what readers of the
/// other see; the artifact is downloadable from both.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn two_instances_share_their_jobs_through_postgres() {
    let Some(url) = support::pg::database_url("two_instances_share_their_jobs_through_postgres")
    else {
        return;
    };
    let table = support::pg::unique_table("reports_bin");
    let env = [
        ("DATABASE_URL", url.as_str()),
        ("REPORT_JOBS_TABLE", table.as_str()),
    ];
    let (a, b) = (start(&env), start(&env));
    let banner = format!("table {table})");
    for server in [&a, &b] {
        assert!(
            server
                .banner
                .iter()
                .any(|l| l.starts_with("job store: postgres (") && l.contains(&banner)),
            "{:?}",
            server.banner
        );
        assert!(
            !server.banner.iter().any(|l| l.contains(&url)),
            "the URL (and any password in it) is not printed"
        );
    }
    let (a, b) = (HttpClient::new(a.addr), HttpClient::new(b.addr));
    let auth = [("authorization", "Bearer acme")];

    let created = a.post_json(START, &auth, AUGUST).await;
    assert_eq!(
        (created.status.as_u16(), created.json()["created"] == true),
        (200, true)
    );
    let job = created.json()["job_id"].as_str().unwrap().to_owned();
    let joined = b.post_json(START, &auth, AUGUST).await;
    assert_eq!(joined.status, 200);
    assert_eq!(joined.json()["job_id"], job.as_str());
    assert_eq!(joined.json()["join"], true);

    let worker = [("authorization", "Bearer acme"), ("x-worker-id", "w1")];
    let acquired = b
        .post_json(&format!("/reports/{job}/acquire"), &worker, "")
        .await;
    assert_eq!(acquired.status, 200);
    let token = acquired.json()["token"].to_string();
    let fenced = [
        ("authorization", "Bearer acme"),
        ("x-worker-id", "w1"),
        ("x-lease-token", token.as_str()),
    ];
    let appended = b
        .post_json(
            &format!("/reports/{job}/append"),
            &fenced,
            r#"{"seq":0,"chunk":"shared"}"#,
        )
        .await;
    assert_eq!(appended.status, 200);
    let cursor = a.get(&format!("/reports/{job}/cursor"), &auth).await;
    assert_eq!(
        cursor.json()["chunks"],
        serde_json::json!([{"seq": 0, "data": "shared"}])
    );
    assert_eq!(cursor.json()["attempt"], 1);
    let done = a
        .post_json(&format!("/reports/{job}/finalize"), &fenced, "")
        .await;
    assert_eq!(done.status, 200);
    for client in [&a, &b] {
        let artifact = client.get(&format!("/reports/{job}/artifact"), &auth).await;
        assert_eq!(&artifact.body[..], b"shared");
    }
}
