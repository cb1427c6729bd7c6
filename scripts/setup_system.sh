#!/usr/bin/env bash
# Idempotent machine set-up for orchard-gym container tests (CI runs this as root).
# Installs the Debian packages the tests need and configures Podman for rootful
# use on a host with cgroup v1/hybrid and without CAP_SYS_RESOURCE.
# Second run is a fast no-op: apt is only touched when a package is missing.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

log() { echo "[setup_system] $*"; }

[[ $(id -u) -eq 0 ]] || { echo "[setup_system] must run as root" >&2; exit 1; }

# podman/runc: container engine. runc is listed explicitly so apt picks it for
#   podman's "crun | runc" dependency (crun fails under cgroup hybrid mode).
# netavark/aardvark-dns/iptables: rootful bridge networking (10.88.0.0/16).
# catatonit: init for `podman run --init`.  uidmap: subuid tooling.
# debootstrap/busybox-static: build the local test images (no registry access).
# python3: Debian's interpreter, the one bundled into the agent bundle.
# xvfb/chromium/xdotool/openbox/xterm/mousepad/pcmanfm/x11-utils/fonts: the GUI domain on the
#   local backend (a display inside each sandbox) and the trajectory viewer's browser test.
# stterm: the desktop tasks' terminal (xterm exits in a sandbox without CAP_SETGID when run as root).
PACKAGES=(
  podman runc conmon netavark aardvark-dns iptables catatonit uidmap
  bubblewrap redis-server debootstrap busybox-static
  git patch curl ca-certificates openssl python3
  xvfb chromium xdotool openbox xterm mousepad pcmanfm x11-utils xauth fonts-dejavu-core stterm
)

missing=()
for p in "${PACKAGES[@]}"; do
  if [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) != "install ok installed" ]]; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  log "installing: ${missing[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  log "all packages present"
fi

# Write a config file we own, only when its content differs (backing up what
# was there), so that a re-run changes nothing.
write_conf() {  # path content
  local path=$1 want=$2
  mkdir -p "$(dirname "$path")"
  if [[ -f $path ]] && [[ "$(cat "$path")" == "$want" ]]; then
    log "$path up to date"
    return
  fi
  if [[ -f $path ]]; then
    cp -a "$path" "$path.orig.$(date +%s)"
    log "replacing $path (backup kept next to it)"
  else
    log "writing $path"
  fi
  printf '%s\n' "$want" >"$path"
}

# Podman engine config:
#  - runtime=runc: crun fails on this cgroup hybrid setup.
#  - cgroup_manager=cgroupfs, events_logger=file: no systemd/journald here.
#  - default_ulimits: podman's defaults are higher than the host's hard limits
#    and raising them needs CAP_SYS_RESOURCE, which CI machines may lack.
#  - network_backend=netavark: pinned so podman never falls back to CNI (the
#    podman package ships a CNI conflist but the CNI plugins are not installed).
write_conf /etc/containers/containers.conf '# Managed by orchard-gym scripts/setup_system.sh; local edits get overwritten.
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"

[network]
network_backend = "netavark"'

# Storage: the default (kernel overlay) driver cannot sit on an overlayfs
# root, which is what CI running inside a container has. Only then, pin
# fuse-overlayfs (needs /dev/fuse) or, failing that, the slow vfs driver.
if [[ $(stat -f -c %T /var/lib) == overlayfs ]]; then
  if [[ -c /dev/fuse ]]; then
    if ! command -v fuse-overlayfs >/dev/null; then
      log "root is overlayfs: installing fuse-overlayfs"
      apt-get update -qq && apt-get install -y -qq --no-install-recommends fuse-overlayfs
    fi
    storage_opts='[storage.options.overlay]
mount_program = "/usr/bin/fuse-overlayfs"'
    driver=overlay
  else
    log "root is overlayfs and /dev/fuse is missing: using the slow vfs storage driver"
    storage_opts='' driver=vfs
  fi
  write_conf /etc/containers/storage.conf "# Managed by orchard-gym scripts/setup_system.sh (root filesystem is overlayfs).
[storage]
driver = \"$driver\"
runroot = \"/run/containers/storage\"
graphroot = \"/var/lib/containers/storage\"
$storage_opts"
fi

# Bridges announce MAC changes (gratuitous ARP). A Linux bridge without an address of its
# own takes the lowest MAC of its ports, so it changes as sandboxes (veths) come and go; a
# sandbox keeps sending to the old gateway MAC and a transfer in flight stalls for up to
# minutes of TCP retransmit backoff (scripts/stress_docker_network.py shows it: a 2 MiB
# upload took 110 s with 0, none of 683 rounds over 0.25 s with 1). Persisted in sysctl.d.
write_conf /etc/sysctl.d/90-orchard-gym.conf '# Managed by orchard-gym scripts/setup_system.sh: see the comment there.
net.ipv4.conf.all.arp_notify = 1'
if [[ $(cat /proc/sys/net/ipv4/conf/all/arp_notify) != 1 ]]; then
  sysctl -q -w net.ipv4.conf.all.arp_notify=1 && log "net.ipv4.conf.all.arp_notify=1"
fi

# Sanity check: podman can talk to its storage with this config.
podman info --format 'podman {{.Version.Version}} storage={{.Store.GraphDriverName}} cgroup={{.Host.CgroupsVersion}} runtime={{.Host.OCIRuntime.Name}}' \
  | sed 's/^/[setup_system] /'
log "done"
