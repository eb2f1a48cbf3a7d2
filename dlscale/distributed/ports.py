"""Free TCP ports for a master, a daemon or an engine to listen on, chosen where no outgoing connection lands.

A port found free by binding to port 0 comes from the kernel's *ephemeral* range, the range it also draws the
source port of every outgoing connection from. Between the choice and the listen (seconds, when a stage starts
on engines) any connection on the machine — a test beside it, gloo, ZeroMQ — may take that port as its source,
and the listen fails with EADDRINUSE (seen once in CI, docs/benchmarks.md). Ports below the ephemeral range are
never handed out that way, so we choose there, at random, and keep only ports a bind accepts now.

Another process of ours may choose the same port before the first listens on it (the engines choose a call's
ports a minute before its last group listens). :func:`hold_ports` closes that gap: the process that chose keeps
each port bound, never listening, with ``SO_REUSEADDR``, until :func:`release_ports`. A bind without that option
(every other process's choice here) is refused meanwhile, while a listener that sets it (torch's and gloo's
stores, this kit's) binds beside the held socket as Linux allows.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: The kernel's range for source ports of outgoing connections (Linux; elsewhere the usual IANA one)
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: The lowest port we choose (below: services' well-known and registered ports are denser)
LOWEST_PORT = 10_000
#: Fewer candidates than this outside the ephemeral range, and we let the kernel choose (bind to port 0)
FEWEST_CANDIDATES = 1_000
#: Candidates tried per port asked for before letting the kernel choose the rest
TRIES_PER_PORT = 50
#: The sockets by which this process holds ports it chose (:func:`hold_ports`), by port
_held: dict[int, socket.socket] = {}


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range, inclusive (IANA's 49152–65535 where it cannot be read)."""
    try:
        low, high = (int(part) for part in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return 49152, 65535
    return low, high


def candidate_ports() -> range:
    """Ports outside the ephemeral range to choose from: below it, or above it when below is too narrow; an
    empty range when neither side has :data:`FEWEST_CANDIDATES`."""
    low, high = ephemeral_range()
    below, above = range(LOWEST_PORT, low), range(high + 1, 65536)
    wider = max(below, above, key=len)
    return wider if len(wider) >= FEWEST_CANDIDATES else range(0)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` now, outside the ephemeral range (see the module's docstring)."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` different TCP ports free on ``host`` now, outside the ephemeral range where the machine leaves
    room (else the kernel's choice); held together while chosen, so none twice."""
    return _choose(count, host, hold=False)


def hold_ports(count: int, host: str = "") -> list[int]:
    """As :func:`free_ports`, and this process keeps holding them (see the module's docstring) until
    :func:`release_ports`: no other process's choice here takes them before their listener binds."""
    return _choose(count, host, hold=True)


def release_ports() -> None:
    """Let go of every port this process holds (:func:`hold_ports`); their listeners, if up, keep them."""
    while _held:
        _held.popitem()[1].close()


def _choose(count: int, host: str, hold: bool) -> list[int]:
    candidates = candidate_ports()
    # (the system's randomness, not the random module's: a run that seeds that would make every process beside it
    # that seeded alike try the same ports in the same order)
    tries = iter(random.SystemRandom().sample(candidates, min(len(candidates), TRIES_PER_PORT * count)))
    chosen: dict[int, socket.socket] = {}  # (each bound until all are chosen: none twice)
    try:
        while len(chosen) < count:
            port, sock = next(tries, 0), socket.socket()  # (port 0: the kernel chooses, when no candidate is left)
            try:
                sock.bind((host, port))
            except OSError:
                sock.close()
                if port == 0:
                    raise
                continue
            chosen[sock.getsockname()[1]] = sock
    except BaseException:
        for sock in chosen.values():
            sock.close()
        raise
    for port, sock in chosen.items():
        if hold:  # (the option set after the bind, which had to be refused if anyone held the port: a listener's
            # bind checks it on this socket when it comes)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            _held[port] = sock
        else:
            sock.close()
    return list(chosen)
