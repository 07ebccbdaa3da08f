#!/usr/bin/env bash
# Build the local base image `rsi-base` without any registry: debootstrap a Debian minbase root filesystem
# with python3 (+ a few small tools terminal tasks use), install pinned pytest + pytest-json-ctrf wheels
# (fetched by the host's pip) into it, and `docker import` it.
# Cached by a content tag: rsi-base:<hash of the recipe below>; an unchanged recipe is skipped (quietly),
# a changed one rebuilds. rsi-base:latest always points at the current recipe's image.
# Needs a Docker daemon (scripts/docker_up.sh) and, to build, root (debootstrap, chroot).
# Env: RSI_BASE_IMAGE (default rsi-base), RSI_DEBIAN_MIRROR (default http://deb.debian.org/debian).
set -euo pipefail
log() { echo "[docker] $*" >&2; }

name=${RSI_BASE_IMAGE:-rsi-base}
suite=bookworm
mirror=${RSI_DEBIAN_MIRROR:-http://deb.debian.org/debian}
packages="python3,python3-pip,procps,gawk,xz-utils,bzip2,zip,unzip,patch,bc,jq,file"
# pytest-json-ctrf 0.6.1 needs a pytest newer than Debian's 7.2 (TestReport.start), so pytest comes as
# wheels too, at the same pins as requirements.lock.
wheels="pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 packaging==26.4 Pygments==2.21.0 pytest-json-ctrf==0.6.1"
recipe_version=1  # bump when the steps below change in a way the variables above do not show
recipe="suite=$suite variant=minbase packages=$packages wheels=$wheels recipe=$recipe_version"
tag=$(printf '%s' "$recipe" | sha256sum | cut -c1-12)

image_id() { docker image inspect -f '{{.Id}}' "$1" 2>/dev/null || true; }

if [ -n "$(image_id "$name:$tag")" ]; then
  if [ "$(image_id "$name:latest")" != "$(image_id "$name:$tag")" ]; then
    docker tag "$name:$tag" "$name:latest"
    log "tagged $name:$tag as $name:latest"
  fi
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  log "ERROR: building $name:$tag needs root (debootstrap, chroot)"; exit 1
fi
if ! command -v debootstrap >/dev/null 2>&1; then
  log "installing debootstrap from Debian ..."
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

work=$(mktemp -d /var/tmp/rsi-base.XXXXXX)
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"

# The wheels are fetched with the host's pip (and the host's index and certificate settings), then installed
# inside the chroot from the local files.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
host_py=""
for c in "${RSI_PYTHON:-}" "$root/.venv/bin/python" python3; do
  [ -n "$c" ] && "$c" -m pip --version >/dev/null 2>&1 && { host_py=$c; break; }
done
[ -n "$host_py" ] || { log "ERROR: no host python with pip to fetch $wheels"; exit 1; }
log "fetching $wheels ..."
"$host_py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 -d "$work/wheels" $wheels 2>&1 \
  | { grep -v '^WARNING: Location' || true; } >&2
log "building $name:$tag: debootstrap $suite minbase + $packages (about a minute) ..."
if ! debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1; then
  log "ERROR: debootstrap failed; last lines:"; tail -n 20 "$work/debootstrap.log" >&2; exit 1
fi
log "installing wheels into the root filesystem: $wheels ..."
mkdir -p "$rootfs/tmp/wheels" && cp "$work"/wheels/*.whl "$rootfs/tmp/wheels/"
chroot "$rootfs" env -u PIP_FIND_LINKS -u PIP_CERT python3 -m pip install -q --no-cache-dir --no-deps \
  --no-index --break-system-packages --disable-pip-version-check --root-user-action=ignore \
  $(cd "$rootfs" && ls tmp/wheels/*.whl | sed 's|^|/|') >&2
rm -rf "$rootfs/tmp/wheels"
# A real report from a real run: one passing and one failing check.
mkdir -p "$rootfs/tmp/ctrf-check"
printf 'def test_ok():\n  assert True\n\ndef test_bad():\n  assert False\n' >"$rootfs/tmp/ctrf-check/test_x.py"
chroot "$rootfs" python3 -m pytest -q -p no:cacheprovider --ctrf /tmp/ctrf-check/ctrf.json \
  /tmp/ctrf-check/test_x.py >"$work/ctrf-check.log" 2>&1 || true
if ! grep -q '"tests": 2' "$rootfs/tmp/ctrf-check/ctrf.json" 2>/dev/null; then
  log "ERROR: pytest --ctrf did not write a report in the image:"; tail -n 20 "$work/ctrf-check.log" >&2; exit 1
fi
rm -rf "$rootfs/tmp/ctrf-check"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/root/.cache
mkdir -p "$rootfs/app" "$rootfs/logs"
printf '%s\n%s\n' "$tag" "$recipe" >"$rootfs/etc/rsi-base"

log "importing into Docker as $name:$tag ..."
tar --numeric-owner -C "$rootfs" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'WORKDIR /app' \
  --change 'CMD ["/bin/bash"]' \
  - "$name:$tag" >/dev/null
docker tag "$name:$tag" "$name:latest"
log "built $name:$tag ($(docker image inspect -f '{{.Size}}' "$name:$tag" | awk '{printf "%.0f MB", $1/1e6}'))"
