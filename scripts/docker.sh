#!/usr/bin/env bash
# Prepare a Docker engine for the Docker provider's tests. Idempotent.
#
# - installs docker.io and busybox-static (apt-get) when missing;
# - starts `dockerd --bridge=none` when no engine answers on the socket
#   (log: /tmp/sandhost-dockerd.log, pidfile: /run/sandhost-dockerd.pid);
# - builds the test image sandhost-test-busybox:latest (FROM scratch with a
#   static busybox and one symlink per applet) when it is missing.
#
# No registry is contacted: the image is built from a local context only.
set -euo pipefail

IMAGE="${SANDHOST_DOCKER_TEST_IMAGE:-sandhost-test-busybox:latest}"
SOCK="${SANDHOST_DOCKER_SOCK:-/var/run/docker.sock}"
LOG="${SANDHOST_DOCKERD_LOG:-/tmp/sandhost-dockerd.log}"
PIDFILE="${SANDHOST_DOCKERD_PIDFILE:-/run/sandhost-dockerd.pid}"

say() { printf 'docker.sh: %s\n' "$*" >&2; }

need_pkg() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

missing=()
need_pkg docker.io || missing+=(docker.io)
need_pkg busybox-static || missing+=(busybox-static)
if [ "${#missing[@]}" -gt 0 ]; then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || {
        apt-get update >/dev/null
        apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
    }
fi

engine_answers() {
    docker -H "unix://$SOCK" version --format '{{.Server.Version}}' >/dev/null 2>&1
}

if ! engine_answers; then
    if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
        say "dockerd (pid $(cat "$PIDFILE")) is starting; waiting"
    else
        say "starting dockerd --bridge=none (log $LOG)"
        # --pidfile is dockerd's own; setsid detaches it from this shell.
        setsid dockerd --bridge=none --pidfile "$PIDFILE" -H "unix://$SOCK" \
            >"$LOG" 2>&1 </dev/null &
    fi
    for _ in $(seq 1 120); do
        engine_answers && break
        sleep 0.5
    done
    if ! engine_answers; then
        say "the Docker engine did not answer on $SOCK within 60 s; see $LOG"
        tail -n 20 "$LOG" >&2 || true
        exit 1
    fi
fi
say "engine $(docker -H "unix://$SOCK" version --format '{{.Server.Version}} (API {{.Server.APIVersion}})')"

if ! docker -H "unix://$SOCK" image inspect "$IMAGE" >/dev/null 2>&1; then
    say "building $IMAGE from busybox-static"
    ctx="$(mktemp -d)"
    trap 'rm -rf "$ctx"' EXIT
    mkdir -p "$ctx/rootfs/bin" "$ctx/rootfs/etc" "$ctx/rootfs/workspace" "$ctx/rootfs/tmp"
    cp /bin/busybox "$ctx/rootfs/bin/busybox"
    for applet in $(/bin/busybox --list); do
        [ "$applet" = busybox ] || ln -s busybox "$ctx/rootfs/bin/$applet"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' \
        >"$ctx/rootfs/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$ctx/rootfs/etc/group"
    cat >"$ctx/Dockerfile" <<'EOF'
FROM scratch
COPY rootfs/ /
ENV PATH=/bin
WORKDIR /workspace
CMD ["/bin/sh"]
EOF
    docker -H "unix://$SOCK" build -q -t "$IMAGE" "$ctx" >/dev/null
fi
say "image $IMAGE ready"
