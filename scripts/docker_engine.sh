#!/usr/bin/env bash
# A private Docker engine for the tests and for trying local_docker: Debian's docker.io, its own
# dockerd (no systemd), a local registry on loopback, and the images the tests run (no image
# registry on the internet is needed: the base images are made from Debian's packages).
#
#   bash scripts/docker_engine.sh install   # apt-get install docker.io debootstrap docker-registry
#   bash scripts/docker_engine.sh start     # start (or reuse) dockerd and the registry
#   eval "$(bash scripts/docker_engine.sh env)"   # export DOCKER_HOST (and TORCHX_TEST_REGISTRY)
#   bash scripts/docker_engine.sh images    # make the base images once, build torchx's image
#   bash scripts/docker_engine.sh stop      # stop exactly the daemons started
#   bash scripts/docker_engine.sh status    # exit 0 while its dockerd runs
#
# Base images (kept in the engine's data root between runs on one machine):
#   local/debian:bookworm          debootstrap --variant=minbase
#   local/python:3.11              + Debian's python3 in a venv first on PATH, like python:3.11-slim
#   local/pytorch:2.13.0-cpu       + the CPU torch wheel that lies on this machine's disk
# torchx's own image (Dockerfile at the root) is built on local/pytorch:2.13.0-cpu with the kfp,
# mlflow and examples extras and tagged torchx.IMAGE.
# Knobs: TORCHX_DOCKER_DIR (default /var/tmp/torchx-docker), TORCHX_REGISTRY_PORT (default 15000).
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=$(realpath -m "${TORCHX_DOCKER_DIR:-/var/tmp/torchx-docker}")
SOCK="$DIR/docker.sock"
REGISTRY_PORT=${TORCHX_REGISTRY_PORT:-15000}
export DOCKER_HOST="unix://$SOCK"
PY=${PYTHON:-.venv/bin/python}

log() { echo "docker_engine: $*" >&2; }

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

install() {
    local missing=()
    command -v dockerd >/dev/null || missing+=(docker.io)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    [ -x /usr/bin/docker-registry ] || missing+=(docker-registry)
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" = 0 ] || { log "needs root to install ${missing[*]}"; return 1; }
    log "installing ${missing[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
}

docker_() { /usr/bin/docker "$@"; }   # Debian's client, the engine's own version

start() {
    mkdir -p "$DIR"
    if ! alive "$DIR/dockerd.pid"; then
        rm -f "$SOCK"
        setsid dockerd --data-root "$DIR/root" --exec-root "$DIR/exec" --pidfile "$DIR/dockerd.pid" \
            -H "$DOCKER_HOST" --iptables=false --ip-masq=false --bridge=none \
            --storage-driver=overlay2 >"$DIR/dockerd.log" 2>&1 </dev/null &
        for _ in $(seq 100); do
            docker_ version >/dev/null 2>&1 && break
            sleep 0.2
        done
        docker_ version >/dev/null 2>&1 || { log "dockerd did not start: $DIR/dockerd.log"; exit 1; }
    fi
    if ! alive "$DIR/registry.pid"; then
        mkdir -p "$DIR/registry"
        cat >"$DIR/registry.yml" <<EOF
version: 0.1
storage:
  filesystem:
    rootdirectory: $DIR/registry
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$REGISTRY_PORT
EOF
        setsid /usr/bin/docker-registry serve "$DIR/registry.yml" >"$DIR/registry.log" 2>&1 </dev/null &
        echo $! >"$DIR/registry.pid"
        for _ in $(seq 100); do
            "$PY" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$REGISTRY_PORT/v2/')" \
                2>/dev/null && break
            sleep 0.1
        done
    fi
    log "dockerd and registry up ($DOCKER_HOST, 127.0.0.1:$REGISTRY_PORT)"
}

env_() {
    echo "export DOCKER_HOST=$DOCKER_HOST"
    echo "export TORCHX_TEST_REGISTRY=127.0.0.1:$REGISTRY_PORT"
}

has_image() { docker_ image inspect "$1" >/dev/null 2>&1; }

images() {
    local ctx
    ctx=$(mktemp -d)
    trap 'rm -rf "$ctx"' RETURN
    if ! has_image local/debian:bookworm; then
        local mirror
        mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null \
            || true)
        log "debootstrap bookworm (~30 s, once per machine)"
        debootstrap --variant=minbase bookworm "$ctx/rootfs" "${mirror:-http://deb.debian.org/debian}" \
            >"$DIR/debootstrap.log" 2>&1 || { log "debootstrap failed: $DIR/debootstrap.log"; exit 1; }
        # the host's apt sources (the same mirror the host uses)
        cp /etc/apt/sources.list.d/debian.sources "$ctx/rootfs/etc/apt/sources.list.d/" 2>/dev/null || true
        tar -C "$ctx/rootfs" -c . | docker_ import - local/debian:bookworm >/dev/null
        rm -rf "$ctx/rootfs"
    fi
    if ! has_image local/python:3.11; then
        log "building local/python:3.11"
        cp /etc/ssl/certs/ca-certificates.crt "$ctx/host-ca.crt"
        # the host's CA bundle: pip and uv in the image reach PyPI the way the host does
        cat >"$ctx/Dockerfile" <<'EOF'
FROM local/debian:bookworm
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends python3 python3-venv ca-certificates >/dev/null \
    && rm -rf /var/lib/apt/lists/* && python3 -m venv /opt/python
COPY host-ca.crt /etc/host-ca.crt
ENV PATH=/opt/python/bin:$PATH PIP_CERT=/etc/host-ca.crt SSL_CERT_FILE=/etc/host-ca.crt \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
EOF
        docker_ build -q --network host -t local/python:3.11 "$ctx" >/dev/null
    fi
    if ! has_image local/pytorch:2.13.0-cpu; then
        log "building local/pytorch:2.13.0-cpu"
        rm -f "$ctx"/*
        cp "$(bash scripts/torch_wheel.sh)" "$ctx/"
        # installed by the host's uv (pip took 71 s where uv takes 48 s, most of both the
        # layer's commit); byte-compiled, as pip does: each container starts from the image
        cp "$(dirname "$PY")/uv" "$ctx/"
        cat >"$ctx/Dockerfile" <<'EOF'
FROM local/python:3.11
COPY *.whl uv /tmp/
RUN /tmp/uv pip install -q --python /opt/python/bin/python --compile-bytecode /tmp/*.whl \
    && rm /tmp/*.whl /tmp/uv
EOF
        docker_ build -q --network host -t local/pytorch:2.13.0-cpu "$ctx" >/dev/null
    fi
    local tag
    tag=$("$PY" -c 'import torchx; print(torchx.IMAGE)')
    log "building $tag (torchx's Dockerfile on local/pytorch:2.13.0-cpu)"
    docker_ build -q --network host --build-arg BASE_IMAGE=local/pytorch:2.13.0-cpu \
        --build-arg EXTRAS=kfp,mlflow,examples -t "$tag" . >/dev/null
}

stop() {
    if alive "$DIR/dockerd.pid"; then  # what the tests left: torchx's containers, dangling images
        docker_ container prune -f --filter label=torchx.pytorch.org/app-id >/dev/null 2>&1 || true
        docker_ images --format '{{.Repository}}:{{.Tag}}' | grep '^127\.0\.0\.1:' \
            | xargs -r /usr/bin/docker rmi >/dev/null 2>&1 || true   # pushed to loopback registries
        docker_ image prune -f >/dev/null 2>&1 || true
    fi
    for name in registry dockerd; do
        if alive "$DIR/$name.pid"; then
            local pid
            pid=$(cat "$DIR/$name.pid")
            kill "$pid" 2>/dev/null || true
            for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        fi
        rm -f "$DIR/$name.pid"
    done
}

case "${1:-}" in
    install) install ;;
    start) start ;;
    env) env_ ;;
    images) images ;;
    stop) stop ;;
    status) alive "$DIR/dockerd.pid" ;;
    *) echo "usage: $0 install|start|env|images|stop|status" >&2; exit 2 ;;
esac
