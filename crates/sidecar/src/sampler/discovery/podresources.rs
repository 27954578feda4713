//! The kubelet's PodResources API, v1 (`k8s.io/kubelet/pkg/apis/podresources/v1/api.proto`):
//! its messages written out by hand as `prost` structs (only the fields used;
//! protobuf skips the others), and the `List` call as one gRPC unary request
//! over hyper's HTTP/2 client: no tonic, no protoc, no build script.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body_util::{BodyExt, Full, Limited};
use std::path::Path;
use std::time::Duration;

/// Largest PodResources answer read (a node's every pod and container).
const MAX_RESPONSE_BYTES: usize = 16 << 20;

/// `ListPodResourcesRequest {}`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodResourcesRequest {}

/// `ListPodResourcesResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodResourcesResponse {
    /// Every pod on the node with its containers' resources.
    #[prost(message, repeated, tag = "1")]
    pub pod_resources: Vec<PodResources>,
}

/// `PodResources`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodResources {
    /// Pod name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Pod namespace.
    #[prost(string, tag = "2")]
    pub namespace: String,
    /// Its containers.
    #[prost(message, repeated, tag = "3")]
    pub containers: Vec<ContainerResources>,
}

/// `ContainerResources` (cpu_ids, memory and dynamic_resources are not read).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerResources {
    /// Container name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Devices allocated by device plugins.
    #[prost(message, repeated, tag = "2")]
    pub devices: Vec<ContainerDevices>,
}

/// `ContainerDevices` (topology is not read).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerDevices {
    /// Extended resource name, e.g. `nvidia.com/gpu`.
    #[prost(string, tag = "1")]
    pub resource_name: String,
    /// Device IDs as the plugin named them (GPU UUIDs for NVIDIA's, `::N` when shared).
    #[prost(string, repeated, tag = "2")]
    pub device_ids: Vec<String>,
}

/// Errors of the PodResources call. Messages say what to check.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket could not be opened.
    #[error("cannot connect to {path}: {source} (is the kubelet's pod-resources directory mounted read-only into the sidecar?)")]
    Connect {
        /// Socket path.
        path: String,
        /// Underlying error.
        source: std::io::Error,
    },
    /// HTTP/2 failed (handshake, request or body).
    #[error("HTTP/2 to the kubelet failed: {0}")]
    Http(String),
    /// The kubelet answered with a gRPC error.
    #[error("kubelet answered gRPC status {code}: {message}")]
    Status {
        /// gRPC status code.
        code: u32,
        /// gRPC message.
        message: String,
    },
    /// The answer is not a valid message.
    #[error("cannot decode the kubelet's answer: {0}")]
    Decode(String),
    /// The call took too long.
    #[error("no answer from the kubelet within {0:?}")]
    Timeout(Duration),
}

/// A gRPC message frame: uncompressed flag, big-endian length, message.
pub(crate) fn grpc_frame(msg: &impl prost::Message) -> Bytes {
    let len = msg.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.put_u8(0);
    buf.put_u32(len as u32);
    msg.encode(&mut buf)
        .expect("a buffer sized for the message has room");
    buf.freeze()
}

/// The single message of a unary gRPC answer.
pub(crate) fn grpc_unframe(mut body: Bytes) -> Result<Bytes, Error> {
    if body.len() < 5 {
        return Err(Error::Decode(format!(
            "{} bytes, shorter than a gRPC frame header",
            body.len()
        )));
    }
    let compressed = body.get_u8();
    let len = body.get_u32() as usize;
    if compressed != 0 {
        return Err(Error::Decode(
            "compressed message (none was offered)".into(),
        ));
    }
    if body.len() < len {
        return Err(Error::Decode(format!(
            "frame says {len} bytes, {} arrived",
            body.len()
        )));
    }
    Ok(body.split_to(len))
}

fn grpc_status(h: &hyper::HeaderMap) -> Option<Result<(), Error>> {
    let code: u32 = h.get("grpc-status")?.to_str().ok()?.trim().parse().ok()?;
    Some(if code == 0 {
        Ok(())
    } else {
        Err(Error::Status {
            code,
            message: h
                .get("grpc-message")
                .and_then(|m| m.to_str().ok())
                .unwrap_or("")
                .to_string(),
        })
    })
}

/// Calls `v1.PodResourcesLister/List` on the kubelet's Unix socket.
pub async fn list_pod_resources(
    socket: &Path,
    timeout: Duration,
) -> Result<ListPodResourcesResponse, Error> {
    tokio::time::timeout(timeout, list_pod_resources_inner(socket))
        .await
        .map_err(|_| Error::Timeout(timeout))?
}

async fn list_pod_resources_inner(socket: &Path) -> Result<ListPodResourcesResponse, Error> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|source| Error::Connect {
            path: socket.display().to_string(),
            source,
        })?;
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .map_err(|e| Error::Http(e.to_string()))?;
    let driver = tokio::spawn(conn);
    let req = hyper::Request::post("http://localhost/v1.PodResourcesLister/List")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(grpc_frame(&ListPodResourcesRequest {})))
        .map_err(|e| Error::Http(e.to_string()))?;
    let result = async {
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| Error::Http(e.to_string()))?;
        if resp.status() != hyper::StatusCode::OK {
            return Err(Error::Http(format!("HTTP status {}", resp.status())));
        }
        // A trailers-only answer carries the gRPC status in the headers.
        if let Some(status) = grpc_status(resp.headers()) {
            status?;
        }
        let collected = Limited::new(resp.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| Error::Http(e.to_string()))?;
        if let Some(status) = collected.trailers().and_then(grpc_status) {
            status?;
        }
        let msg = grpc_unframe(collected.to_bytes())?;
        <ListPodResourcesResponse as prost::Message>::decode(msg)
            .map_err(|e| Error::Decode(e.to_string()))
    }
    .await;
    driver.abort();
    result
}
