"""A courier echo server or client in its own process, reporting its peak memory (Linux).

`python memory_probe.py server [TOKEN]` prints its address and serves until stdin closes;
`python memory_probe.py client ADDRESS MB socket|shared` echoes an MB-sized float32 array
through it and prints JSON with both processes' peak resident memory growth during the call
and, after it, their anonymous (private) memory growth and the growth of /dev/shm's use: shared
pages count in the resident set of every process that maps them, so through shared memory the
memory a call adds is anonymous memory plus the segments.
"""

import json
import os
import sys

import numpy as np

from jaxdist import courier


def resident_mb(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> float:
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # resets VmHWM, the peak resident set size
    return resident_mb("VmRSS")


def shm_used_mb() -> float:
    stats = os.statvfs("/dev/shm")
    return (stats.f_blocks - stats.f_bfree) * stats.f_frsize / (1 << 20)


class Echo:
    def __init__(self) -> None:
        self._baseline = self._anon_baseline = 0.0

    def reset_peak(self) -> None:
        self._baseline = reset_peak()
        self._anon_baseline = resident_mb("RssAnon")

    def peak_growth_mb(self) -> float:
        return resident_mb("VmHWM") - self._baseline

    def anon_growth_mb(self) -> float:
        return resident_mb("RssAnon") - self._anon_baseline

    def echo(self, value):
        return value


def main() -> None:
    if sys.argv[1] == "server":
        server = courier.Server(Echo(), token=sys.argv[2] if len(sys.argv) > 2 else None).start()
        print(server.address, flush=True)
        sys.stdin.read()
        server.stop(grace=0)
        return
    address, megabytes, path = sys.argv[2], int(sys.argv[3]), sys.argv[4]
    client = courier.Client(address, timeout=120, shared_memory_bytes=0 if path == "socket" else 1 << 30)
    array = np.ones(megabytes << 18, np.float32)
    client.reset_peak()
    client.echo(np.ones(4, np.float32))  # warm the connection before measuring
    baseline, anon_baseline, shm_baseline = reset_peak(), resident_mb("RssAnon"), shm_used_mb()
    echoed = client.echo(array)
    client_growth = resident_mb("VmHWM") - baseline
    assert echoed.shape == array.shape and float(echoed[-1]) == 1.0
    print(json.dumps({"client_mb": client_growth, "server_mb": client.peak_growth_mb(),
                      "client_anon_mb": resident_mb("RssAnon") - anon_baseline,
                      "server_anon_mb": client.anon_growth_mb(), "shm_mb": shm_used_mb() - shm_baseline}))


if __name__ == "__main__":
    main()
