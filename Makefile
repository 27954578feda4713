# memprof — run `make demo` to see it work, `make test` to prove it.
CARGO ?= cargo

.PHONY: all build release image test-image demo test unit lint fmt debug-bins crds check-crds schema check-schema docs check-docs cluster-up cluster-down bench clean

all: build

build:
	$(CARGO) build --workspace --bins

release:
	$(CARGO) build --release --workspace --bins

## The one image (operator, sidecar, CLI, Python agent) as an OCI archive,
## target/image/memprof-<version>.oci.tar, built with buildah (docs/install.md).
image:
	bash hack/image.sh

## Builds the image and runs its binaries inside it.
test-image:
	bash tests/image.sh

## The demo: local control plane, operator, a 4-rank Job with simulated GPUs.
## The first run on a fresh machine takes 20-30 min (memprof's debug build,
## which `make test` reuses, and kube-apiserver once); later runs ~2 min.
demo:
	bash hack/demo.sh

## Unit tests, then integration tests against a real kube-apiserver + etcd
## (the binaries built as `make demo` builds them: neither rebuilds the other's).
test:
	bash hack/test.sh

unit:
	$(CARGO) test --workspace --lib --bins

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	python3 hack/archcheck_test.py -q
	python3 hack/archcheck.py
	python3 hack/refdocs_test.py -q
	python3 hack/refdocs.py --check-openings

fmt:
	$(CARGO) fmt --all

## The debug binaries as `make test` builds them, with the tests' features
## (dev-dependencies turn on tokio's test-util, which rebuilds every crate
## above tokio): crds, schema and docs run this build's `memprof`, so that
## CI's check-crds and the tests after it compile each dependency once.
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
MEMPROF := $(TARGET_DIR)/debug/memprof
debug-bins:
	$(CARGO) build --quiet --workspace --bins --tests

## CRDs are generated from crates/api/src/; never edit crds/ by hand.
crds: debug-bins
	$(MEMPROF) crd > crds/memprof.yaml.new && mv crds/memprof.yaml.new crds/memprof.yaml
	cp crds/memprof.yaml charts/memprof/crds/memprof.yaml 2>/dev/null || true

check-crds: crds check-schema
	git diff --exit-code crds/ charts/memprof/crds/ || (echo "crds/ is stale: run 'make crds' and commit" && exit 1)

## The agent wire's JSON Schema is generated from crates/api/src/agent/ (the
## agent's tests validate against it); never edit agent/schema/ by hand.
schema: debug-bins
	mkdir -p agent/schema
	$(MEMPROF) agent-schema push > agent/schema/push.json.new && mv agent/schema/push.json.new agent/schema/push.json
	$(MEMPROF) agent-schema reply > agent/schema/reply.json.new && mv agent/schema/reply.json.new agent/schema/reply.json

check-schema: schema
	git diff --exit-code agent/schema/ || (echo "agent/schema/ is stale: run 'make schema' and commit" && exit 1)

## docs/reference/ is generated from the binaries' --help, crds/, agent/schema/
## and the agent's config module (hack/refdocs.py); never edit it by hand.
## The build is the one `make test` does, so neither rebuilds the other's
## binaries; `make test` runs check-docs right after that build.
docs: debug-bins
	python3 hack/refdocs.py --bin-dir $(TARGET_DIR)/debug

check-docs: docs
	@test -z "$$(git status --porcelain docs/reference/)" || { git status --short docs/reference/; \
		echo "docs/reference/ is stale: run 'make docs' and commit"; exit 1; }

cluster-up:
	bash hack/local-cluster.sh up

cluster-down:
	bash hack/local-cluster.sh down

## Benchmarks print numbers; they are not tests (see docs/benchmarks.md).
bench:
	bash hack/bench.sh
