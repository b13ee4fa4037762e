"""XLA flags for the fresh Pythons the tests start to run their own computations, the caller's
own flags kept. Unoptimised by default: the computations are small, compiling them is most of
their CPU and unoptimised it takes about half the time; what is computed is the same to float
rounding. A process that trains for long asks for XLA's optimisation."""

from __future__ import annotations

import os


def flags(cpu_devices: int | None = None, optimised: bool = False) -> str:
    """``XLA_FLAGS`` for such a process, with ``cpu_devices`` CPU devices if given."""
    level = "" if optimised else "--xla_backend_optimization_level=0 "
    devices = f" --xla_force_host_platform_device_count={cpu_devices}" if cpu_devices else ""
    return f"{level}{os.environ.get('XLA_FLAGS', '')}{devices}".strip()


def environ(cpu_devices: int | None = None, optimised: bool = False) -> dict[str, str]:
    """The test's environment for such a process, its JAX on the CPU."""
    return {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags(cpu_devices, optimised)}
