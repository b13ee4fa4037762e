"""MuJoCo's warnings through Python's logging instead of MuJoCo's own handler, which prints them
and appends them to a ``MUJOCO_LOG.TXT`` in the working directory (a run's, or the user's
checkout). Deprecations in the model files gymnasium ships are no news to the user: debug
level; any other warning (an unstable simulation, say) a warning, once per text."""

from __future__ import annotations

import importlib.util
import logging

log = logging.getLogger(__name__)
_seen: set[str] = set()


def _warning(text: str) -> None:
    if text not in _seen:
        _seen.add(text)
        log.log(logging.DEBUG if "deprecated" in text else logging.WARNING, "MuJoCo: %s", text)


def route_mujoco_warnings(entry_point: object) -> None:
    """Before making an env whose entry point is gymnasium's MuJoCo package (which compiles its
    model as it is made): MuJoCo's warnings go to this module's logger."""
    if "mujoco" not in str(entry_point) or importlib.util.find_spec("mujoco") is None:
        return
    import mujoco

    if mujoco.get_mju_user_warning() is None:
        mujoco.set_mju_user_warning(_warning)
