#!/usr/bin/env bash
# Builds the local test images (no registry involved), only if missing:
#   localhost/orchard/bookworm:latest  - debootstrap minbase of Debian bookworm
#   localhost/orchard/busybox:latest   - busybox-static only: no python, no glibc
# The bookworm rootfs tarball is cached in /var/cache/orchard-gym so that a
# rebuild (e.g. after `podman system reset`) skips the ~35 s debootstrap.
# Needs scripts/setup_system.sh to have run first.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

log() { echo "[build_test_images] $*"; }

CACHE=/var/cache/orchard-gym
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
BOOKWORM=localhost/orchard/bookworm:latest
BUSYBOX=localhost/orchard/busybox:latest
mkdir -p "$CACHE"
# Serialise concurrent callers (parallel CI jobs/test workers on one machine).
exec 9>/run/lock/orchard-gym-images.lock
flock 9

WORK=$(mktemp -d /var/tmp/orchard-images.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

build_bookworm() {
  local tarball=$CACHE/bookworm-minbase.tar
  if [[ ! -s $tarball ]]; then
    log "debootstrap bookworm (minbase) from $MIRROR"
    local t0=$SECONDS
    debootstrap --variant=minbase bookworm "$WORK/bookworm" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 \
      || { tail -n 30 "$WORK/debootstrap.log" >&2; return 1; }
    # Drop the downloaded .debs and apt lists: they are half the size and useless.
    rm -rf "$WORK/bookworm"/var/cache/apt/archives/*.deb "$WORK/bookworm"/var/lib/apt/lists/*
    # Write to a temp name then rename, so an interrupted run never leaves a
    # truncated cache behind.
    tar --numeric-owner -C "$WORK/bookworm" -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    log "debootstrap + tar took $((SECONDS - t0)) s ($(du -h "$tarball" | cut -f1))"
  else
    log "using cached $tarball"
  fi
  podman import -q --change 'CMD ["/bin/bash"]' "$tarball" "$BOOKWORM" >/dev/null
}

build_busybox() {
  local root=$WORK/busybox
  mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,root,proc,sys,dev}
  install -d -m 1777 "$root/tmp"
  install -m 0755 /bin/busybox "$root/bin/busybox"
  # One symlink per applet at the path busybox itself reports (bin/sh, usr/bin/awk...).
  local applet
  for applet in $(/bin/busybox --list-full); do
    [[ -e $root/$applet ]] || ln -s /bin/busybox "$root/$applet"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
  tar --numeric-owner -C "$root" -c . | podman import -q --change 'CMD ["/bin/sh"]' - "$BUSYBOX" >/dev/null
}

for img in "$BOOKWORM" "$BUSYBOX"; do
  if podman image exists "$img"; then
    log "$img exists"
  else
    log "building $img"
    t0=$SECONDS
    case $img in
      "$BOOKWORM") build_bookworm ;;
      "$BUSYBOX") build_busybox ;;
    esac
    log "built $img in $((SECONDS - t0)) s"
  fi
done

# Cheap smoke tests (about a second): the images really run under this podman.
log "bookworm: debian_version $(podman run --rm "$BOOKWORM" cat /etc/debian_version)"
out=$(podman run --rm "$BUSYBOX" sh -c 'echo ok; ls /lib* /usr/lib* 2>/dev/null | wc -l; command -v python3 python || true')
[[ $out == $'ok\n0' ]] || { echo "[build_test_images] busybox image check failed: $out" >&2; exit 1; }
log "busybox: ok (no libs, no python)"
log "done"
