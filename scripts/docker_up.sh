#!/usr/bin/env bash
# Make a Docker daemon answer: use a reachable one (DOCKER_HOST or the default socket); otherwise, as root,
# install docker.io from Debian if dockerd is missing and start dockerd without networking of its own
# (overlay2, no iptables, no bridge: every project container runs with --network none).
# Idempotent and quiet when a daemon already answers. Progress lines start with "[docker]".
# Env: RSI_DOCKERD_LOG (default /tmp/dockerd.log), RSI_DOCKERD_WAIT_S (default 60).
set -euo pipefail
log() { echo "[docker] $*" >&2; }
answers() { docker info >/dev/null 2>&1; }

command -v docker >/dev/null 2>&1 && answers && exit 0

if [ -n "${DOCKER_HOST:-}" ] && [[ "$DOCKER_HOST" != unix://* ]]; then
  log "ERROR: DOCKER_HOST=$DOCKER_HOST does not answer (a remote daemon is not started from here)"
  exit 1
fi
if [ "$(id -u)" != 0 ]; then
  log "ERROR: no Docker daemon answers and this user is not root (cannot install or start dockerd)"
  exit 1
fi

if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
  log "installing docker.io from Debian ..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends docker.io >/dev/null
  log "installed $(dockerd --version)"
fi

if ! pgrep -x dockerd >/dev/null 2>&1; then
  logf=${RSI_DOCKERD_LOG:-/tmp/dockerd.log}
  log "starting dockerd (overlay2, --iptables=false --bridge=none), log $logf"
  # setsid + nohup: the daemon outlives this script and the shell that ran it.
  setsid nohup dockerd --storage-driver=overlay2 --iptables=false --ip6tables=false --bridge=none \
    >"$logf" 2>&1 < /dev/null &
fi

wait_s=${RSI_DOCKERD_WAIT_S:-60}
for ((i = 0; i < wait_s * 4; i++)); do
  if answers; then
    log "daemon answers ($(docker version --format '{{.Server.Version}}' 2>/dev/null))"
    exit 0
  fi
  sleep 0.25
done
log "ERROR: dockerd did not answer within ${wait_s}s; last log lines:"
tail -n 20 "${RSI_DOCKERD_LOG:-/tmp/dockerd.log}" >&2 || true
exit 1
