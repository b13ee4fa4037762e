"""A courier echo server or client in its own process, reporting its peak memory (Linux).

`python memory_probe.py server [TOKEN]` prints its address and serves until stdin closes;
`python memory_probe.py client ADDRESS MB socket|shared` echoes an MB-sized float32 array
through it and prints JSON with both processes' peak resident memory growth during the call
and, after it, their anonymous (private) memory growth and the growth of the two processes'
segments in /dev/shm: shared pages count in the resident set of every process that maps them, so
through shared memory the memory a call adds is anonymous memory plus the segments. (Their own
segments, by the creator's pid in the name: other processes' come and go in /dev/shm meanwhile.)
"""

import json
import os
import re
import sys

import numpy as np

from jaxdist import courier
from jaxdist.courier import shared_memory


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


def segments_mb(pids: set[int]) -> float:
    """The memory that the segments made by processes `pids` take in /dev/shm."""
    name = re.compile(rf"{shared_memory.PREFIX}\d+-(\d+)-[0-9a-f]{{16}}")
    used = 0
    for entry in os.scandir(shared_memory.DIRECTORY):
        match = name.fullmatch(entry.name)
        if match and int(match.group(1)) in pids:
            try:
                used += entry.stat(follow_symlinks=False).st_blocks * 512
            except FileNotFoundError:
                pass
    return used / (1 << 20)


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

    def pid(self) -> int:
        return os.getpid()


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
    pids = {os.getpid(), client.pid()}
    baseline, anon_baseline, shm_baseline = reset_peak(), resident_mb("RssAnon"), segments_mb(pids)
    echoed = client.echo(array)
    client_growth = resident_mb("VmHWM") - baseline
    assert echoed.shape == array.shape and float(echoed[-1]) == 1.0
    print(json.dumps({"client_mb": client_growth, "server_mb": client.peak_growth_mb(),
                      "client_anon_mb": resident_mb("RssAnon") - anon_baseline,
                      "server_anon_mb": client.anon_growth_mb(), "shm_mb": segments_mb(pids) - shm_baseline}))


if __name__ == "__main__":
    main()
