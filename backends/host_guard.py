"""The host guard: iptables rules refusing new connections from blocked docker sandboxes to
this host's own addresses.

An internal network has no route out, but the host is *on* it: its bridge holds the
gateway address (e.g. 10.89.0.1), so a blocked sandbox can open any host service bound to
0.0.0.0 (a database, an orchestrator, the engine's DNS server on port 53). Those packets are
addressed to the host and pass its INPUT chain, so one rule there closes it:

    -A INPUT -j ORCHARD-HOST-GUARD
    -A ORCHARD-HOST-GUARD -s SUBNET -p tcp --dport PORT --syn -j RETURN     (each allowed port)
    -A ORCHARD-HOST-GUARD -s SUBNET -p tcp --syn -m conntrack --ctstate NEW -j REJECT --reject-with tcp-reset
    -A ORCHARD-HOST-GUARD -s SUBNET ! -p tcp -m conntrack --ctstate NEW -j REJECT

Only connections the sandbox *opens* are refused: the host's own connections to the agent
are NEW on OUTPUT and their replies ESTABLISHED on INPUT. REJECT, not DROP, so that a probe
fails at once instead of hanging until its timeout.

Why the backend installs it and not a set-up script: the subnet is the engine's choice,
known only once the network exists (and another one after the network is pruned and made
again), and rules do not survive a reboot; the backend checks them each time it checks the
network. Every step is `-C` (check) before `-I`/`-A`, so it is idempotent and concurrent
backends at worst add nothing twice. Allowed ports accumulate (one host, one chain).
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess

CHAIN = "ORCHARD-HOST-GUARD"


class GuardError(RuntimeError):
    """The rules could not be installed (not root, no iptables, ...)."""


def rules(subnet: str, allow_ports: list[int]) -> list[list[str]]:
    """The chain's rules for one subnet, as iptables arguments after `-A CHAIN`."""
    ipaddress.ip_network(subnet)  # ValueError on garbage: never pass it to iptables
    allowed = [["-s", subnet, "-p", "tcp", "--dport", str(int(p)), "--syn", "-j", "RETURN"] for p in allow_ports]
    return allowed + [
        ["-s", subnet, "-p", "tcp", "--syn", "-m", "conntrack", "--ctstate", "NEW",
         "-j", "REJECT", "--reject-with", "tcp-reset"],
        ["-s", subnet, "!", "-p", "tcp", "-m", "conntrack", "--ctstate", "NEW", "-j", "REJECT"],
    ]


def _iptables(subnet: str) -> str:
    name = "ip6tables" if ipaddress.ip_network(subnet).version == 6 else "iptables"
    exe = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if exe is None:
        raise GuardError(f"{name} is not installed")
    return exe


def _run(exe: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([exe, "-w", "5", *args], capture_output=True, text=True, timeout=30)


def install(subnet: str, allow_ports: list[int] = ()) -> None:
    """Make sure the chain, its jump from INPUT and the subnet's rules exist (idempotent)."""
    exe = _iptables(subnet)
    wanted = rules(subnet, list(allow_ports))
    if _run(exe, "-n", "-L", CHAIN).returncode != 0:
        made = _run(exe, "-N", CHAIN)
        if made.returncode != 0 and "exists" not in made.stderr:  # another process may have made it just now
            raise GuardError(f"cannot create chain {CHAIN}: {made.stderr.strip()}")
    if _run(exe, "-C", "INPUT", "-j", CHAIN).returncode != 0:
        _checked(_run(exe, "-I", "INPUT", "1", "-j", CHAIN))
    allowed, refusing = wanted[:-2], wanted[-2:]
    for rule in allowed:  # before the refusing rules: insert at the top
        if _run(exe, "-C", CHAIN, *rule).returncode != 0:
            _checked(_run(exe, "-I", CHAIN, "1", *rule))
    for rule in refusing:
        if _run(exe, "-C", CHAIN, *rule).returncode != 0:
            _checked(_run(exe, "-A", CHAIN, *rule))


def remove(subnet: str) -> int:
    """Delete the subnet's rules (any allowed ports too); the number deleted. For tests and
    for taking the guard off by hand."""
    exe = _iptables(subnet)
    listed = _run(exe, "-S", CHAIN)
    if listed.returncode != 0:
        return 0
    gone = 0
    for line in listed.stdout.splitlines():
        parts = line.split()
        if parts[:2] == ["-A", CHAIN] and "-s" in parts and _same_net(parts[parts.index("-s") + 1], subnet):
            if _run(exe, "-D", *parts[1:]).returncode == 0:
                gone += 1
    return gone


def installed(subnet: str) -> bool:
    try:
        exe = _iptables(subnet)
    except GuardError:
        return False
    return all(_run(exe, "-C", CHAIN, *rule).returncode == 0 for rule in rules(subnet, [])[-2:]) \
        and _run(exe, "-C", "INPUT", "-j", CHAIN).returncode == 0


def _same_net(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_network(a, strict=False) == ipaddress.ip_network(b, strict=False)
    except ValueError:
        return False


def _checked(done: subprocess.CompletedProcess) -> None:
    if done.returncode != 0:
        raise GuardError(f"{' '.join(done.args)}: {done.stderr.strip() or done.returncode}")
