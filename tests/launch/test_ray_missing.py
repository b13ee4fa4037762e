"""Without Ray installed, launcher='ray' says what to install; nothing else imports Ray."""

from __future__ import annotations

import subprocess
import sys

import pytest

import jaxdist as jd
import launch_nodes as nodes
from jaxdist.launch import available_launchers


def test_launcher_ray_without_ray_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if it were not installed
    program = jd.Program("no-ray")
    program.add_node(jd.CourierNode(nodes.Counter))
    assert "ray" in available_launchers()
    with pytest.raises(ImportError, match=r"pip install 'jaxdist\[ray\]'"):
        jd.launch(program, launcher="ray", run_dir=str(tmp_path))


def test_importing_jaxdist_and_its_launchers_imports_no_ray():
    code = ("import sys, jaxdist, jaxdist.launch.launchers.ray, jaxdist.agents.run; "
            "assert 'ray' not in sys.modules, 'ray was imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
