"""Stress the network path to a blocked docker sandbox while other containers come and go
on its bridge, and report transfers that stall.

Why: a Linux bridge without an address of its own takes the lowest MAC of its ports, so
its MAC changes as veths join and leave. A sandbox keeps sending to the old gateway MAC
until its neighbour entry is re-resolved; with net.ipv4.conf.all.arp_notify=0 nobody tells
it, and a reply in flight waits out TCP retransmit backoff (seen: RTO 52 s). This script
shows it, and shows the setting's effect:

    python scripts/stress_docker_network.py --duration 60                 # the host's setting
    python scripts/stress_docker_network.py --duration 60 --arp-notify 0  # set for the run, restored after
    python scripts/stress_docker_network.py --duration 60 --arp-notify 1

One blocked sandbox on the backend's internal network moves `--size-mb` each way per round
(a download: the sandbox sends; an upload: the host sends), while `--churn` threads start
and remove plain containers on the same network. A round slower than `--stall-seconds` is
a stall. Each round also compares the gateway MAC in the sandbox's ARP table with the
bridge's MAC. Everything it makes is removed at the end (label orchard-stress=PID).
Only the engine's internal network and loopback are used. Exit code 1 when a stall was seen.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchard_gym import SandboxClient

ARP_NOTIFY = Path("/proc/sys/net/ipv4/conf/all/arp_notify")
BUSYBOX = "localhost/orchard/busybox:latest"


def bridge_of(gateway: str) -> str | None:
    """The host interface holding the network's gateway address."""
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[3].split("/")[0] == gateway:
            return parts[1]
    return None


def mac_of(iface: str | None) -> str | None:
    try:
        return Path(f"/sys/class/net/{iface}/address").read_text().strip() if iface else None
    except OSError:
        return None


def gateway_mac_seen(box, gateway: str) -> str | None:
    """The MAC the sandbox's ARP table holds for the gateway (None: no entry)."""
    for line in box.exec("cat /proc/net/arp", timeout=30).stdout.splitlines()[1:]:
        parts = line.split()
        if parts and parts[0] == gateway and parts[3] != "00:00:00:00:00:00":
            return parts[3]
    return None


def tcp_counters(box) -> dict[str, int]:
    """The sandbox's own TCP counters (its network namespace's): RTOs that fired, segments
    retransmitted, duplicates of the host's data it got again (the host retransmitted)."""
    text = box.exec("cat /proc/net/netstat /proc/net/snmp", timeout=30).stdout.splitlines()
    values = {}
    for names, nums in zip(text, text[1:]):
        if names.split(":")[0] == nums.split(":")[0] and not names.split()[1].lstrip("-").isdigit():
            values.update(zip(names.split()[1:], map(int, nums.split()[1:])))
    return {k: values.get(k, 0) for k in ("TCPTimeouts", "RetransSegs", "TCPDSACKOldSent")}


class Churn:
    """Threads that start and remove busybox containers on `network`, as sandboxes do."""

    def __init__(self, api, network: str, image: str, threads: int, label: str):
        self.api, self.network, self.image, self.label = api, network, image, label
        self.stop = threading.Event()
        self.cycles = 0
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(threads)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _loop(self, i: int) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            name = f"orchard-stress-{os.getpid()}-{i}-{n}"
            try:
                host_config = self.api.create_host_config(network_mode=self.network)
                ctr = self.api.create_container(self.image, command=["sleep", "600"], name=name,
                                                labels={"orchard-stress": self.label}, host_config=host_config)
                self.api.start(ctr)
                self.stop.wait(0.5)
                self.api.remove_container(ctr, force=True)
                self.cycles += 1
            except Exception as e:  # keep churning; report at the end
                self.errors.append(f"{name}: {e}")
                self.stop.wait(1)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)
        for c in self.api.containers(all=True, filters={"label": f"orchard-stress={self.label}"}):
            try:
                self.api.remove_container(c["Id"], force=True)
            except Exception:
                pass


def run(args) -> dict:
    payload = os.urandom(args.size_mb * 2**20)
    with SandboxClient({"type": "docker", "pull": "never"}) as client:
        backend = client.backend
        box = client.create_sandbox(image=args.image)
        churn = None
        try:
            gateway = box.record.details["host_address"]
            bridge = bridge_of(gateway)
            box.upload_content(payload, "blob")
            counters0 = tcp_counters(box)
            churn = Churn(backend.api, backend.config.network, args.image, args.churn, str(os.getpid()))
            churn.start()
            rounds, stalls, stale_macs = [], [], 0
            deadline = time.monotonic() + args.duration
            while time.monotonic() < deadline and len(rounds) < args.max_rounds:
                t0 = time.monotonic()
                got = box.download_content("blob")  # the sandbox sends: the direction that stalled
                t1 = time.monotonic()
                box.upload_content(payload, "up")  # the host sends
                t2 = time.monotonic()
                if got != payload:
                    raise SystemExit("download returned other bytes than were uploaded")
                seen, real = gateway_mac_seen(box, gateway), mac_of(bridge)
                stale_macs += seen is not None and real is not None and seen != real
                rounds.append((t1 - t0, t2 - t1))
                if max(t1 - t0, t2 - t1) > args.stall_seconds:
                    stalls.append({"round": len(rounds), "down_s": round(t1 - t0, 2), "up_s": round(t2 - t1, 2)})
            counters = {k: v - counters0[k] for k, v in tcp_counters(box).items()}
        finally:
            if churn is not None:
                churn.close()
            box.delete()
    downs, ups = [r[0] for r in rounds], [r[1] for r in rounds]
    return {"arp_notify": ARP_NOTIFY.read_text().strip(), "rounds": len(rounds), "churn_cycles": churn.cycles,
            "churn_errors": churn.errors[:3], "size_mb": args.size_mb,
            "down_s": {"p50": round(statistics.median(downs), 3), "max": round(max(downs), 2)} if downs else None,
            "up_s": {"p50": round(statistics.median(ups), 3), "max": round(max(ups), 2)} if ups else None,
            "stalls": stalls, "stale_gateway_mac_rounds": stale_macs, "sandbox_tcp": counters, "bridge": bridge}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=60, help="seconds of rounds (a stalled round may overrun)")
    p.add_argument("--max-rounds", type=int, default=10_000)
    p.add_argument("--size-mb", type=int, default=2, help="MiB each way per round")
    p.add_argument("--churn", type=int, default=2, help="threads starting/removing containers on the bridge")
    p.add_argument("--stall-seconds", type=float, default=3.0, help="a round direction slower than this stalls")
    p.add_argument("--image", default=BUSYBOX)
    p.add_argument("--arp-notify", choices=["0", "1"], default=None,
                   help="set net.ipv4.conf.all.arp_notify for the run (root), restored afterwards")
    args = p.parse_args()
    if args.duration <= 0 or args.size_mb <= 0 or args.churn < 0 or args.stall_seconds <= 0:
        p.error("--duration, --size-mb and --stall-seconds must be positive, --churn >= 0")
    before = ARP_NOTIFY.read_text().strip()
    if args.arp_notify is not None:
        ARP_NOTIFY.write_text(args.arp_notify)
    try:
        report = run(args)
    finally:
        if args.arp_notify is not None:
            ARP_NOTIFY.write_text(before)
    print(json.dumps(report, indent=1))
    return 1 if report["stalls"] else 0


if __name__ == "__main__":
    sys.exit(main())
