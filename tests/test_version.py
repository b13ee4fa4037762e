"""The version users see is the one the package was built with (pyproject reads it from jaxdist)."""

import importlib.metadata

import jaxdist


def test_the_installed_version_is_jaxdist_version():
    assert jaxdist.__version__ == importlib.metadata.version("jaxdist")
    assert "__version__" in jaxdist.__all__
