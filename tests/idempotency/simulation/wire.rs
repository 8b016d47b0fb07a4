//! The shared store as a simulated host: a real `MemoryStore` behind a tiny
//! request/response protocol over turmoil TCP, and the `Store` each instance
//! reaches it through. One connection per operation, each bounded by a
//! timeout as a networked store's client is: a call cut by a partition hangs
//! until then and fails as `StoreError::Backend`; a call whose reply is lost
//! was applied all the same.

use super::{ms, now_ms, LOCK};
use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower_idempotency::store::{Claim, Completion, Maintenance, MemoryStoreError, Timings};
use tower_idempotency::{
    fingerprint::{Fingerprint, RequestFingerprint},
    store::{Begin, FencingToken, RecordKey, Store, StoreError, StoredResponse},
    IdempotencyKey, MemoryStore, Scope,
};
use turmoil::net::{TcpListener, TcpStream};

pub const STORE: &str = "store";
const PORT: u16 = 7000;
/// What an instance's store client allows one operation (a networked
/// store's operation timeout).
pub const OP_TIMEOUT: Duration = Duration::from_millis(80);

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Key {
    pub scope: String,
    pub key: String,
}

#[derive(Serialize, Deserialize, Debug)]
enum Request {
    Begin(Key, Vec<u8>),
    Complete(Key, i64, Recorded),
    CompleteUnavailable(Key, i64),
    Extend(Key, i64),
    Release(Key, i64),
    Wait(Key, u64),
    /// A purge, with the id its caller records it by.
    PurgeExpired(u64),
    PurgeScope(u64, String),
}

#[derive(Serialize, Deserialize, Debug)]
struct Recorded {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

#[derive(Serialize, Deserialize, Debug)]
enum Reply {
    /// The token, and for a takeover its attempt, the previous token and
    /// when the previous claim began.
    Claimed(i64, Option<(u32, i64, SystemTime)>),
    Replay(Recorded),
    Mismatch,
    InProgress,
    Unavailable,
    Expired,
    Done,
    Count(u64),
    ClaimLost,
    Full,
    Quota,
    Failed(String),
}

/// One operation the store applied, in the order it applied them (the
/// store host is one thread and logs each operation in the same poll that
/// applied it, so this order is the store's linearization).
#[derive(Clone, Debug)]
pub struct Applied {
    pub at: u64,
    /// The instance that sent it.
    pub from: String,
    pub key: (String, String),
    pub op: Op,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `begin` claimed the key with this token.
    Claimed(i64),
    /// `begin` answered without claiming (replay, mismatch, in progress, ...).
    Decided(&'static str),
    Extended(i64),
    Completed(i64),
    CompletedUnavailable(i64),
    Released(i64),
    /// `complete`, `extend` or `release` refused: the token owns nothing.
    Refused(&'static str, i64),
    /// `purge_scope` of the scope in `key.0` (`key.1` is empty) erased
    /// `removed` records; `id` is its caller's.
    PurgedScope {
        id: u64,
        removed: u64,
    },
    /// `purge_expired` erased `removed` records (`key` is empty).
    PurgedExpired {
        id: u64,
        removed: u64,
    },
}

pub type StoreLog = Arc<Mutex<Vec<Applied>>>;

/// The store host's software: a fresh `MemoryStore` (its clock is this
/// host's tokio clock, which turmoil drives), served until the end.
pub async fn serve_store(log: StoreLog) -> turmoil::Result {
    let store = MemoryStore::builder().with_lock_timeout(LOCK).build();
    let listener = TcpListener::bind(("0.0.0.0", PORT)).await?;
    loop {
        let (stream, peer) = listener.accept().await?;
        let from = turmoil::reverse_lookup(peer.ip()).unwrap_or_default();
        let (store, log) = (store.clone(), log.clone());
        tokio::task::spawn_local(async move {
            let _ = serve_one(stream, from, store, log).await;
        });
    }
}

async fn serve_one(
    mut stream: TcpStream,
    from: String,
    store: MemoryStore,
    log: StoreLog,
) -> std::io::Result<()> {
    let request: Request = read_frame(&mut stream).await?;
    let reply = apply(&store, request, |key, op| {
        log.lock().unwrap().push(Applied {
            at: now_ms(),
            from: from.clone(),
            key: (key.scope.clone(), key.key.clone()),
            op,
        })
    })
    .await;
    write_frame(&mut stream, &reply).await
}

async fn apply(store: &MemoryStore, request: Request, mut log: impl FnMut(&Key, Op)) -> Reply {
    let failed = |e: StoreError| match e {
        StoreError::ClaimLost => Reply::ClaimLost,
        StoreError::Backend(e) if e.downcast_ref::<MemoryStoreError>().is_some() => Reply::Full,
        StoreError::QuotaExceeded => Reply::Quota,
        other => Reply::Failed(other.to_string()),
    };
    let fenced = |key: &Key,
                  token: i64,
                  r: Result<(), StoreError>,
                  op: Op,
                  what,
                  log: &mut dyn FnMut(&Key, Op)| {
        match r {
            Ok(()) => {
                log(key, op);
                Reply::Done
            }
            Err(StoreError::ClaimLost) => {
                log(key, Op::Refused(what, token));
                Reply::ClaimLost
            }
            Err(e) => failed(e),
        }
    };
    match request {
        Request::Begin(key, fingerprint) => {
            let fingerprint: [u8; 32] = fingerprint.try_into().expect("32 bytes");
            let request = RequestFingerprint::from(Fingerprint::from_bytes(fingerprint));
            let (decided, reply) = match store.begin(&record(&key), &request).await {
                Ok(Begin::Claimed(claim)) => {
                    let takeover = claim
                        .takeover
                        .map(|t| (t.attempt, t.previous_token.get(), t.previous_began));
                    let token = claim.token.get();
                    (Op::Claimed(token), Reply::Claimed(token, takeover))
                }
                Ok(Begin::Replay(r)) => (Op::Decided("replay"), Reply::Replay(recorded(&r))),
                Ok(Begin::KeyReused) => (Op::Decided("mismatch"), Reply::Mismatch),
                Ok(Begin::InProgress) => (Op::Decided("in progress"), Reply::InProgress),
                Ok(Begin::ResponseUnavailable) => (Op::Decided("unavailable"), Reply::Unavailable),
                Ok(Begin::Expired) => (Op::Decided("expired"), Reply::Expired),
                Err(e) => return failed(e),
            };
            log(&key, decided);
            reply
        }
        Request::Complete(key, token, r) => {
            let stored = StoredResponse {
                status: StatusCode::from_u16(r.status).expect("a status"),
                headers: r
                    .headers
                    .into_iter()
                    .map(|(n, v)| {
                        (
                            HeaderName::try_from(n).unwrap(),
                            HeaderValue::from_bytes(&v).unwrap(),
                        )
                    })
                    .collect(),
                body: Bytes::from(r.body),
            };
            let done = store
                .complete(
                    &record(&key),
                    FencingToken::new(token),
                    Completion::Response(stored),
                )
                .await;
            fenced(
                &key,
                token,
                done,
                Op::Completed(token),
                "complete",
                &mut log,
            )
        }
        Request::CompleteUnavailable(key, token) => {
            let done = store
                .complete(
                    &record(&key),
                    FencingToken::new(token),
                    Completion::Unavailable,
                )
                .await;
            let op = Op::CompletedUnavailable(token);
            fenced(&key, token, done, op, "complete_unavailable", &mut log)
        }
        Request::Extend(key, token) => {
            let done = store.extend(&record(&key), FencingToken::new(token)).await;
            fenced(&key, token, done, Op::Extended(token), "extend", &mut log)
        }
        Request::Release(key, token) => {
            let done = store.release(&record(&key), FencingToken::new(token)).await;
            fenced(&key, token, done, Op::Released(token), "release", &mut log)
        }
        Request::Wait(key, timeout) => match store.wait(&record(&key), ms(timeout)).await {
            Ok(()) => Reply::Done,
            Err(e) => failed(e),
        },
        Request::PurgeExpired(id) => match store.purge_expired().await {
            Ok(removed) => {
                let everywhere = Key {
                    scope: String::new(),
                    key: String::new(),
                };
                log(&everywhere, Op::PurgedExpired { id, removed });
                Reply::Count(removed)
            }
            Err(e) => failed(e),
        },
        Request::PurgeScope(id, scope) => {
            match store.purge_scope(&Scope::new(scope.as_str())).await {
                Ok(removed) => {
                    let scope = Key {
                        scope,
                        key: String::new(),
                    };
                    log(&scope, Op::PurgedScope { id, removed });
                    Reply::Count(removed)
                }
                Err(e) => failed(e),
            }
        }
    }
}

fn record(key: &Key) -> RecordKey {
    RecordKey::new(
        Scope::new(key.scope.clone()),
        IdempotencyKey::parse(key.key.as_bytes()).expect("a valid key"),
    )
}

fn recorded(r: &StoredResponse) -> Recorded {
    Recorded {
        status: r.status.as_u16(),
        headers: r
            .headers
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect(),
        body: r.body.to_vec(),
    }
}

async fn read_frame<T: for<'de> Deserialize<'de>>(stream: &mut TcpStream) -> std::io::Result<T> {
    let len = stream.read_u32().await? as usize;
    let mut buf = vec![0; len];
    stream.read_exact(&mut buf).await?;
    serde_json::from_slice(&buf).map_err(std::io::Error::other)
}

async fn write_frame<T: Serialize>(stream: &mut TcpStream, value: &T) -> std::io::Result<()> {
    let buf = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    stream.write_u32(buf.len() as u32).await?;
    stream.write_all(&buf).await?;
    stream.flush().await
}

/// An instance's client of the store host: the `Store` its layer runs on.
#[derive(Clone, Debug, Default)]
pub struct RemoteStore;

impl RemoteStore {
    async fn call(&self, request: Request, timeout: Duration) -> Result<Reply, StoreError> {
        let exchange = async {
            let mut stream = TcpStream::connect((STORE, PORT)).await?;
            write_frame(&mut stream, &request).await?;
            read_frame::<Reply>(&mut stream).await
        };
        match tokio::time::timeout(timeout, exchange).await {
            Err(_) => Err(StoreError::Backend("store operation timed out".into())),
            Ok(Err(e)) => Err(StoreError::Backend(e.into())),
            Ok(Ok(Reply::Failed(e))) => Err(StoreError::Backend(e.into())),
            Ok(Ok(Reply::ClaimLost)) => Err(StoreError::ClaimLost),
            Ok(Ok(Reply::Full)) => Err(StoreError::Backend(Box::new(MemoryStoreError::Full))),
            Ok(Ok(Reply::Quota)) => Err(StoreError::QuotaExceeded),
            Ok(Ok(reply)) => Ok(reply),
        }
    }

    async fn fenced(&self, request: Request) -> Result<(), StoreError> {
        match self.call(request, OP_TIMEOUT).await? {
            Reply::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }
}

fn key(record: &RecordKey) -> Key {
    Key {
        scope: record.scope().as_str().to_owned(),
        key: record.key().as_str().to_owned(),
    }
}

fn unexpected(reply: Reply) -> StoreError {
    StoreError::Backend(format!("unexpected reply {reply:?}").into())
}

impl Store for RemoteStore {
    async fn begin(
        &self,
        record: &RecordKey,
        request: &RequestFingerprint<'_>,
    ) -> Result<Begin, StoreError> {
        let fingerprint = request.fingerprint().as_bytes().to_vec();
        Ok(
            match self
                .call(Request::Begin(key(record), fingerprint), OP_TIMEOUT)
                .await?
            {
                Reply::Claimed(t, None) => Begin::Claimed(Claim::first(FencingToken::new(t))),
                Reply::Claimed(t, Some((attempt, previous, began))) => {
                    Begin::Claimed(Claim::takeover(
                        FencingToken::new(t),
                        attempt,
                        FencingToken::new(previous),
                        began,
                    ))
                }
                Reply::Replay(r) => Begin::Replay(Arc::new(StoredResponse {
                    status: StatusCode::from_u16(r.status).unwrap(),
                    headers: r
                        .headers
                        .into_iter()
                        .map(|(n, v)| {
                            (
                                HeaderName::try_from(n).unwrap(),
                                HeaderValue::from_bytes(&v).unwrap(),
                            )
                        })
                        .collect(),
                    body: Bytes::from(r.body),
                })),
                Reply::Mismatch => Begin::KeyReused,
                Reply::InProgress => Begin::InProgress,
                Reply::Unavailable => Begin::ResponseUnavailable,
                Reply::Expired => Begin::Expired,
                other => return Err(unexpected(other)),
            },
        )
    }

    async fn complete(
        &self,
        record: &RecordKey,
        token: FencingToken,
        completion: Completion,
    ) -> Result<(), StoreError> {
        let request = match completion {
            Completion::Response(response) => {
                Request::Complete(key(record), token.get(), recorded(&response))
            }
            Completion::Unavailable => Request::CompleteUnavailable(key(record), token.get()),
        };
        self.fenced(request).await
    }

    fn timings(&self) -> Timings {
        Timings::new(LOCK)
    }

    async fn extend(&self, record: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
        self.fenced(Request::Extend(key(record), token.get())).await
    }

    async fn release(&self, record: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
        self.fenced(Request::Release(key(record), token.get()))
            .await
    }

    async fn wait(&self, record: &RecordKey, timeout: Duration) -> Result<(), StoreError> {
        let request = Request::Wait(key(record), timeout.as_millis() as u64);
        match self.call(request, timeout + OP_TIMEOUT).await? {
            Reply::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }
}

impl RemoteStore {
    /// `Maintenance::purge_scope` of `scope`, or `purge_expired` without
    /// one, on the store host, sent with an `id` the store's log records it
    /// by (what the `Maintenance` trait's signature has no room for).
    pub async fn purge(&self, id: u64, scope: Option<&str>) -> Result<u64, StoreError> {
        let request = match scope {
            Some(scope) => Request::PurgeScope(id, scope.to_owned()),
            None => Request::PurgeExpired(id),
        };
        match self.call(request, OP_TIMEOUT).await? {
            Reply::Count(n) => Ok(n),
            other => Err(unexpected(other)),
        }
    }
}
