#!/usr/bin/env bash
# Builds localhost/orchard/agent-injector:latest ($ORCHARD_INJECTOR_IMAGE overrides; deploy/Dockerfile.agent-injector),
# an image that copies the agent bundle into a volume. Idempotent: the image is
# labelled with a hash of the bundle content and rebuilt only when it changes.
# Needs setup_system.sh and build_test_images.sh (busybox base image) first.
set -euo pipefail

log() { echo "[build_injector_image] $*"; }

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IMAGE=${ORCHARD_INJECTOR_IMAGE:-localhost/orchard/agent-injector:latest}
LABEL=org.orchard-gym.bundle-sha256
# Build context lives outside the repo so `podman build` does not send the tree.
CTX=${INJECTOR_CONTEXT:-/var/cache/orchard-gym/agent-injector}
# Serialise concurrent callers (parallel CI jobs/test workers on one machine).
mkdir -p "$CTX"
exec 9>/run/lock/orchard-gym-injector.lock
flock 9

"$REPO/scripts/build_agent_bundle.sh" "$CTX/bundle"

# Content hash: every path, its mode and its bytes (mtimes ignored).
hash=$(cd "$CTX/bundle" && {
  find . -printf '%y %m %p -> %l\n' | LC_ALL=C sort
  find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
} | sha256sum | cut -d' ' -f1)

have=$(podman image inspect -f "{{index .Labels \"$LABEL\"}}" "$IMAGE" 2>/dev/null || true)
if [[ $have == "$hash" ]]; then
  log "$IMAGE up to date (bundle $hash)"
else
  log "building $IMAGE (bundle $hash)"
  t0=$SECONDS
  old=$(podman image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)
  # --pull=never: the base image is local-only; never try a registry.
  # --layers=false: no intermediate images left behind (nothing to cache).
  podman build -q --pull=never --layers=false --label "$LABEL=$hash" -t "$IMAGE" \
    -f "$REPO/deploy/Dockerfile.agent-injector" "$CTX" >/dev/null
  # Drop the previous build (now untagged); fails harmlessly if still in use.
  [[ -n $old ]] && podman rmi "$old" >/dev/null 2>&1 || true
  log "built in $((SECONDS - t0)) s"
fi
