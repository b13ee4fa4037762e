"""What a relaunched node restored, written down for the resume tests; imported by Python at
the start of every process whose ``PYTHONPATH`` holds this directory (and ``tests/support``).

With ``JAXDIST_TEST_RESTORES=<dir>`` in the environment (a launch's node processes inherit it),
each learner checkpoint and each replay node's tables, as the node holds them once restored,
are written to ``<dir>``: ``learner-<process index>.npz`` (the restored state's leaves by path)
and ``replay-<checkpoint step>.npz`` plus ``.json`` (the tables' snapshot, in the layout of
their checkpoint). It only observes: the nodes do what they do without it.
"""

import os

RESTORES = os.environ.get("JAXDIST_TEST_RESTORES")


def _observe() -> None:
    import json

    import jax
    import numpy as np

    from jaxdist.nodes.learner.checkpointing import Checkpointing
    from jaxdist.nodes.replay import checkpointing as replay_checkpointing
    from resume_checks import flat_leaves

    learner_restore = Checkpointing.restore
    tables_restore = replay_checkpointing.TableCheckpointer.restore

    def restore(self, template):
        restored = learner_restore(self, template)
        state = restored if self._dp.mode == "jit" else self._dp.unreplicate(restored)
        np.savez(os.path.join(RESTORES, f"learner-{jax.process_index()}.npz"), **flat_leaves(state))
        return restored

    def restore_tables(self, tables):
        step = tables_restore(self, tables)
        if step is not None:
            arrays, meta = replay_checkpointing.to_checkpoint(
                {name: table.state() for name, table in tables.items()},
                {name: type(table).__name__ for name, table in tables.items()})
            np.savez(os.path.join(RESTORES, f"replay-{step}.npz"), **flat_leaves(arrays))
            with open(os.path.join(RESTORES, f"replay-{step}.json"), "w") as f:
                json.dump(meta, f)
        return step

    Checkpointing.restore = restore
    replay_checkpointing.TableCheckpointer.restore = restore_tables


if RESTORES:
    _observe()
