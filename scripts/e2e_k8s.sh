#!/usr/bin/env bash
# The conformance suite (tests/test_conformance.py) against a real Kubernetes cluster:
# kind, k3s or any cluster your kubeconfig names. The tests' own runs use a fake API
# server (tests/fake_k8s); this is for users who have a cluster.
#
#   bash scripts/e2e_k8s.sh [pytest args...]
#
# Environment (all optional):
#   KUBECONFIG      kubeconfig (default ~/.kube/config); its current context is used, or CONTEXT
#   NAMESPACE       namespace for the test sandboxes, created and removed (default orchard-e2e)
#   IMAGE           task image of the suite (default localhost/orchard/busybox:latest: no Python, no libc)
#   INJECTOR        agent injector image (default localhost/orchard/agent-injector:latest)
#   PULL            image pull policy of both (default IfNotPresent; local images loaded below need it)
#   LOAD_IMAGES     1 (default): load IMAGE and INJECTOR from local Podman/Docker into kind or k3s
#   HOST_ADDRESS    the address at which pods reach this machine (default: this host's source address)
#   KEEP_NAMESPACE  1: leave the namespace (and anything a failed test left) for inspection
#
# What the cluster must offer: pod IPs reachable from this machine (k3s on this host: yes;
# kind: this script adds a route to the pod CIDR through the node container), a CNI that
# enforces NetworkPolicy for the network test (k3s, Calico, Cilium; kindnet since kind
# v0.24), and memory limits (cgroups). The "no process left" test looks for the sandbox's
# processes in this host's /proc, so run on a node (kind and k3s on this host are).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "[e2e_k8s] $*" >&2; }
die() { log "$*"; exit 1; }

KUBECONFIG=${KUBECONFIG:-$HOME/.kube/config}
export KUBECONFIG
NAMESPACE=${NAMESPACE:-orchard-e2e}
IMAGE=${IMAGE:-localhost/orchard/busybox:latest}
INJECTOR=${INJECTOR:-localhost/orchard/agent-injector:latest}
PULL=${PULL:-IfNotPresent}
LOAD_IMAGES=${LOAD_IMAGES:-1}

command -v kubectl >/dev/null || die "kubectl is needed"
[[ -f $KUBECONFIG ]] || die "no kubeconfig at $KUBECONFIG"
ctx_args=()
[[ -n ${CONTEXT:-} ]] && ctx_args=(--context "$CONTEXT")
context=${CONTEXT:-$(kubectl config current-context)}
kubectl "${ctx_args[@]}" version >/dev/null || die "cannot reach the cluster of context $context"
log "cluster: context $context"

.venv/bin/python -c 'import kubernetes' 2>/dev/null || bash scripts/install.sh dev,k8s

engine=$(command -v podman || command -v docker || true)
save_image() {  # image -> tar on stdout
  [[ -n $engine ]] || die "no podman/docker to export $1 from"
  "$engine" save "$1"
}

if [[ $context == kind-* ]]; then
  cluster=${context#kind-}
  if [[ $LOAD_IMAGES == 1 ]]; then
    command -v kind >/dev/null || die "kind is needed to load images into cluster $cluster"
    for image in "$IMAGE" "$INJECTOR"; do
      log "loading $image into kind cluster $cluster"
      tar=$(mktemp --suffix .tar)
      save_image "$image" >"$tar"
      kind load image-archive "$tar" --name "$cluster"
      rm -f "$tar"
    done
  fi
  # pod IPs live behind the node container: route each node's pod CIDR through it
  for node in $(kubectl "${ctx_args[@]}" get nodes -o name); do
    cidr=$(kubectl "${ctx_args[@]}" get "$node" -o jsonpath='{.spec.podCIDR}')
    ip=$(kubectl "${ctx_args[@]}" get "$node" -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}')
    if [[ -n $cidr && -n $ip ]]; then
      log "route $cidr via $ip (${node#node/})"
      ip route replace "$cidr" via "$ip" 2>/dev/null || log "could not add the route (needs root); pod IPs may be unreachable"
    fi
  done
elif command -v k3s >/dev/null && [[ $LOAD_IMAGES == 1 ]]; then
  for image in "$IMAGE" "$INJECTOR"; do
    log "importing $image into k3s' containerd"
    save_image "$image" | k3s ctr images import - >/dev/null
  done
fi

HOST_ADDRESS=${HOST_ADDRESS:-$(ip -4 route get 1.1.1.1 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "src") print $(i + 1)}')}
[[ -n $HOST_ADDRESS ]] || die "set HOST_ADDRESS: the address at which pods reach this machine"

kubectl "${ctx_args[@]}" create namespace "$NAMESPACE" --dry-run=client -o yaml | kubectl "${ctx_args[@]}" apply -f - >/dev/null
cleanup() {
  if [[ ${KEEP_NAMESPACE:-0} != 1 ]]; then
    log "deleting namespace $NAMESPACE"
    kubectl "${ctx_args[@]}" delete namespace "$NAMESPACE" --wait=false >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT

config=$(NAMESPACE=$NAMESPACE INJECTOR=$INJECTOR PULL=$PULL CONTEXT=${CONTEXT:-} .venv/bin/python -c '
import json, os
c = {"kubeconfig": os.environ["KUBECONFIG"], "namespace": os.environ["NAMESPACE"],
     "injector_image": os.environ["INJECTOR"], "image_pull_policy": os.environ["PULL"],
     "injector_pull_policy": os.environ["PULL"]}
if os.environ.get("CONTEXT"):
    c["context"] = os.environ["CONTEXT"]
print(json.dumps(c))')
export ORCHARD_K8S_E2E=$config ORCHARD_K8S_E2E_IMAGE=$IMAGE ORCHARD_K8S_E2E_HOST_ADDRESS=$HOST_ADDRESS
log "conformance suite: image $IMAGE, namespace $NAMESPACE, pods reach this host at $HOST_ADDRESS"
.venv/bin/python -m pytest tests/test_conformance.py -k kubernetes-real -p no:cacheprovider -v "$@"
