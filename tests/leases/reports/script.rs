//! Closing check 6's script: one sequence of requests (start, join, refusals,
//! a worker, completion, reads), sent over HTTP or in-process, with the
//! answers normalised so two runs compare equal.

use super::client::{HttpClient, Reply};
use super::{bearer, health, location, report, START};
use ::http::{Method, Request};
use http_body_util::BodyExt;
use serde_json::json;
use tower::ServiceExt;

/// One request of a scripted sequence; `{job}` and `{token}` are filled in
/// from earlier answers.
pub struct Step {
    method: Method,
    path: &'static str,
    tenant: &'static str,
    worker: Option<&'static str>,
    body: String,
}

fn step(method: Method, path: &'static str, tenant: &'static str, body: String) -> Step {
    Step {
        method,
        path,
        tenant,
        worker: None,
        body,
    }
}

fn as_worker(worker: &'static str, mut step: Step) -> Step {
    step.worker = Some(worker);
    step
}

/// The start → join → refusals → worker → complete sequence.
pub fn script() -> Vec<Step> {
    let aug = health("2026-08");
    let claims_acme =
        json!({"report_type": "customer_health", "period": "2026-08", "claimed_tenant_id": "acme"});
    vec![
        step(Method::POST, START, "acme", aug.clone()),
        step(Method::POST, START, "acme", aug.clone()),
        step(Method::POST, START, "globex", claims_acme.to_string()),
        step(Method::POST, START, "acme", report("weather", "2026-08")),
        step(Method::POST, START, "acme", health("2026-8")),
        step(Method::GET, "/reports/{job}", "globex", String::new()),
        step(
            Method::GET,
            "/reports/{job}/artifact",
            "acme",
            String::new(),
        ),
        as_worker(
            "w1",
            step(
                Method::POST,
                "/reports/{job}/acquire",
                "acme",
                String::new(),
            ),
        ),
        as_worker(
            "w2",
            step(
                Method::POST,
                "/reports/{job}/acquire",
                "acme",
                String::new(),
            ),
        ),
        as_worker(
            "w2",
            step(
                Method::POST,
                "/reports/{job}/heartbeat",
                "acme",
                String::new(),
            ),
        ),
        as_worker(
            "w1",
            step(
                Method::POST,
                "/reports/{job}/append",
                "acme",
                r#"{"seq":0,"chunk":"one "}"#.into(),
            ),
        ),
        as_worker(
            "w1",
            step(
                Method::POST,
                "/reports/{job}/append",
                "acme",
                r#"{"seq":0,"chunk":"one "}"#.into(),
            ),
        ),
        as_worker(
            "w1",
            step(
                Method::POST,
                "/reports/{job}/append",
                "acme",
                r#"{"seq":2,"chunk":"three"}"#.into(),
            ),
        ),
        as_worker(
            "w1",
            step(
                Method::POST,
                "/reports/{job}/append",
                "acme",
                r#"{"seq":1,"chunk":"two"}"#.into(),
            ),
        ),
        as_worker(
            "w2",
            step(
                Method::POST,
                "/reports/{job}/finalize",
                "acme",
                String::new(),
            ),
        ),
        as_worker(
            "w1",
            step(
                Method::POST,
                "/reports/{job}/finalize",
                "acme",
                String::new(),
            ),
        ),
        step(Method::POST, START, "acme", aug),
        step(Method::GET, "/reports/{job}", "acme", String::new()),
        step(
            Method::GET,
            "/reports/{job}/cursor?attempt=1&from_seq=1",
            "acme",
            String::new(),
        ),
        step(
            Method::GET,
            "/reports/{job}/artifact",
            "globex",
            String::new(),
        ),
        step(
            Method::GET,
            "/reports/{job}/artifact",
            "acme",
            String::new(),
        ),
    ]
}

/// How the script reaches the demo. Two values per test run: their sizes
/// do not matter.
#[allow(clippy::large_enum_variant)]
pub enum Transport {
    Http(HttpClient),
    InProcess(axum::Router),
}

impl Transport {
    async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: String,
    ) -> Reply {
        match self {
            Self::Http(client) => client.send(method, path, headers, body).await,
            Self::InProcess(router) => {
                let mut request = Request::builder().method(method).uri(path);
                for (name, value) in headers {
                    request = request.header(*name, *value);
                }
                let request = request.body(axum::body::Body::from(body)).unwrap();
                let response = router.clone().oneshot(request).await.unwrap();
                let (parts, body) = response.into_parts();
                Reply {
                    status: parts.status,
                    headers: parts.headers,
                    body: body.collect().await.unwrap().to_bytes(),
                }
            }
        }
    }
}

/// Runs the script; answers with job and artifact ids replaced by placeholders
/// (they are random), everything else as sent.
pub async fn run_script(transport: &Transport) -> Vec<(u16, String, String)> {
    let mut job = String::new();
    let mut token = String::new();
    let mut answers = Vec::new();
    for step in script() {
        let path = step.path.replace("{job}", &job);
        let auth = bearer(step.tenant);
        let mut headers = vec![
            ("authorization", auth.as_str()),
            ("content-type", "application/json"),
        ];
        if let Some(worker) = step.worker {
            headers.push(("x-worker-id", worker));
            headers.push(("x-lease-token", token.as_str()));
        }
        let reply = transport
            .send(step.method, &path, &headers, step.body)
            .await;
        if job.is_empty() {
            job = reply.json()["job_id"].as_str().unwrap().to_owned();
        }
        if path.ends_with("/acquire") && reply.status == 200 {
            token = reply.json()["token"].to_string();
        }
        let artifact = format!("art_{}", job.trim_start_matches("job_"));
        let normalise = |s: &str| s.replace(&artifact, "ART").replace(&job, "JOB");
        let body = normalise(&String::from_utf8_lossy(&reply.body));
        answers.push((reply.status.as_u16(), body, normalise(&location(&reply))));
    }
    answers
}
