#!/usr/bin/env bash
# Builds localhost/orchard/gui:latest ($ORCHARD_GUI_IMAGE overrides), the image Orchard/GUI-v0
# runs in on the docker/kubernetes backends, from scratch: no registry, no container network.
#   rootfs: build_test_images.sh's debootstrap minbase of bookworm + apt-get install of the GUI stack's Debian packages (Xvfb, Chromium,
#           xdotool, openbox, the desktop tasks' programs, fonts), cached as a tarball in
#           /var/cache/orchard-gym (keyed by the package list) so a rebuild skips debootstrap;
#   + MiniWoB++'s html/ from the venv's `miniwob` package at /opt/orchard/miniwob/html
#     (where envs/gui/env.py looks on non-local backends).
# Idempotent: the image is labelled with a hash of its inputs and rebuilt only when they change.
# Needs setup_system.sh, build_test_images.sh (the minbase tarball) and install.sh's `gui` extra first.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

log() { echo "[build_gui_image] $*"; }

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IMAGE=${ORCHARD_GUI_IMAGE:-localhost/orchard/gui:latest}
LABEL=org.orchard-gym.inputs-sha256
CACHE=/var/cache/orchard-gym
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
# What the GUI daemon (envs/gui/sandbox/) runs, plus python3 for images used without the agent bundle.
PACKAGES=xvfb,chromium,xdotool,openbox,stterm,mousepad,pcmanfm,x11-utils,libxtst6,libxext6,fonts-dejavu-core,python3

mkdir -p "$CACHE"
exec 9>/run/lock/orchard-gym-gui-image.lock
flock 9

HTML=$("$PYTHON" -c 'import importlib.util, pathlib; s = importlib.util.find_spec("miniwob"); print(pathlib.Path(list(s.submodule_search_locations)[0]) / "html")') \
  || { echo "[build_gui_image] the miniwob package is missing: bash scripts/install.sh gui" >&2; exit 1; }
[[ -d $HTML/miniwob ]] || { echo "[build_gui_image] no MiniWoB html at $HTML" >&2; exit 1; }

pkg_hash=$(echo "bookworm-minbase+apt $PACKAGES" | sha256sum | cut -c1-16)
tarball=$CACHE/gui-rootfs-$pkg_hash.tar
inputs=$({ echo "$pkg_hash"; cd "$HTML" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum; } | sha256sum | cut -d' ' -f1)

have=$(podman image inspect -f "{{index .Labels \"$LABEL\"}}" "$IMAGE" 2>/dev/null || true)
if [[ $have == "$inputs" ]]; then
  log "$IMAGE up to date (inputs $inputs)"
  exit 0
fi

WORK=$(mktemp -d /var/tmp/orchard-gui-image.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
t0=$SECONDS
if [[ ! -s $tarball ]]; then
  # From build_test_images.sh's bookworm minbase, then apt-get in a chroot: debootstrap
  # --include=chromium,... fails configuring dconf-service (no dependency order there).
  base_tar=$CACHE/bookworm-minbase.tar
  [[ -s $base_tar ]] || { echo "[build_gui_image] $base_tar missing: run scripts/build_test_images.sh" >&2; exit 1; }
  log "apt-get install ${PACKAGES//,/ } into the bookworm minbase from $MIRROR"
  root=$WORK/rootfs
  mkdir -p "$root"
  tar -C "$root" -xf "$base_tar"
  echo "deb $MIRROR bookworm main" >"$root/etc/apt/sources.list"
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"  # start no services
  chmod +x "$root/usr/sbin/policy-rc.d"
  # A private mount namespace: /proc and /dev vanish with it, nothing to unmount on failure.
  unshare --mount --propagation private --fork sh -c '
    mount -t proc proc "$1/proc" && mount --rbind /dev "$1/dev" &&
    chroot "$1" apt-get update -q && chroot "$1" apt-get install -y -q --no-install-recommends $2 &&
    chroot "$1" apt-get clean' sh "$root" "${PACKAGES//,/ }" >"$WORK/apt.log" 2>&1 \
    || { tail -n 30 "$WORK/apt.log" >&2; exit 1; }
  rm -rf "$root"/var/lib/apt/lists/* "$root/usr/sbin/policy-rc.d"
  : >"$root/etc/resolv.conf"
  # temp name then rename: an interrupted run never leaves a truncated cache behind
  tar --numeric-owner -C "$root" -cf "$tarball.tmp" .
  mv "$tarball.tmp" "$tarball"
  rm -rf "$root"
  log "apt-get + tar took $((SECONDS - t0)) s ($(du -h "$tarball" | cut -f1))"
else
  log "using cached $tarball"
fi

# The rootfs as a base image, then one layer with the MiniWoB pages (COPY only: nothing runs,
# so the build needs no network).
base=localhost/orchard/gui-rootfs:$pkg_hash
podman image exists "$base" || podman import -q --change 'CMD ["/bin/bash"]' "$tarball" "$base" >/dev/null
mkdir -p "$WORK/ctx"
cp -r "$HTML" "$WORK/ctx/html"
printf 'FROM %s\nCOPY html /opt/orchard/miniwob/html\nCMD ["/bin/bash"]\n' "$base" >"$WORK/ctx/Containerfile"
old=$(podman image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)
podman build -q --pull=never --network=none --layers=false --label "$LABEL=$inputs" -t "$IMAGE" "$WORK/ctx" >/dev/null
[[ -n $old ]] && podman rmi "$old" >/dev/null 2>&1 || true
log "built $IMAGE in $((SECONDS - t0)) s ($(podman image inspect -f '{{.Size}}' "$IMAGE" | numfmt --to=iec))"

# Smoke test (a few seconds): the stack's programs are there and Xvfb runs.
out=$(podman run --rm --network=none "$IMAGE" sh -c \
  'for p in Xvfb chromium xdotool openbox stterm mousepad pcmanfm xwininfo; do command -v $p >/dev/null || echo "missing $p"; done
   Xvfb :5 -nolisten tcp >/dev/null 2>&1 & sleep 1; DISPLAY=:5 xwininfo -root >/dev/null && echo xvfb-ok; kill $!
   test -f /opt/orchard/miniwob/html/miniwob/click-button.html && echo html-ok')
[[ $out == $'xvfb-ok\nhtml-ok' ]] || { echo "[build_gui_image] smoke test failed: $out" >&2; exit 1; }
log "smoke test ok (Xvfb runs, programs and MiniWoB pages present)"
