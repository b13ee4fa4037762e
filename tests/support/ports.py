"""Free port ranges for tests that run several hosts' servers on 127.0.0.1."""

from __future__ import annotations

import random
import socket


def free_base_port(span: int = 20) -> int:
    """A base port whose next `span` ports are free now (the tests' two hosts share 127.0.0.1)."""
    for _ in range(50):
        base = random.randrange(30000, 60000)
        try:
            sockets = []
            for port in range(base, base + span):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError("no free port range found")
