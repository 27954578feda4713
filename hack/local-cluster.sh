#!/usr/bin/env bash
# hack/local-cluster.sh -- a throw-away Kubernetes control plane on loopback
# for memprof's integration tests and demo.
#
#   up      install what's missing, build binaries if not cached, start
#           etcd + kube-apiserver + kube-controller-manager, wait until ready,
#           print `export KUBECONFIG=...` on stdout. No-op if already up.
#   down    stop what `up` started (by PID) and remove the state dir.
#   env     print `export KUBECONFIG=...` (for `eval "$(... env)"`).
#   status  print `up` or `down`; exit 0 only when up.
#   build   install build deps and build/cache the binaries only (CI warm-up).
#   pid C   print the PID of component C (etcd, kube-apiserver,
#           kube-controller-manager); fails when it is not running. Fault
#           tests freeze the API server with `kill -STOP` on it.
#   restart C  stop component C (by PID) and start it again with the same
#           command line, then wait until the API server is ready (fault
#           tests: an API server restart).
#
# Environment:
#   MEMPROF_CLUSTER_DIR   state dir (default ${TMPDIR:-/tmp}/memprof-cluster)
#   MEMPROF_CACHE         binary cache (default $HOME/.cache/memprof)
#   MEMPROF_CLUSTER_TIMEOUT  readiness timeout in seconds (default 90)
#   MEMPROF_DEBIAN_MIRROR optional override of the Debian mirror URI used to
#                         fetch the kubernetes source package.
#
# Why it looks like this:
# * The CI machine only reaches Debian's mirrors, crates.io and PyPI, so no
#   upstream release binaries/images (kind, k3s, envtest tarballs) can be
#   downloaded. Debian bookworm ships etcd and Go, and the full Kubernetes
#   1.20 source tree (with vendor/) as a source package, so we build
#   kube-apiserver and kube-controller-manager from that.
# * There is no scheduler and no kubelet: Pods stay Pending forever. That is
#   enough for memprof's tests, which need real API objects, CRDs, the Job
#   controller creating Pods, and ownerReference garbage collection.
# * Everything binds to 127.0.0.1 on ports the kernel hands out, so several
#   clusters (different MEMPROF_CLUSTER_DIR) can coexist with whatever else
#   runs on the machine.
#
# Progress goes to stderr; stdout carries only the `export` line, so
# `eval "$(hack/local-cluster.sh up)"` works.

set -euo pipefail

# Debian release the pinned kubernetes source package comes from. Newer Debian
# releases dropped the package, so this is deliberately not the host's
# codename.
readonly DEBIAN_SUITE=bookworm
# The kubernetes 1.20 vendor tree pins reflect2 v1.0.1, which crashes under
# Go >= 1.18; Debian packages 1.0.2 which fixes that.
readonly REFLECT2_SRC=/usr/share/gocode/src/github.com/modern-go/reflect2

: "${HOME:?HOME must be set}"
STATE_DIR="${MEMPROF_CLUSTER_DIR:-${TMPDIR:-/tmp}/memprof-cluster}"
# Canonical absolute paths matter: the state dir ends up in the daemons'
# command lines, which is how `down` recognises its own processes (see
# owned_pid), so `up` with TMPDIR=/tmp/ and `down` with TMPDIR unset must
# agree on the spelling.
STATE_DIR="$(realpath -m -- "$STATE_DIR")"
CACHE_DIR="$(realpath -m -- "${MEMPROF_CACHE:-$HOME/.cache/memprof}")"
BIN_DIR="$CACHE_DIR/bin"
READY_TIMEOUT="${MEMPROF_CLUSTER_TIMEOUT:-90}"

KUBECONFIG_PATH="$STATE_DIR/kubeconfig"
# Created by `up` right after the state dir itself; its presence means "this
# directory is ours", which is what allows `down` to rm -rf it.
MARKER="$STATE_DIR/.memprof-local-cluster"
# Stop order: dependants first, so the apiserver doesn't spam logs about a
# vanished etcd and the controller-manager doesn't about a vanished apiserver.
COMPONENTS_STOP_ORDER=(kube-controller-manager kube-apiserver etcd)

log() { printf '[local-cluster] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

usage() {
  sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//' >&2
}

# Run as root when needed; CI runs as root, developers may have sudo.
as_root() {
  if [[ $EUID -eq 0 ]]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    die "need root (or sudo) to run: $*"
  fi
}

# Serialise concurrent invocations (e.g. parallel test binaries each calling
# `up`). The state lock lives next to, not inside, the state dir because
# `down` deletes the state dir. Fixed fds: 8 = state lock, 9 = build lock
# (both are held at once by an `up` that builds); the daemons must not
# inherit either, see start_component.
# Keyed by the state dir so several clusters can coexist; kept in the cache,
# not in TMPDIR, so no file is left behind in the temp dir.
state_lockfile() {
  printf '%s/locks/%s.lock\n' "$CACHE_DIR" "$(printf '%s' "$STATE_DIR" | md5sum | cut -c1-16)"
}

take_lock() {
  local fd="$1" lockfile="$2"
  command -v flock >/dev/null 2>&1 || return 0
  mkdir -p "$(dirname "$lockfile")"
  # The wait covers a concurrent first-time build (~7 min on 2 cores).
  if [[ $fd == 8 ]]; then exec 8>"$lockfile"; else exec 9>"$lockfile"; fi
  flock -w 900 "$fd" || die "timed out waiting for lock $lockfile"
}

# ---------------------------------------------------------------------------
# Packages
# ---------------------------------------------------------------------------

# ensure_packages "cmd-or-path:package" ...
# Checks by command/path rather than dpkg status so a tool installed another
# way (e.g. a developer's own etcd) is accepted too.
ensure_packages() {
  local spec what pkg missing=()
  for spec in "$@"; do
    what="${spec%%:*}" pkg="${spec#*:}"
    if [[ "$what" == /* ]]; then
      [[ -e "$what" ]] && continue
    else
      command -v "$what" >/dev/null 2>&1 && continue
    fi
    missing+=("$pkg")
  done
  ((${#missing[@]})) || return 0
  log "installing missing packages: ${missing[*]}"
  # A fresh machine may have empty or stale package lists; updating first is
  # cheaper than diagnosing 404s. Lock::Timeout waits for a concurrent
  # apt/dpkg run instead of failing on the dpkg lock.
  as_root env DEBIAN_FRONTEND=noninteractive \
    apt-get -o DPkg::Lock::Timeout=600 -qq update >&2
  as_root env DEBIAN_FRONTEND=noninteractive \
    apt-get -o DPkg::Lock::Timeout=600 -y -q install "${missing[@]}" >&2
}

ensure_runtime_deps() {
  ensure_packages etcd:etcd-server openssl:openssl
}

ensure_build_deps() {
  # make/xz come with dpkg-dev but are listed so a partial install still
  # gets them. rsync is used by parts of the kubernetes build scripts.
  ensure_packages \
    go:golang-go \
    rsync:rsync \
    make:make \
    dpkg-source:dpkg-dev \
    xz:xz-utils \
    "$REFLECT2_SRC/reflect2.go:golang-github-modern-go-reflect2-dev"
}

# kubectl is normally preinstalled on the CI image; if it isn't, we build it
# alongside the server binaries (same source tree, ~1 extra minute).
kubectl_bin() {
  if command -v kubectl >/dev/null 2>&1; then
    command -v kubectl
  elif [[ -x "$BIN_DIR/kubectl" ]]; then
    printf '%s\n' "$BIN_DIR/kubectl"
  else
    return 1
  fi
}

# ---------------------------------------------------------------------------
# Building kube-apiserver / kube-controller-manager from Debian's source
# ---------------------------------------------------------------------------

# Prints "URI<TAB>SIGNED-BY" of the system's Debian mirror. We reuse whatever
# mirror the machine is configured with (CI machines often use a local
# mirror/proxy and reach nothing else), preferring an entry for
# $DEBIAN_SUITE with component main.
find_debian_mirror() {
  if [[ -n "${MEMPROF_DEBIAN_MIRROR:-}" ]]; then
    printf '%s\t\n' "$MEMPROF_DEBIAN_MIRROR"
    return 0
  fi
  local found="" f
  # deb822 (*.sources, bookworm's default debian.sources).
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f "$f" ]] || continue
    found="$(awk -v want="$DEBIAN_SUITE" '
      BEGIN { RS = ""; FS = "\n" }
      {
        types = uris = suites = comps = signed = ""; enabled = "yes"
        for (i = 1; i <= NF; i++) {
          line = $i
          if (line ~ /^#/ || line ~ /^[ \t]/) continue   # comments, inline-key continuation
          k = tolower(line); sub(/:.*/, "", k)
          v = line; sub(/^[^:]*:[ \t]*/, "", v)
          if (k == "types") types = v
          else if (k == "uris") uris = v
          else if (k == "suites") suites = v
          else if (k == "components") comps = v
          else if (k == "signed-by") signed = v
          else if (k == "enabled") enabled = tolower(v)
        }
        if (enabled == "no") next
        if ((" " types " ") !~ / deb(-src)? /) next
        if ((" " suites " ") !~ (" " want " ")) next
        if ((" " comps " ") !~ / main /) next
        if (signed !~ /^\//) signed = ""
        split(uris, u, /[ \t]+/)
        printf "%s\t%s\n", u[1], signed
        exit
      }' "$f")"
    [[ -n "$found" ]] && break
  done
  # One-line format (sources.list, *.list).
  if [[ -z "$found" ]]; then
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
      [[ -f "$f" ]] || continue
      found="$(awk -v want="$DEBIAN_SUITE" '
        /^[ \t]*deb(-src)?[ \t]/ {
          line = $0; signed = ""
          if (match(line, /\[[^]]*\]/)) {
            opts = substr(line, RSTART + 1, RLENGTH - 2)
            line = substr(line, 1, RSTART - 1) substr(line, RSTART + RLENGTH)
            if (match(opts, /signed-by=[^ \t]+/)) signed = substr(opts, RSTART + 10, RLENGTH - 10)
          }
          n = split(line, w, /[ \t]+/)
          j = (w[1] == "") ? 2 : 1           # leading whitespace
          uri = w[j + 1]; suite = w[j + 2]
          if (suite != want) next
          main = 0
          for (i = j + 3; i <= n; i++) if (w[i] == "main") main = 1
          if (!main) next
          if (signed !~ /^\//) signed = ""
          printf "%s\t%s\n", uri, signed
          exit
        }' "$f")"
      [[ -n "$found" ]] && break
    done
  fi
  [[ -n "$found" ]] || return 1
  printf '%s\n' "$found"
}

# Downloads and unpacks Debian's kubernetes source package into $1/src using
# a private apt configuration, so the system's sources and package lists are
# left untouched (and no root is needed for this part).
fetch_kubernetes_source() {
  local work="$1" mirror uri signed apt_dir keyring=""
  mirror="$(find_debian_mirror)" ||
    die "no Debian '$DEBIAN_SUITE main' entry found in /etc/apt/sources.list{,.d/*}; set MEMPROF_DEBIAN_MIRROR"
  uri="${mirror%%$'\t'*}" signed="${mirror#*$'\t'}"
  if [[ -n "$signed" && -r "$signed" ]]; then
    keyring="$signed"
  elif [[ -r /usr/share/keyrings/debian-archive-keyring.gpg ]]; then
    keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  fi
  log "fetching kubernetes source package from $uri ($DEBIAN_SUITE)"

  apt_dir="$work/apt"
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/parts" "$apt_dir/archives/partial"
  printf 'deb-src %s%s %s main\n' \
    "${keyring:+[signed-by=$keyring] }" "$uri" "$DEBIAN_SUITE" >"$apt_dir/sources.list"
  local apt_opts=(
    -o "Dir::Etc::SourceList=$apt_dir/sources.list"
    -o "Dir::Etc::SourceParts=$apt_dir/parts"
    -o "Dir::State::Lists=$apt_dir/lists"
    -o "Dir::Cache::Archives=$apt_dir/archives"
    # Don't let our private lists overwrite the system's binary caches.
    -o "Dir::Cache::pkgcache="
    -o "Dir::Cache::srcpkgcache="
    # Private dirs under $HOME aren't readable by the _apt sandbox user;
    # running the download as the invoking user avoids noisy warnings.
    -o "APT::Sandbox::User=$(id -un)"
  )
  apt-get "${apt_opts[@]}" -q update >&2
  (cd "$work" && apt-get "${apt_opts[@]}" -q source --download-only kubernetes >&2)

  local dsc=("$work"/kubernetes_*.dsc)
  [[ -f "${dsc[0]}" ]] || die "kubernetes .dsc not downloaded"
  log "unpacking $(basename "${dsc[0]}")"
  # apt already verified the files against the signed Release file; a missing
  # OpenPGP keyring for the .dsc signature only produces a warning here.
  (cd "$work" && dpkg-source -x "${dsc[0]}" src >&2)
  rm -f "$work"/kubernetes_*
}

# The fixes we apply on top of Debian's tree before building.
patch_kubernetes_source() {
  local src="$1" dst="$1/vendor/github.com/modern-go/reflect2"
  # reflect2 v1.0.1 (vendored) relies on runtime internals that changed in
  # Go 1.18: kube-apiserver SIGSEGVs in mapiterinit on the first CRD request.
  # Debian's 1.0.2 is API-compatible. Its go.mod must go: in a vendor tree a
  # nested go.mod would make the directory a separate module.
  [[ -d "$dst" ]] || die "unexpected source layout: $dst missing"
  rm -rf "$dst"
  mkdir -p "$dst"
  cp -rL "$REFLECT2_SRC/." "$dst/"
  rm -f "$dst/go.mod" "$dst/go.sum"
}

build_binaries() {
  local want=(kube-apiserver kube-controller-manager) need_build=0 b
  kubectl_bin >/dev/null || want+=(kubectl)
  for b in "${want[@]}"; do
    [[ -x "$BIN_DIR/$b" ]] || need_build=1
  done
  ((need_build)) || return 0

  take_lock 9 "$CACHE_DIR/build.lock"
  # Another invocation may have built them while we waited for the lock.
  need_build=0
  for b in "${want[@]}"; do
    [[ -x "$BIN_DIR/$b" ]] || need_build=1
  done
  ((need_build)) || return 0

  ensure_build_deps
  local start=$SECONDS work="$CACHE_DIR/build"
  # A leftover tree means a previous build was interrupted; start clean
  # rather than trusting a half-patched tree.
  rm -rf "$work"
  mkdir -p "$work"
  fetch_kubernetes_source "$work"
  local src="$work/src"
  patch_kubernetes_source "$src"

  local what="" gopath="$src/.go"
  for b in "${want[@]}"; do what+="cmd/$b "; done
  log "building ${want[*]} (takes ~5 minutes on 2 cores)"
  # Same GOPATH layout as debian/rules (kubernetes 1.20's build scripts force
  # GO111MODULE=off). PATH prefers Debian's Go like debian/rules does, in case
  # a newer Go that can't build 1.20 is first on PATH. GOFLAGS is cleared so a
  # developer's -mod=... can't interfere; GOPROXY=off proves nothing is
  # fetched. The build keeps its Go cache inside _output/, so removing the
  # tree afterwards removes it too.
  mkdir -p "$gopath/src/k8s.io"
  [[ -L "$gopath/src/k8s.io/kubernetes" ]] || ln -s ../../.. "$gopath/src/k8s.io/kubernetes"
  (
    cd "$gopath/src/k8s.io/kubernetes"
    env PATH="/usr/lib/go/bin:$PATH" GOPATH="$gopath" CGO_ENABLED=0 \
      GOFLAGS= GOPROXY=off make WHAT="${what% }" >&2
  ) || die "kubernetes build failed (tree kept in $work for inspection)"

  mkdir -p "$BIN_DIR"
  for b in "${want[@]}"; do
    # Copy then rename so a concurrent reader never sees a partial binary.
    cp -L "$src/_output/bin/$b" "$BIN_DIR/.$b.tmp"
    chmod 0755 "$BIN_DIR/.$b.tmp"
    mv -f "$BIN_DIR/.$b.tmp" "$BIN_DIR/$b"
  done
  rm -rf "$work"
  log "built ${want[*]} into $BIN_DIR in $((SECONDS - start))s"
}

# ---------------------------------------------------------------------------
# Process management
# ---------------------------------------------------------------------------

pidfile() { printf '%s/pids/%s.pid\n' "$STATE_DIR" "$1"; }

# Alive and not a zombie (a daemon started by this very script invocation
# stays a zombie until reaped, and kill -0 succeeds on zombies).
pid_alive() {
  local pid="$1" state
  kill -0 "$pid" 2>/dev/null || return 1
  state="$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" || return 1
  [[ "$state" != Z ]]
}

# Every daemon gets the state dir on its command line, so this guards against
# a recycled PID belonging to an unrelated process.
owned_pid() {
  local pid="$1" cmdline
  cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
  [[ "$cmdline" == *"$STATE_DIR/"* ]]
}

# Prints the PID of a running component we started, or fails.
component_pid() {
  local f pid
  f="$(pidfile "$1")"
  [[ -r "$f" ]] || return 1
  pid="$(<"$f")"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  pid_alive "$pid" && owned_pid "$pid" || return 1
  printf '%s\n' "$pid"
}

# start NAME BINARY ARGS...
start_component() {
  local name="$1"
  shift
  # setsid: own session, so a Ctrl-C / SIGHUP aimed at the caller's process
  # group (make, cargo test, a CI step) doesn't take the cluster down with it.
  # Inside a non-interactive script a background job is not a process-group
  # leader, so setsid execs in place and $! is the daemon's own PID.
  # 8>&- 9>&-: don't leak the lock fds, or the daemon would hold the lock
  # for its whole life and the next `up`/`down` would block on it.
  # stdout must not be inherited either: `eval "$(... up)"` would hang.
  setsid nohup "$@" >"$STATE_DIR/logs/$name.log" 2>&1 </dev/null 8>&- 9>&- &
  local pid=$! i
  printf '%s\n' "$pid" >"$(pidfile "$name")"
  # Until the child has exec'ed, its command line is still this script's,
  # which owned_pid rejects: a check in that window reads a live daemon as
  # "exited" (seen on a loaded 2-core CI machine: "etcd exited while waiting",
  # an empty log, then "stopping etcd" found it running). Return only once
  # the daemon itself is in place, or gone.
  for ((i = 0; i < 100; i++)); do
    pid_alive "$pid" && ! owned_pid "$pid" || break
    sleep 0.1
  done
}

stop_component() {
  local name="$1" f pid i
  f="$(pidfile "$name")"
  [[ -r "$f" ]] || return 0
  pid="$(<"$f")"
  if [[ "$pid" =~ ^[0-9]+$ ]] && pid_alive "$pid"; then
    if ! owned_pid "$pid"; then
      log "pid $pid from $f is not ours any more; leaving it alone"
    else
      log "stopping $name (pid $pid)"
      kill -TERM "$pid" 2>/dev/null || true
      for ((i = 0; i < 100; i++)); do # 10 s grace: etcd/apiserver exit in <2 s
        pid_alive "$pid" || break
        sleep 0.1
      done
      if pid_alive "$pid"; then
        log "$name (pid $pid) ignored SIGTERM; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do
          pid_alive "$pid" || break
          sleep 0.1
        done
        pid_alive "$pid" && log "WARNING: $name (pid $pid) still alive"
      fi
    fi
  fi
  # Reap it if it's our own child (failed `up` in this invocation).
  wait "$pid" 2>/dev/null || true
  rm -f "$f"
}

stop_all() {
  local c
  for c in "${COMPONENTS_STOP_ORDER[@]}"; do stop_component "$c"; done
}

# Removes the state dir, but only if it's recognisably ours: a mistaken
# MEMPROF_CLUSTER_DIR=$HOME must not be wiped.
remove_state_dir() {
  [[ -e "$STATE_DIR" ]] || return 0
  if [[ -e "$MARKER" ]] || [[ -z "$(ls -A "$STATE_DIR" 2>/dev/null)" ]]; then
    rm -rf "$STATE_DIR"
  else
    log "WARNING: $STATE_DIR has no $(basename "$MARKER") marker; not deleting it"
  fi
}

tail_log() {
  local f="$STATE_DIR/logs/$1.log"
  [[ -r "$f" ]] || return 0
  log "---- last 40 lines of $f ----"
  tail -n 40 "$f" >&2 || true
  log "---- end of $1.log ----"
}

kubectl_k() {
  local kubectl
  kubectl="$(kubectl_bin)" || return 1
  # kubectl 1.32 vs server 1.20 logs a skew warning on stderr; harmless.
  "$kubectl" --kubeconfig "$KUBECONFIG_PATH" --request-timeout=5s "$@"
}

apiserver_ready() {
  kubectl_k get --raw /readyz >/dev/null 2>&1
}

daemons_running() {
  local c
  [[ -r "$KUBECONFIG_PATH" ]] || return 1
  for c in etcd kube-apiserver kube-controller-manager; do
    component_pid "$c" >/dev/null || return 1
  done
}

cluster_up() {
  daemons_running && apiserver_ready
}

# Ports are chosen by binding port 0 and releasing it: the kernel's choice is
# free right now, and holding all sockets open together keeps them distinct.
# perl is Essential on Debian; python3 may not be installed.
free_ports() {
  local n="$1"
  if command -v perl >/dev/null 2>&1; then
    perl -MIO::Socket::INET -e '
      my @s;
      for (1 .. $ARGV[0]) {
        my $s = IO::Socket::INET->new(Listen => 1, LocalAddr => "127.0.0.1",
                                      LocalPort => 0, Proto => "tcp") or die "bind: $!";
        push @s, $s;
        print $s->sockport, "\n";
      }' "$n"
  else
    python3 -c '
import socket, sys
ss = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1); ss.append(s)
    print(s.getsockname()[1])' "$n"
  fi
}

tcp_listening() {
  timeout 2 bash -c ": </dev/tcp/127.0.0.1/$1" 2>/dev/null
}

# ---------------------------------------------------------------------------
# Cluster bring-up
# ---------------------------------------------------------------------------

generate_credentials() {
  local certs="$STATE_DIR/certs"
  # Our own CA + serving cert instead of the apiserver's auto-generated
  # self-signed pair: the kubeconfig can then be written before the apiserver
  # starts, and strict TLS stacks (rustls/webpki used by Rust kube clients)
  # get a proper CA:TRUE root and a CA:FALSE leaf with an IP SAN.
  openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 \
    -subj "/CN=memprof-local-cluster-ca" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -keyout "$certs/ca.key" -out "$certs/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -sha256 -subj "/CN=kube-apiserver" \
    -keyout "$certs/apiserver.key" -out "$certs/apiserver.csr" 2>/dev/null
  cat >"$certs/apiserver.ext" <<'EOF'
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc
EOF
  openssl x509 -req -sha256 -days 3650 -in "$certs/apiserver.csr" \
    -CA "$certs/ca.crt" -CAkey "$certs/ca.key" -CAcreateserial \
    -extfile "$certs/apiserver.ext" -out "$certs/apiserver.crt" 2>/dev/null
  # Service-account signing key (controller-manager signs token secrets,
  # apiserver verifies them and signs TokenRequest tokens).
  openssl genrsa -out "$certs/sa.key" 2048 2>/dev/null
  openssl rsa -in "$certs/sa.key" -pubout -out "$certs/sa.pub" 2>/dev/null

  # Static admin token in system:masters: cluster-admin through RBAC's
  # bootstrap bindings without needing client certificates.
  ADMIN_TOKEN="$(openssl rand -hex 32)"
  printf '%s,memprof-admin,memprof-admin,"system:masters"\n' "$ADMIN_TOKEN" \
    >"$STATE_DIR/tokens.csv"
}

write_kubeconfig() {
  local server="$1" ca_data
  ca_data="$(base64 -w0 <"$STATE_DIR/certs/ca.crt")"
  # CA embedded (not referenced by path) so the file stays self-contained
  # for clients that resolve relative paths differently.
  cat >"$KUBECONFIG_PATH" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: memprof-local
  cluster:
    server: $server
    certificate-authority-data: $ca_data
users:
- name: memprof-admin
  user:
    token: $ADMIN_TOKEN
contexts:
- name: memprof-local
  context:
    cluster: memprof-local
    user: memprof-admin
    namespace: default
current-context: memprof-local
EOF
}

# wait_for DESCRIPTION DEADLINE_SECONDS COMPONENT-TO-WATCH COMMAND...
# Fails early if the watched daemon dies instead of waiting out the timeout.
wait_for() {
  local what="$1" deadline="$2" watch="$3"
  shift 3
  while ! "$@"; do
    if ! component_pid "$watch" >/dev/null; then
      log "$watch exited while waiting for $what"
      return 1
    fi
    if ((SECONDS >= deadline)); then
      log "timed out waiting for $what"
      return 1
    fi
    sleep 0.5
  done
}

default_sa_ready() {
  # The token secret, not just the ServiceAccount: until it exists the
  # ServiceAccount admission plugin (1.20) rejects Pods using the account.
  local secret
  secret="$(kubectl_k -n default get serviceaccount default \
    -o 'jsonpath={.secrets[0].name}' 2>/dev/null)" || return 1
  [[ -n "$secret" ]]
}

etcd_listening() { tcp_listening "$ETCD_CLIENT_PORT"; }

# One attempt at starting everything; returns non-zero on failure with the
# daemons possibly still running (the caller cleans up).
start_cluster() {
  local deadline=$((SECONDS + READY_TIMEOUT)) ports
  mkdir -p "$STATE_DIR"/{certs,logs,pids,etcd,apiserver-certs}
  : >"$MARKER"
  generate_credentials

  mapfile -t ports < <(free_ports 3)
  ((${#ports[@]} == 3)) || { log "could not pick free ports"; return 1; }
  ETCD_CLIENT_PORT="${ports[0]}"
  local etcd_peer_port="${ports[1]}" api_port="${ports[2]}"
  local etcd_url="http://127.0.0.1:$ETCD_CLIENT_PORT"
  local api_url="https://127.0.0.1:$api_port"
  printf 'APISERVER_URL=%s\nETCD_URL=%s\n' "$api_url" "$etcd_url" >"$STATE_DIR/cluster.env"
  write_kubeconfig "$api_url"

  local bin_etcd
  bin_etcd="$(command -v etcd)"
  log "starting etcd on $etcd_url"
  # --quota-backend-bytes: 8 GiB, not the default 2 GiB. A cluster kept up
  # through several benchmarks (operator_memory writes ~0.5 GB of hostile
  # metadata a run) otherwise hits "mvcc: database space exceeded" and
  # every write fails; the file only grows as far as it is used.
  start_component etcd "$bin_etcd" \
    --quota-backend-bytes=8589934592 \
    --name=memprof \
    --data-dir="$STATE_DIR/etcd" \
    --listen-client-urls="$etcd_url" \
    --advertise-client-urls="$etcd_url" \
    --listen-peer-urls="http://127.0.0.1:$etcd_peer_port" \
    --initial-advertise-peer-urls="http://127.0.0.1:$etcd_peer_port" \
    --initial-cluster="memprof=http://127.0.0.1:$etcd_peer_port" \
    --initial-cluster-state=new
  wait_for "etcd to listen" "$deadline" etcd etcd_listening || {
    tail_log etcd
    return 1
  }

  local certs="$STATE_DIR/certs"
  log "starting kube-apiserver on $api_url"
  # --insecure-port=0: 1.20 otherwise also serves unauthenticated HTTP on
  # 127.0.0.1:8080, which would clash between clusters and bypass auth.
  # --endpoint-reconciler-type=none: the default reconciler tries to publish
  # the advertise address (127.0.0.1) in the `kubernetes` Endpoints object,
  # which validation rejects for loopback IPs, producing an error every few
  # seconds; nothing in-cluster can use that endpoint anyway.
  # --cert-dir: for anything the apiserver would otherwise write to
  # /var/run/kubernetes (the serving pair itself is ours, see above).
  start_component kube-apiserver "$BIN_DIR/kube-apiserver" \
    --etcd-servers="$etcd_url" \
    --insecure-port=0 \
    --secure-port="$api_port" \
    --bind-address=127.0.0.1 \
    --advertise-address=127.0.0.1 \
    --cert-dir="$STATE_DIR/apiserver-certs" \
    --tls-cert-file="$certs/apiserver.crt" \
    --tls-private-key-file="$certs/apiserver.key" \
    --token-auth-file="$STATE_DIR/tokens.csv" \
    --authorization-mode=RBAC \
    --service-account-issuer=https://kubernetes.default.svc \
    --service-account-key-file="$certs/sa.pub" \
    --service-account-signing-key-file="$certs/sa.key" \
    --service-cluster-ip-range=10.0.0.0/24 \
    --endpoint-reconciler-type=none
  wait_for "kube-apiserver /readyz" "$deadline" kube-apiserver apiserver_ready || {
    tail_log kube-apiserver
    return 1
  }

  log "starting kube-controller-manager"
  # Only the controllers the tests need: job (creates Pods), garbagecollector
  # (ownerReferences), serviceaccount (+ -token: without the default
  # ServiceAccount and its token the Job controller can't create Pods),
  # namespace (namespace deletion actually empties and removes namespaces).
  # --port=0 / --secure-port=0: no health endpoints; in 1.20 the insecure
  # port would otherwise default to 0.0.0.0:10252.
  # --use-service-account-credentials=false: controllers share the admin
  # token instead of per-controller accounts (no RBAC roles needed for them).
  start_component kube-controller-manager "$BIN_DIR/kube-controller-manager" \
    --kubeconfig="$KUBECONFIG_PATH" \
    --controllers=job,garbagecollector,serviceaccount,serviceaccount-token,namespace \
    --service-account-private-key-file="$certs/sa.key" \
    --root-ca-file="$certs/ca.crt" \
    --use-service-account-credentials=false \
    --leader-elect=false \
    --bind-address=127.0.0.1 \
    --secure-port=0 \
    --port=0
  wait_for "default ServiceAccount and its token" "$deadline" \
    kube-controller-manager default_sa_ready || {
    tail_log kube-controller-manager
    return 1
  }
}

print_env() {
  printf 'export KUBECONFIG=%q\n' "$KUBECONFIG_PATH"
}

cmd_up() {
  take_lock 8 "$(state_lockfile)"
  if daemons_running; then
    # All daemons alive: give a slow apiserver (machine busy compiling) the
    # full timeout before declaring the cluster broken and recreating it.
    local deadline=$((SECONDS + READY_TIMEOUT))
    if wait_for "existing cluster" "$deadline" kube-apiserver apiserver_ready &&
      wait_for "existing cluster" "$deadline" kube-controller-manager default_sa_ready; then
      log "already up ($STATE_DIR)"
      print_env
      return 0
    fi
  fi
  if [[ -e "$STATE_DIR" ]]; then
    # Leftovers of a crashed/failed/rebooted cluster: start from scratch,
    # there's nothing in it worth keeping.
    log "cleaning stale state in $STATE_DIR"
    stop_all
    remove_state_dir
    [[ -e "$STATE_DIR" ]] && die "$STATE_DIR exists and isn't ours; pick another MEMPROF_CLUSTER_DIR"
  fi

  ensure_runtime_deps
  build_binaries
  kubectl_bin >/dev/null || die "kubectl not found"

  local start=$SECONDS attempt
  umask 077 # keys, token and kubeconfig are credentials
  for attempt in 1 2; do
    if start_cluster; then
      log "cluster up in $((SECONDS - start))s; state in $STATE_DIR"
      print_env
      return 0
    fi
    stop_all
    # The only failure worth retrying: a picked port got taken between
    # choosing and binding it.
    if ((attempt == 1)) && grep -qs "address already in use" "$STATE_DIR"/logs/*.log; then
      log "port clash; retrying with new ports"
      remove_state_dir
      continue
    fi
    break
  done
  log "failed to start the cluster; logs kept in $STATE_DIR/logs (run '$0 down' to remove)"
  return 1
}

cmd_down() {
  take_lock 8 "$(state_lockfile)"
  stop_all
  remove_state_dir
  log "down"
}

cmd_status() {
  if cluster_up; then
    echo up
  else
    echo down
    return 1
  fi
}

known_component() {
  [[ " ${COMPONENTS_STOP_ORDER[*]} " == *" ${1:-} "* ]] ||
    die "name a component: ${COMPONENTS_STOP_ORDER[*]}"
}

cmd_pid() {
  known_component "${1:-}"
  component_pid "$1" || die "$1 is not running (state dir $STATE_DIR)"
}

cmd_restart() {
  local c="${1:-}" pid args deadline
  known_component "$c"
  take_lock 8 "$(state_lockfile)"
  pid="$(component_pid "$c")" || die "$c is not running (state dir $STATE_DIR)"
  # The same command line: same ports, certificates and data dir.
  mapfile -d '' args <"/proc/$pid/cmdline"
  stop_component "$c"
  umask 077
  start_component "$c" "${args[@]}"
  deadline=$((SECONDS + READY_TIMEOUT))
  wait_for "kube-apiserver /readyz after restarting $c" "$deadline" "$c" apiserver_ready || {
    tail_log "$c"
    return 1
  }
  log "restarted $c (pid $(component_pid "$c"))"
}

cmd_build() {
  # Runtime packages too, so a CI warm-up step leaves nothing for `up` to
  # install.
  ensure_runtime_deps
  build_binaries
  log "binaries in $BIN_DIR: $(cd "$BIN_DIR" && echo *)"
}

main() {
  case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    env) print_env ;;
    status) cmd_status ;;
    build) cmd_build ;;
    pid) cmd_pid "${2:-}" ;;
    restart) cmd_restart "${2:-}" ;;
    -h | --help | help) usage ;;
    *)
      usage
      exit 2
      ;;
  esac
}

main "$@"
