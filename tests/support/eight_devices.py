"""The data-parallel check every learner's math gets: its update under ``jit`` and ``pmap`` on 8
CPU devices, in a fresh Python (the device count is fixed when JAX starts, so it cannot change
in the test's own process).

A test module defines ``eight_device_cases() -> {name: (update, state, batch)}``;
``on_eight_devices("agents.test_x_math", tmp_path)`` runs each case's update once per mode
(``jaxdist.learning.parallel.data_parallel``) and returns the flattened results keyed
``"<mode>/<name>/['state']..."`` and ``"<mode>/<name>/['metrics']..."``.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import xla_flags

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUPPORT = os.path.join(TESTS, "support")

PER_DEVICE_METRICS = {"['metrics']['transitions']", "['metrics']['policy_lag_max']"}
"""Not averages but sums or maxima over the batch: pmap reports their mean over devices."""


def flat_tree(tree: Any) -> dict[str, np.ndarray]:
    import jax

    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def on_eight_devices(module: str, tmp_path: Path) -> dict[str, np.ndarray]:
    path = str(tmp_path / "eight_devices.npz")
    code = (f"import sys; sys.path[:0] = [{TESTS!r}, {SUPPORT!r}]\n"
            f"import eight_devices; eight_devices.run_cases({module!r}, {path!r})")
    done = subprocess.run([sys.executable, "-c", code], env=xla_flags.environ(8, optimised=True),
                          capture_output=True, text=True, timeout=480)  # unoptimised, jit and pmap round apart past 1e-6
    assert done.returncode == 0, done.stdout + done.stderr
    with np.load(path) as results:
        return dict(results)


def run_cases(module: str, path: str) -> None:
    """In the 8-device process: every case of ``module`` under both modes, saved to ``path``."""
    import jax

    from jaxdist.learning import parallel

    assert jax.device_count() == 8
    cases = importlib.import_module(module).eight_device_cases()
    out = {}
    for mode in ("jit", "pmap"):
        for name, (update, state, batch) in cases.items():
            step = parallel.data_parallel(update, mode=mode)
            state, metrics = step(step.replicate(state), step.shard_batch(batch), jax.random.key(1))
            tree = {"state": step.unreplicate(state), "metrics": metrics}
            out.update({f"{mode}/{name}/{key}": value for key, value in flat_tree(tree).items()})
    np.savez(path, **out)


def assert_pmap_equals_jit(got: dict[str, np.ndarray], case: str) -> list[str]:
    """pmap (each device's shard, gradients and statistics averaged over devices) equals jit on
    the global batch, leaf by leaf; returns the leaves' names."""
    import chex

    names = sorted(key.removeprefix(f"jit/{case}/") for key in got if key.startswith(f"jit/{case}/"))
    compared = set(names) - PER_DEVICE_METRICS
    chex.assert_trees_all_close(*({name: got[f"{mode}/{case}/{name}"] for name in compared} for mode in ("pmap", "jit")),
                                rtol=1e-5, atol=1e-6)
    return names
