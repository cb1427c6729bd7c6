#!/usr/bin/env bash
# start|stop|status of a rootful Podman API service (Docker-compatible API) on
# unix:///run/podman/podman.sock, for clients that speak the Docker API.
# There is no systemd on CI machines, so we run it ourselves in the background.
# Log lines go to stderr; `start`/`status` print DOCKER_HOST=... on stdout, so
#   export "$(scripts/podman_service.sh start)"
# sets DOCKER_HOST for Docker-API clients (docker-py, testcontainers...).
set -euo pipefail

SOCK=/run/podman/podman.sock
RUNDIR=/run/orchard-gym
PIDFILE=$RUNDIR/podman-service.pid
LOGFILE=$RUNDIR/podman-service.log
DOCKER_HOST_VALUE=unix://$SOCK

log() { echo "[podman_service] $*" >&2; }

ping_ok() { curl -fsS --max-time 2 --unix-socket "$SOCK" http://d/_ping >/dev/null 2>&1; }

running_pid() {
  local pid
  [[ -f $PIDFILE ]] && pid=$(<"$PIDFILE") && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

start() {
  if pid=$(running_pid) && ping_ok; then
    log "already running (pid $pid)"
  else
    [[ -n ${pid:-} ]] && stop   # process alive but not answering: restart it
    mkdir -p "$RUNDIR" "$(dirname "$SOCK")"
    rm -f "$SOCK"               # a stale socket from a dead service blocks bind()
    # --time=0: never exit on idle. setsid + nohup: detach from the CI step's
    # process group/stdin so the service outlives this script.
    # from / : conmon drops an `oom` marker file in the service's working directory when a
    # container is OOM-killed, which would otherwise litter the checkout
    env -C / setsid nohup podman system service --time=0 "unix://$SOCK" </dev/null >>"$LOGFILE" 2>&1 &
    echo $! >"$PIDFILE"
    for _ in $(seq 100); do      # up to ~10 s
      ping_ok && break
      kill -0 "$(<"$PIDFILE")" 2>/dev/null || { tail -n 20 "$LOGFILE" >&2; log "service died"; exit 1; }
      sleep 0.1
    done
    ping_ok || { tail -n 20 "$LOGFILE" >&2; log "socket did not answer"; exit 1; }
    log "started (pid $(<"$PIDFILE")), log: $LOGFILE"
  fi
  echo "DOCKER_HOST=$DOCKER_HOST_VALUE"
}

stop() {
  local pid
  if pid=$(running_pid); then
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    log "stopped (pid $pid)"
  else
    log "not running"
  fi
  rm -f "$PIDFILE"
}

status() {
  if pid=$(running_pid) && ping_ok; then
    log "running (pid $pid), answering on $SOCK"
    echo "DOCKER_HOST=$DOCKER_HOST_VALUE"
  else
    log "not running"
    return 3
  fi
}

case ${1:-} in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
