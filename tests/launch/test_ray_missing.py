"""Without Ray installed, launcher='ray' says what to install; nothing else imports Ray."""

from __future__ import annotations

import re
import socket
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
    with pytest.raises(ImportError, match=r"pip install ray \(in the jaxdist clone: pip install -e '\.\[ray\]'\)"):
        jd.launch(program, launcher="ray", run_dir=str(tmp_path))


def test_importing_jaxdist_and_its_launchers_imports_no_ray():
    code = ("import sys, jaxdist, jaxdist.launch.launchers.ray, jaxdist.agents.run; "
            "assert 'ray' not in sys.modules, 'ray was imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_a_ray_cluster_that_is_gone_is_refused_in_one_line_not_waited_for(tmp_path, scheme):
    pytest.importorskip("ray", reason="the ray extra is not installed")
    with socket.socket() as free:  # a port where nothing listens: the cluster that was there is gone
        free.bind(("127.0.0.1", 0))
        address = f"{scheme}127.0.0.1:{free.getsockname()[1]}"
    program = jd.Program("gone")
    program.add_node(jd.CourierNode(nodes.Counter))
    with pytest.raises(jd.LaunchError, match=rf"^no Ray cluster answers at {re.escape(address)} \("):
        jd.launch(program, launcher="ray", address=address, run_dir=str(tmp_path))
