"""Checks every launcher runs before starting anything, so bad input fails fast and clearly."""

from __future__ import annotations

import os
import pickle
import secrets
from typing import Any

from jaxdist.program import Program


def check_program(program: Program) -> None:
    if not isinstance(program, Program):
        raise TypeError(f"launch() takes a jaxdist.Program, got {type(program).__name__}")
    if not program.groups:
        raise ValueError(f"program '{program.name}' has no nodes; add some with program.add_node(...)")


def check_resources(
    program: Program, resources: dict[str, dict[str, Any]] | None, supported: dict[str, str]
) -> dict[str, dict[str, Any]]:
    """Resources by group label; `supported` maps each key this launcher honours to its meaning."""
    resources = dict(resources or {})
    groups = ", ".join(sorted(program.groups))
    for label, spec in resources.items():
        if label not in program.groups:
            raise ValueError(f"resources name group '{label}', which program '{program.name}' does not have; groups: {groups}")
        if not isinstance(spec, dict):
            raise TypeError(f"resources['{label}'] must be a dict, got {type(spec).__name__}")
        unknown = sorted(set(spec) - set(supported))
        if unknown:
            known = "; ".join(f"{key}: {meaning}" for key, meaning in supported.items()) or "none"
            raise ValueError(f"resources['{label}'] has unknown keys {unknown}; this launcher supports: {known}")
    return resources


def check_shippable(program: Program) -> None:
    """Every argument of every node must pickle to reach its process; name the first that won't."""
    for _, node in program.units():
        for name, value in node.shipped_arguments().items():
            try:
                pickle.dumps(value)
            except Exception as exc:
                raise TypeError(
                    f"node '{node.name}': {name} {value!r:.80} cannot be sent to a process ({exc}); use a "
                    f"module-level function or class, pass data that pickles, or use launcher='threads'"
                ) from None


def prepare_run_dir(program: Program, run_dir: str | None) -> str:
    """The run directory, made if need be for its owner alone (0o700: logs, checkpoints and
    metrics may hold what a program's nodes print and learn); an existing one keeps its mode."""
    run_dir = os.path.abspath(run_dir or os.path.join("runs", program.name))
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    os.makedirs(os.path.join(run_dir, "logs"), mode=0o700, exist_ok=True)
    return run_dir


def new_token() -> str:
    """A per-launch secret every node's server asks of its callers."""
    return secrets.token_hex(16)
