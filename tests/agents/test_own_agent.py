"""The "Write your own agent" guide's A2C: three files outside the library that train from their
own command line on both architectures, and whose runs ``load_policy`` and ``python -m
jaxdist.tools.evaluate`` play back, with nothing in jaxdist knowing of them."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from jaxdist.agents import load_policy

REPO = pathlib.Path(__file__).resolve().parents[2]
CUSTOM = REPO / "experiments" / "custom"
AGENT_FILES = ("a2c.py", "a2c_learning.py", "train_a2c.py")


def run(*command: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(CUSTOM), JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=REPO)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_the_library_knows_nothing_of_the_agent_and_its_record_imports_no_jax():
    assert all((CUSTOM / name).is_file() for name in AGENT_FILES)
    named = [str(path) for path in (REPO / "jaxdist").rglob("*.py") if "a2c" in path.read_text().lower()]
    assert named == []
    code = "import sys, a2c; a2c.agent(a2c.A2CConfig()).topology(); print(sorted({'jax', 'flax'} & set(sys.modules)))"
    assert run("-c", code).stdout.strip() == "[]"


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["sebulba", "anakin"])
def test_the_agent_trains_from_its_command_line_and_its_run_plays_back(architecture, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    run(str(CUSTOM / "train_a2c.py"), "--architecture", architecture, "--run-dir", str(run_dir), "--total-steps",
        "16384", "--eval-every-updates", "16", "--eval-episodes", "2", "--launcher", "processes", "--quiet")
    saved = json.loads((run_dir / "config.json").read_text())
    assert (saved["agent"], saved["config_type"]) == ("a2c:agent", "a2c:A2CConfig")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["learner_version"] == 64 and summary["env_steps"] >= 16384 and summary["final_return"] > 0
    monkeypatch.syspath_prepend(str(CUSTOM))  # where the agent's record is, as the command line has it
    policy = load_policy(str(run_dir))
    assert policy.step == 64 and policy.act(np.zeros((3, 4), np.float32)).shape == (3,)
    played = run("-m", "jaxdist.tools.evaluate", str(run_dir), "--episodes", "2").stdout
    assert "a2c on CartPole-v1 at update 64: mean return" in played
