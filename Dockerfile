# syntax=docker/dockerfile:1
# One image, two binaries: the operator (ENTRYPOINT) and the sidecar the
# webhook injects (command /usr/local/bin/memprof-sidecar), so a release is
# one image to mirror and to pin.

FROM rust:1-bookworm AS builder
WORKDIR /src
COPY . .
# Cache mounts keep the registry and target dir between builds (BuildKit).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --workspace \
        --bin memprof-operator --bin memprof-sidecar \
 && install -D -m 0755 target/release/memprof-operator /out/memprof-operator \
 && install -D -m 0755 target/release/memprof-sidecar /out/memprof-sidecar

# glibc (not static musl): NVML is loaded with dlopen from the driver's
# libnvidia-ml.so.1, which the NVIDIA container runtime mounts in.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /out/ /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/memprof-operator"]
