//! One request: route it, read the body under its caps, admit, answer. The
//! whole request runs under [`ServerLimits::request_timeout`].

use super::limits::{ServerLimits, ServerMetrics};
use crate::config::InjectionConfig;
use crate::history::{History, Verdict};
use crate::marks::{Caller, MUTATE_WITH_TOKEN};
use crate::mutate::{answer_review, read_review, Review};
use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::Body;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioExecutor;
use hyper_util::server::conn::auto;
use std::convert::Infallible;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What every connection of one server shares.
pub(super) struct Shared {
    pub config: Arc<InjectionConfig>,
    pub limits: ServerLimits,
    pub metrics: Arc<ServerMetrics>,
    /// The measured history admissions are predicted from (None: not read).
    pub history: Option<Arc<History>>,
    /// The limits applied to hyper, built once.
    pub builder: auto::Builder<TokioExecutor>,
    /// Body bytes all requests may buffer together, one permit per byte.
    pub budget: Arc<Semaphore>,
    /// Large reviews parsed at the same time.
    pub large_reviews: Semaphore,
}

impl Shared {
    pub fn new(
        config: Arc<InjectionConfig>,
        limits: ServerLimits,
        metrics: Arc<ServerMetrics>,
        history: Option<Arc<History>>,
    ) -> Self {
        Shared {
            config,
            history,
            builder: limits.builder(),
            budget: Arc::new(Semaphore::new(limits.body_budget_bytes as usize)),
            large_reviews: Semaphore::new(limits.max_concurrent_reviews as usize),
            limits,
            metrics,
        }
    }
}

/// Why a request body was not read.
#[derive(Debug, thiserror::Error)]
pub(super) enum BodyError {
    /// Over [`ServerLimits::max_body_bytes`].
    #[error(
        "request body over {limit} bytes: an AdmissionReview of a CREATE is at most the API \
         server's 3 MiB request limit; this is not one"
    )]
    TooLarge {
        /// The cap.
        limit: u32,
    },
    /// The connection failed or the client reset the stream.
    #[error("cannot read the request body: {0}")]
    Read(String),
}

/// A body read in full, with its share of the body budget: the share goes
/// back when this is dropped.
pub(super) struct Buffered {
    pub bytes: Bytes,
    _charge: OwnedSemaphorePermit,
}

/// The caps a body is read under.
#[derive(Clone, Copy, Debug)]
pub(super) struct BodyCaps {
    /// Larger bodies fail.
    pub limit: u32,
    /// Bytes not charged to the budget.
    pub free: u32,
}

/// Reads `body` up to `caps.limit` bytes, charging every byte past
/// `caps.free` to `budget` before buffering it (and waiting while the
/// budget is spent). A declared length over the limit fails before anything
/// is read; an undeclared (chunked) one fails at the frame that crosses it,
/// so at most the limit plus one frame (≤ 16 KiB: the HTTP/2 frame size, or
/// hyper's HTTP/1 read buffer) is ever held.
pub(super) async fn read_body<B>(
    body: B,
    caps: BodyCaps,
    budget: &Arc<Semaphore>,
) -> Result<Buffered, BodyError>
where
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    let BodyCaps { limit, free } = caps;
    let declared = body.size_hint().exact();
    if declared.is_some_and(|n| n > u64::from(limit)) {
        return Err(BodyError::TooLarge { limit });
    }
    let declared = declared.unwrap_or(0) as usize;
    let billable = |len: usize| len.saturating_sub(free as usize);
    let mut charge = charge_more(budget, billable(declared)).await;
    let mut buf = BytesMut::with_capacity(declared);
    let mut body = std::pin::pin!(body);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BodyError::Read(e.to_string()))?;
        // Trailers carry nothing an AdmissionReview needs.
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let len = buf.len() + data.len();
        if len > limit as usize {
            return Err(BodyError::TooLarge { limit });
        }
        if billable(len) > charge.num_permits() {
            charge.merge(charge_more(budget, billable(len) - charge.num_permits()).await);
        }
        buf.extend_from_slice(&data);
    }
    Ok(Buffered {
        bytes: buf.freeze(),
        _charge: charge,
    })
}

async fn charge_more(budget: &Arc<Semaphore>, bytes: usize) -> OwnedSemaphorePermit {
    // `bytes` is at most max_body_bytes (a u32), and the budget is never closed.
    budget
        .clone()
        .acquire_many_owned(bytes as u32)
        .await
        .expect("the body budget is never closed")
}

type Reply = Response<Full<Bytes>>;

fn text(status: StatusCode, body: &'static str) -> Reply {
    let mut reply = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *reply.status_mut() = status;
    reply
}

/// Serves one request under the request deadline.
pub(super) async fn handle<B>(req: Request<B>, shared: Arc<Shared>) -> Result<Reply, Infallible>
where
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    let deadline = shared.limits.request_timeout;
    let reply = match tokio::time::timeout(deadline, route(req, &shared)).await {
        Ok(reply) => reply,
        Err(_) => {
            shared.metrics.rejected("timeout");
            text(
                StatusCode::REQUEST_TIMEOUT,
                "request not received and answered within the server's deadline\n",
            )
        }
    };
    Ok(reply)
}

async fn route<B>(req: Request<B>, shared: &Shared) -> Reply
where
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    // The path is never logged: its token is what tells the API server's
    // reviews from anyone else's (marks.rs).
    let path = req.uri().path();
    if let Some(token) = path.strip_prefix(MUTATE_WITH_TOKEN) {
        let caller = shared.config.marks.caller(token);
        return match req.method() {
            &Method::POST => mutate(req.into_body(), shared, caller).await,
            _ => text(StatusCode::METHOD_NOT_ALLOWED, ""),
        };
    }
    match (req.method(), path) {
        (&Method::POST, "/mutate") => mutate(req.into_body(), shared, Caller::Unverified).await,
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok"),
        (_, "/mutate" | "/healthz") => text(StatusCode::METHOD_NOT_ALLOWED, ""),
        _ => text(StatusCode::NOT_FOUND, ""),
    }
}

/// read → admit → encode.
async fn mutate<B>(body: B, shared: &Shared, caller: Caller) -> Reply
where
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    let caps = BodyCaps {
        limit: shared.limits.max_body_bytes,
        free: shared.limits.small_body_bytes,
    };
    let body = match read_body(body, caps, &shared.budget).await {
        Ok(body) => body,
        Err(e @ BodyError::TooLarge { .. }) => {
            shared.metrics.rejected("body_too_large");
            tracing::debug!(error = %e, "admission review refused");
            return text(StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n");
        }
        Err(e) => {
            tracing::debug!(error = %e, "admission review not read");
            return text(StatusCode::BAD_REQUEST, "request body not read\n");
        }
    };
    let review = {
        // Small reviews parse at once: their number and size are bounded. A
        // large one holds its slot until answered: its parsed object is held
        // that long (across the history's LIST too).
        let large = body.bytes.len() > shared.limits.small_body_bytes as usize;
        let _slot = match large {
            true => Some(shared.large_reviews.acquire().await),
            false => None,
        };
        let review = read_review(&body.bytes);
        drop(body);
        let history = history_of(&review, shared).await;
        answer_review(review, &shared.config, caller, history)
    };
    let json = serde_json::to_vec(&review).expect("a JSON value always serialises");
    let mut reply = Response::new(Full::new(Bytes::from(json)));
    reply.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    reply
}

/// What the measured history adds to `review`: nothing unless it is a
/// profiled Job that names its family and the server reads the history.
async fn history_of(review: &Review, shared: &Shared) -> Verdict {
    let (Some(history), Some(ask)) = (&shared.history, review.history_ask()) else {
        return Verdict::default();
    };
    match ask {
        Ok(ask) => history.check(&ask).await,
        Err(e) => Verdict {
            warnings: vec![format!("memprof: {e}")],
            denied: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::channel::mpsc;
    use futures::FutureExt as _;
    use futures::SinkExt as _;
    use http_body_util::StreamBody;
    use hyper::body::Frame;

    type Chunk = Result<Frame<Bytes>, Infallible>;
    type Chunks = mpsc::Sender<Chunk>;

    /// `limit`, every byte charged.
    fn caps(limit: u32) -> BodyCaps {
        BodyCaps { limit, free: 0 }
    }

    /// A body without a declared length whose chunks the test sends.
    fn chunked() -> (Chunks, StreamBody<mpsc::Receiver<Chunk>>) {
        let (tx, rx) = mpsc::channel(16);
        (tx, StreamBody::new(rx))
    }

    async fn send(tx: &mut Chunks, n: usize) {
        tx.send(Ok(Frame::data(Bytes::from(vec![b'x'; n]))))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_chunked_body_over_the_cap_fails_at_the_crossing_chunk() {
        let budget = Arc::new(Semaphore::new(1 << 20));
        let (mut tx, body) = chunked();
        let read = tokio::spawn({
            let budget = budget.clone();
            async move {
                read_body(body, caps(1000), &budget)
                    .await
                    .map(|b| b.bytes.len())
            }
        });
        send(&mut tx, 600).await;
        send(&mut tx, 600).await;
        // The sender stays open: the read must not wait for the end.
        let out = read.await.unwrap();
        assert!(
            matches!(out, Err(BodyError::TooLarge { limit: 1000 })),
            "{out:?}"
        );
        assert_eq!(budget.available_permits(), 1 << 20, "budget returned");
        drop(tx);
    }

    #[tokio::test]
    async fn a_declared_length_over_the_cap_fails_before_reading() {
        let budget = Arc::new(Semaphore::new(1 << 20));
        let body = Full::new(Bytes::from(vec![0u8; 1001]));
        let out = read_body(body, caps(1000), &budget).now_or_never().unwrap();
        assert!(matches!(out, Err(BodyError::TooLarge { .. })));
        let out = read_body(Full::new(Bytes::from(vec![0u8; 1000])), caps(1000), &budget)
            .await
            .unwrap();
        assert_eq!(out.bytes.len(), 1000);
        assert_eq!(
            budget.available_permits(),
            (1 << 20) - 1000,
            "held while buffered"
        );
        drop(out);
        assert_eq!(budget.available_permits(), 1 << 20);
    }

    #[tokio::test]
    async fn a_body_waits_for_the_budget_others_hold() {
        let budget = Arc::new(Semaphore::new(1000));
        let (mut tx_a, body_a) = chunked();
        let a = tokio::spawn({
            let budget = budget.clone();
            async move {
                read_body(body_a, caps(1000), &budget)
                    .await
                    .map(|b| b.bytes)
            }
        });
        send(&mut tx_a, 800).await;
        let charged = async {
            while budget.available_permits() > 200 {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(20), charged)
            .await
            .expect("A's 800 bytes are charged to the budget");
        let b = read_body(Full::new(Bytes::from(vec![0u8; 400])), caps(1000), &budget);
        let mut b = std::pin::pin!(b);
        assert!(
            (&mut b).now_or_never().is_none(),
            "800 + 400 > 1000: B waits"
        );
        drop(tx_a);
        let a = a.await.unwrap().unwrap();
        assert_eq!(a.len(), 800);
        assert_eq!(b.await.unwrap().bytes.len(), 400);
    }

    #[tokio::test]
    async fn small_bodies_do_not_wait_for_a_spent_budget() {
        let budget = Arc::new(Semaphore::new(1000));
        let held = budget.clone().acquire_many_owned(1000).await.unwrap();
        let caps = BodyCaps {
            limit: 2000,
            free: 500,
        };
        let small = read_body(Full::new(Bytes::from(vec![0u8; 500])), caps, &budget);
        let small = small.now_or_never().expect("the free part needs no budget");
        assert_eq!(small.unwrap().bytes.len(), 500);
        let large = read_body(Full::new(Bytes::from(vec![0u8; 501])), caps, &budget);
        let mut large = std::pin::pin!(large);
        assert!(
            (&mut large).now_or_never().is_none(),
            "one byte past the free part waits"
        );
        drop(held);
        assert_eq!(large.await.unwrap().bytes.len(), 501);
        assert_eq!(budget.available_permits(), 1000);
    }
}
