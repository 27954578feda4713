# The memprof image: one image to mirror and to pin. It holds
#   /usr/local/bin/memprof-operator  the ENTRYPOINT (the chart passes flags only)
#   /usr/local/bin/memprof-sidecar   the sidecar the webhook injects (its `command`)
#   /usr/local/bin/memprof           the CLI; `memprof install-agent` is the init
#                                    container that copies the Python agent
#   /opt/memprof/agent               that agent tree (install-agent's default --from)
# and, beside them, only the shared libraries those binaries link (ldd), the
# CA bundle, /etc/passwd with uid 65532, and /tmp. No shell, no package
# manager. NVML (libnvidia-ml.so.1) is not here: the sidecar loads it at run
# time from the driver, which the NVIDIA container toolkit mounts in.
#
# This file names no base image and no registry: `make image` (hack/image.sh)
# compiles the release binaries here, stages their root filesystem under
# rootfs/ in a build context, and builds this file with buildah into an OCI
# archive. With Docker instead:
#   bash hack/image.sh --stage target/image/context
#   docker build -f Dockerfile -t memprof:0.1.0 target/image/context
FROM scratch
ARG VERSION=unknown
ARG REVISION=unknown
ARG CREATED=1970-01-01T00:00:00Z
ARG SOURCE=""
COPY rootfs/ /
LABEL org.opencontainers.image.title="memprof" \
      org.opencontainers.image.description="GPU memory profiling and OOM prevention for training Jobs: operator, sidecar, CLI and Python agent" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0"
# Numeric, so that runAsNonRoot can check it without reading /etc/passwd.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/memprof-operator"]
