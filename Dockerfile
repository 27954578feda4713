# syntax=docker/dockerfile:1
# One image: the operator (ENTRYPOINT), the sidecar the webhook injects
# (command /usr/local/bin/memprof-sidecar) and the Python agent with the
# `memprof` CLI that copies it into pods annotated memprof.dev/agent: "python"
# (`memprof install-agent`, run by an init container: this image has no
# shell), so a release is one image to mirror and to pin.

FROM rust:1-bookworm AS builder
WORKDIR /src
COPY . .
# Cache mounts keep the registry and target dir between builds (BuildKit).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --workspace \
        --bin memprof-operator --bin memprof-sidecar --bin memprof \
 && install -D -m 0755 target/release/memprof-operator /out/memprof-operator \
 && install -D -m 0755 target/release/memprof-sidecar /out/memprof-sidecar \
 && install -D -m 0755 target/release/memprof /out/memprof

# glibc (not static musl): NVML is loaded with dlopen from the driver's
# libnvidia-ml.so.1, which the NVIDIA container runtime mounts in.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /out/ /usr/local/bin/
# The agent tree at --agent-path's default (src/cli/install_agent.rs):
# bootstrap/ goes first on the trainers' PYTHONPATH, lib/ last.
COPY agent/python/bootstrap/sitecustomize.py agent/python/bootstrap/_memprof_bootstrap.py /opt/memprof/agent/bootstrap/
COPY agent/python/memprof_agent/ /opt/memprof/agent/lib/memprof_agent/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/memprof-operator"]
