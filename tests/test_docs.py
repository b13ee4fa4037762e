"""The documentation: every Python block of the guides and of the README runs, as a script of its own in a fresh
process (its assertions are the guide's claims); every public name has a docstring; and the
site builds with mkdocs in strict mode (a broken reference or page fails it)."""

from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GUIDES = os.path.join(REPO, "docs", "guides")
README = os.path.join(REPO, "README.md")
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
SLOW_GUIDES = {"own-env-and-network.md"}  # trains an agent for a while


def python_blocks() -> list:
    cases = []
    for path in [README, *(os.path.join(GUIDES, name) for name in sorted(os.listdir(GUIDES)))]:
        name = os.path.basename(path)
        with open(path) as f:
            for index, block in enumerate(BLOCK.findall(f.read())):
                marks = [pytest.mark.slow] if name in SLOW_GUIDES else []
                cases.append(pytest.param(name, block, id=f"{name}#{index}", marks=marks))
    return cases


@pytest.mark.parametrize(("guide", "code"), python_blocks())
def test_every_python_block_of_the_guides_runs(guide, code, tmp_path):
    script = tmp_path / "block.py"
    script.write_text(code)
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.path.join(REPO, "experiments", "custom"))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, f"a block of {guide} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"


PUBLIC_MODULES = ["jaxdist", "jaxdist.courier", "jaxdist.agents", "jaxdist.agents.ppo", "jaxdist.agents.impala",
                  "jaxdist.agents.apex", "jaxdist.agents.r2d2", "jaxdist.agents.es", "jaxdist.agents.run",
                  "jaxdist.compat.launchpad"]


def public_names():
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isclass(value) or inspect.isfunction(value) or inspect.ismodule(value):
                yield f"{module_name}.{name}", value
                if inspect.isclass(value):
                    for attribute, member in vars(value).items():
                        if not attribute.startswith("_") and inspect.isfunction(member):
                            yield f"{module_name}.{name}.{attribute}", getattr(value, attribute)


def test_every_public_name_has_a_docstring():
    """A method that overrides a documented one (a Node's) inherits its docstring."""
    missing = sorted({name for name, value in public_names() if not (inspect.getdoc(value) or "").strip()})
    assert not missing, "public names without a docstring: " + ", ".join(missing)


@pytest.mark.slow
def test_the_site_builds_in_strict_mode(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "reference" / "jaxdist" / "index.html").exists()
