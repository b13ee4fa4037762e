"""A courier echo server or client in its own process, reporting its peak memory (Linux).

`python memory_probe.py server [TOKEN]` prints its address and serves until stdin closes;
`python memory_probe.py client ADDRESS MB` echoes an MB-sized float32 array through it and
prints JSON with both processes' peak resident memory growth during the call.
"""

import json
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


class Echo:
    def __init__(self) -> None:
        self._baseline = 0.0

    def reset_peak(self) -> None:
        self._baseline = reset_peak()

    def peak_growth_mb(self) -> float:
        return resident_mb("VmHWM") - self._baseline

    def echo(self, value):
        return value


def main() -> None:
    if sys.argv[1] == "server":
        server = courier.Server(Echo(), token=sys.argv[2] if len(sys.argv) > 2 else None).start()
        print(server.address, flush=True)
        sys.stdin.read()
        server.stop(grace=0)
        return
    address, megabytes = sys.argv[2], int(sys.argv[3])
    client = courier.Client(address, timeout=120)
    array = np.ones(megabytes << 18, np.float32)
    client.reset_peak()
    client.echo(np.ones(4, np.float32))  # warm the connection before measuring
    baseline = reset_peak()
    echoed = client.echo(array)
    client_growth = resident_mb("VmHWM") - baseline
    assert echoed.shape == array.shape and float(echoed[-1]) == 1.0
    print(json.dumps({"client_mb": client_growth, "server_mb": client.peak_growth_mb()}))


if __name__ == "__main__":
    main()
