"""Port ranges for tests that launch the multihost launcher on 127.0.0.1.

The multihost launcher binds the ports its plan fixes (`base_port` onwards, the same on every
host), so these tests cannot bind port 0. A range is taken where nothing else can land:

- outside the kernel's ephemeral range, which port-0 binds and outgoing connections (every gRPC
  client's) draw from: a port checked free there may be taken by any socket a moment later;
- under a lock file held until this process exits, so test processes running at once (pytest
  workers, other checkouts on the machine) never get the same range;
- and checked free, against anything else that binds fixed ports.
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
from typing import IO

SLOT = 32
"""Ranges start on multiples of SLOT, so two ranges never overlap in part."""
FIRST_PORT = 10_000
"""Below it lie the ports of services a machine may run (databases, web servers)."""

_held: list[IO] = []  # the lock files of this process's ranges, open until it exits


def ephemeral_range() -> tuple[int, int]:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as source:
        low, high = (int(port) for port in source.read().split())
    return low, high


def reserve_base_port(span: int = 20) -> int:
    """The first of `span` consecutive ports on 127.0.0.1, free and this process's alone."""
    if span > SLOT:
        raise ValueError(f"a range holds at most {SLOT} ports, asked for {span}")
    low, high = ephemeral_range()
    slots = [base for base in range(FIRST_PORT, 65536 - SLOT, SLOT) if base + SLOT <= low or base > high]
    if not slots:
        raise RuntimeError(f"no ports outside the ephemeral range {low}-{high} above {FIRST_PORT}")
    locks = os.path.join(tempfile.gettempdir(), "jaxdist-test-ports")
    os.makedirs(locks, exist_ok=True)
    for base in random.sample(slots, len(slots)):
        lock = open(os.path.join(locks, str(base)), "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()  # another test process holds it
            continue
        if _free(base, span):
            _held.append(lock)
            return base
        lock.close()
    raise RuntimeError(f"no free range of {span} ports outside the ephemeral range {low}-{high}")


def _free(base: int, span: int) -> bool:
    sockets = []
    try:
        for port in range(base, base + span):
            sock = socket.socket()
            sockets.append(sock)
            sock.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        for sock in sockets:
            sock.close()
