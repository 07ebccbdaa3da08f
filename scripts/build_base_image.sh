#!/usr/bin/env bash
# Build the local base images without any registry: debootstrap a minbase root filesystem of a Debian or
# Ubuntu suite with python3 (+ the small tools terminal tasks use), install pinned pytest + pytest-json-ctrf
# wheels (fetched by the host's pip) into it, and `docker import` it.
#
#   bash scripts/build_base_image.sh [SPEC ...]     SPEC = SUITE or SUITE-build, or `all`; default: bookworm
#
# Suites: bookworm, trixie (Debian 12, 13), jammy, noble (Ubuntu 22.04, 24.04). A `-build` image adds what
# `buildpack-deps` has (compilers, headers, git, ...). Names (rsi_jax.env.dockerfiles.family_image):
#   bookworm -> rsi-base, SUITE -> rsi-base-SUITE, SUITE-build -> rsi-base-SUITE-build
# Upstream base images are mapped onto these (rsi_jax.env.dockerfiles.DEFAULT_IMAGE_MAP: ubuntu:24.04 -> noble,
# python:3.13 -> trixie, buildpack-deps:jammy -> jammy-build, ...); a run warns and names the command for any
# mapped image that is not built yet.
# Each image is cached by a content tag: NAME:<hash of its recipe>; an unchanged recipe is skipped (quietly),
# a changed one rebuilds. NAME:latest always points at the current recipe's image.
# Needs a Docker daemon (scripts/docker_up.sh) and, to build, root (debootstrap, chroot).
# Env: RSI_BASE_IMAGE (default rsi-base), RSI_DEBIAN_MIRROR (default http://deb.debian.org/debian),
#      RSI_UBUNTU_MIRROR (default http://archive.ubuntu.com/ubuntu).
set -euo pipefail
log() { echo "[docker] $*" >&2; }

base=${RSI_BASE_IMAGE:-rsi-base}
debian_mirror=${RSI_DEBIAN_MIRROR:-http://deb.debian.org/debian}
ubuntu_mirror=${RSI_UBUNTU_MIRROR:-http://archive.ubuntu.com/ubuntu}
all_specs="bookworm trixie jammy noble bookworm-build trixie-build jammy-build noble-build"
# What every image has: python3 (and `python`, as python:* images have), pip and venv, and small tools.
packages="python3,python3-pip,python3-venv,python-is-python3,procps,gawk,xz-utils,bzip2,zip,unzip,patch,bc,jq,file,curl,ca-certificates,tmux"
# The buildpack-deps equivalent (curl + scm + the build tools and common -dev headers).
build_packages="build-essential,git,wget,gnupg,openssh-client,autoconf,automake,libtool,pkg-config,make,dpkg-dev,libssl-dev,libffi-dev,zlib1g-dev,libbz2-dev,libreadline-dev,libsqlite3-dev,liblzma-dev,libxml2-dev,libxslt1-dev,libyaml-dev,libcurl4-openssl-dev,libncurses-dev,libgdbm-dev,libdb-dev,libjpeg-dev,libpng-dev,libpq-dev,default-libmysqlclient-dev,libmagic-dev"
# pytest-json-ctrf 0.6.1 needs a pytest newer than the distributions' (TestReport.start), so pytest comes as
# wheels too, at the same pins as requirements.lock.
wheels="pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 packaging==26.4 Pygments==2.21.0 pytest-json-ctrf==0.6.1"
recipe_version=3  # bump when the steps below change in a way the variables above do not show

image_id() { docker image inspect -f '{{.Id}}' "$1" 2>/dev/null || true; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

build_one() {  # $1 = suite, $2 = minbase | build
  local suite=$1 variant=$2 name distro mirror components pyver script="" keyring="" extra="" pkgs=$packages
  case "$suite" in
    bookworm) distro=debian; pyver=3.11 ;;
    trixie) distro=debian; pyver=3.13 ;;
    jammy) distro=ubuntu; pyver=3.10; extra="exceptiongroup==1.3.0 tomli==2.2.1 typing_extensions==4.15.0" ;;  # pytest on 3.10
    noble) distro=ubuntu; pyver=3.12 ;;
    *) log "ERROR: unknown suite '$suite' (bookworm, trixie, jammy, noble)"; return 2 ;;
  esac
  name=$base
  [ "$suite" = bookworm ] || name="$name-$suite"
  [ "$variant" = minbase ] || { name="$name-build"; pkgs="$pkgs,$build_packages"; }
  if [ "$distro" = debian ]; then mirror=$debian_mirror; components=main; else mirror=$ubuntu_mirror; components=main,universe; fi
  local wheels="$wheels${extra:+ $extra}"
  local recipe="suite=$suite variant=$variant packages=$pkgs wheels=$wheels recipe=$recipe_version"
  local tag
  tag=$(printf '%s' "$recipe" | sha256sum | cut -c1-12)
  if [ -n "$(image_id "$name:$tag")" ]; then
    if [ "$(image_id "$name:latest")" != "$(image_id "$name:$tag")" ]; then
      docker tag "$name:$tag" "$name:latest"
      log "tagged $name:$tag as $name:latest"
    fi
    return 0
  fi
  if [ "$(id -u)" != 0 ]; then
    log "ERROR: building $name:$tag needs root (debootstrap, chroot)"; return 1
  fi
  if ! command -v debootstrap >/dev/null 2>&1; then
    log "installing debootstrap from the host's distribution ..."
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  fi
  local work rootfs host_py=""
  work=$(mktemp -d /var/tmp/rsi-base.XXXXXX)
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" RETURN
  rootfs="$work/rootfs"
  if [ "$distro" = ubuntu ]; then
    keyring=$work/ubuntu-archive-keyring.gpg
    if [ -f /usr/share/keyrings/ubuntu-archive-keyring.gpg ]; then
      cp /usr/share/keyrings/ubuntu-archive-keyring.gpg "$keyring"
    else  # no Debian release carries it: taken from the archive's own ubuntu-keyring package
      local arch deb
      arch=$(dpkg --print-architecture)
      deb=$(curl -fsSL "$mirror/dists/$suite/main/binary-$arch/Packages.gz" | gzip -dc \
        | awk '/^Package: ubuntu-keyring$/{f=1} f && /^Filename:/ && !d {print $2; d=1}' || true)
      [ -n "$deb" ] || { log "ERROR: no ubuntu-keyring package in $mirror ($suite)"; return 1; }
      curl -fsSL "$mirror/$deb" -o "$work/keyring.deb" && dpkg-deb -x "$work/keyring.deb" "$work/keyring"
      cp "$work/keyring/usr/share/keyrings/ubuntu-archive-keyring.gpg" "$keyring"
    fi
    # an older debootstrap has no script for a newer Ubuntu suite; they all use the same one
    [ -e "/usr/share/debootstrap/scripts/$suite" ] || script=/usr/share/debootstrap/scripts/gutsy
  fi
  # The wheels are fetched with the host's pip (and the host's index and certificate settings), then installed
  # inside the chroot from the local files.
  for c in "${RSI_PYTHON:-}" "$root/.venv/bin/python" python3; do
    [ -n "$c" ] && "$c" -m pip --version >/dev/null 2>&1 && { host_py=$c; break; }
  done
  [ -n "$host_py" ] || { log "ERROR: no host python with pip to fetch $wheels"; return 1; }
  log "fetching $wheels ..."
  "$host_py" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" -d "$work/wheels" $wheels 2>&1 \
    | { grep -v '^WARNING: Location' || true; } >&2
  log "building $name:$tag: debootstrap $suite minbase + $([ "$variant" = build ] && echo "build tools + ")python3 and tools (a few minutes) ..."
  if ! debootstrap --variant=minbase --components="$components" ${keyring:+--keyring="$keyring"} --include="$pkgs" \
      "$suite" "$rootfs" "$mirror" $script >"$work/debootstrap.log" 2>&1; then
    log "ERROR: debootstrap $suite failed; last lines:"; tail -n 20 "$work/debootstrap.log" >&2; return 1
  fi
  # The package sources a task's own `apt-get update` uses: the release, its updates and security fixes.
  if [ "$distro" = ubuntu ]; then
    printf 'deb %s %s main universe\ndeb %s %s-updates main universe\ndeb %s %s-security main universe\n' \
      "$mirror" "$suite" "$mirror" "$suite" "$mirror" "$suite" >"$rootfs/etc/apt/sources.list"
  else
    printf 'deb %s %s main\ndeb %s %s-updates main\ndeb http://deb.debian.org/debian-security %s-security main\n' \
      "$mirror" "$suite" "$mirror" "$suite" "$suite" >"$rootfs/etc/apt/sources.list"
  fi
  rm -f "$rootfs/etc/apt/sources.list.d/"*.sources 2>/dev/null || true
  log "installing wheels into the root filesystem: $wheels ..."
  mkdir -p "$rootfs/tmp/wheels" && cp "$work"/wheels/*.whl "$rootfs/tmp/wheels/"
  # PIP_BREAK_SYSTEM_PACKAGES, PIP_ROOT_USER_ACTION: settings newer pips need, which older ones ignore
  chroot "$rootfs" env -u PIP_FIND_LINKS -u PIP_CERT PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q \
    --no-cache-dir --no-deps --no-index --ignore-installed --disable-pip-version-check \
    $(cd "$rootfs" && ls tmp/wheels/*.whl | sed 's|^|/|') >&2
  rm -rf "$rootfs/tmp/wheels"
  # A real report from a real run: one passing and one failing check.
  mkdir -p "$rootfs/tmp/ctrf-check"
  printf 'def test_ok():\n  assert True\n\ndef test_bad():\n  assert False\n' >"$rootfs/tmp/ctrf-check/test_x.py"
  chroot "$rootfs" python3 -m pytest -q -p no:cacheprovider --ctrf /tmp/ctrf-check/ctrf.json \
    /tmp/ctrf-check/test_x.py >"$work/ctrf-check.log" 2>&1 || true
  if ! grep -q '"tests": 2' "$rootfs/tmp/ctrf-check/ctrf.json" 2>/dev/null; then
    log "ERROR: pytest --ctrf did not write a report in the image:"; tail -n 20 "$work/ctrf-check.log" >&2; return 1
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
}

specs=("$@")
[ ${#specs[@]} -gt 0 ] || specs=(bookworm)
[ "${specs[*]}" != all ] || read -ra specs <<<"$all_specs"
for spec in "${specs[@]}"; do
  case "$spec" in
    *-build) build_one "${spec%-build}" build ;;
    *) build_one "$spec" minbase ;;
  esac
done
