"""Chaos: a replay node SIGKILLed while it writes one of its own interval checkpoints
(``checkpoint_every_inserts``, ``checkpoint_every_seconds``) restores, when the supervisor brings
it back, the last complete checkpoint: never the torn one.

Items are large (1 MiB each, in batches of 8 inserted in one call), so a save takes long enough
to kill into: the test watches the checkpoint directory and SIGKILLs the node as soon as Orbax's
temporary directory of a save in progress appears. Once the dead process is reaped, the
directory tells which steps are complete and whether a save was cut short. The restarted node
must then restore the latest complete step (its log names the step and its size), hold exactly
the batches that step holds, and go on checkpointing under the torn step's number.
"""

from __future__ import annotations

import os
import re
import signal
import time

import numpy as np
import pytest

import jaxdist as jd
from jaxdist import courier
from jaxdist.nodes.replay import Fifo, ReplayClient, ReplayNode
from jaxdist.learning.layout import checkpoint_dir
from waiting import wait_until

pytestmark = pytest.mark.slow

ITEM_BYTES = 1 << 20
BATCH = 8
TORN_KILLS = 2
MAX_BATCHES = 16
NODE = "replay/0"


def batch(number: int) -> list[dict]:
    return [{"id": np.array([number, i], np.int64), "payload": np.full(ITEM_BYTES, (number * BATCH + i) % 251, np.uint8)}
            for i in range(BATCH)]


def committed(directory: str) -> list[int]:
    return sorted(int(name) for name in os.listdir(directory) if name.isdigit())


def latest(directory: str) -> int:
    return max(committed(directory), default=0)


def in_progress(directory: str) -> list[str]:
    return [name for name in os.listdir(directory) if "orbax-checkpoint-tmp" in name]


def restores(run_dir) -> list[tuple[int, int]]:
    """(step, items) of every restore the node's log reports, in order."""
    with open(os.path.join(run_dir, "logs", "replay-0.log")) as log:
        return [(int(step), int(size)) for step, size in re.findall(r"restored checkpoint step (\d+) \(default: (\d+)\)",
                                                                      log.read())]


def kill_inside_a_save(running: jd.Running, directory: str, newer_than: int) -> bool:
    """SIGKILLs the node once a save is seen in progress, and waits until the supervisor reaped it:
    True. False when a step newer than `newer_than` committed before any save was seen."""
    pid, restarts = running.status()[NODE]["pid"], running.status()[NODE]["restarts"]
    deadline = time.monotonic() + 60
    while not in_progress(directory):
        if latest(directory) > newer_than:
            return False
        assert time.monotonic() < deadline, "no checkpoint started within 60 s"
        time.sleep(0.001)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: running.status()[NODE]["restarts"] == restarts + 1, "the supervisor to reap the node")
    return True


@pytest.mark.parametrize("interval", [{"checkpoint_every_inserts": BATCH}, {"checkpoint_every_seconds": 0.3}],
                         ids=["every-inserts", "every-seconds"])
def test_a_replay_node_killed_while_writing_an_interval_checkpoint_restores_the_last_complete_one(tmp_path, interval):
    program = jd.Program("replay-torn-checkpoints")
    program.add_node(ReplayNode(Fifo(BATCH * MAX_BATCHES), **interval), label="replay")
    directory = checkpoint_dir(tmp_path, NODE)
    running = jd.launch(program, launcher="processes", run_dir=str(tmp_path), echo=False,
                        restart={"replay": jd.Restart(max_restarts=2 * MAX_BATCHES, backoff=0.2)})
    try:
        replay = ReplayClient(courier.Client(running.addresses[NODE], token=running.token, timeout=120))
        held: list[int] = []  # the batches the node holds, in order
        number, torn, kills = 0, 0, 0
        while torn < TORN_KILLS:
            assert number + 2 <= MAX_BATCHES, f"only {torn} of {number} kills landed inside a save"
            # A batch in a complete checkpoint: under every-inserts the save its insert starts,
            # under every-seconds the second save to commit after it (the first may have taken
            # its snapshot before the insert).
            step_before = latest(directory)
            replay.insert_many(batch(number), timeout=60)
            held.append(number)
            number += 1
            wanted = step_before + 1 if "checkpoint_every_inserts" in interval else latest(directory) + 2
            wait_until(lambda: latest(directory) >= wanted, "the batch to be checkpointed")
            safe, safe_step = list(held), latest(directory)

            # Another batch, and a kill inside the save that follows it (or one that was running).
            replay.insert_many(batch(number), timeout=60)
            held.append(number)
            number += 1
            if not kill_inside_a_save(running, directory, newer_than=safe_step):
                continue  # the save committed before it was seen: try again with the next batch
            kills += 1
            steps, cut = committed(directory), in_progress(directory)  # read before the restart cleans up
            seen = len(restores(tmp_path))
            wait_until(lambda: running.status()[NODE]["state"] == "running", "the node to come back")
            wait_until(lambda: len(restores(tmp_path)) > seen, "the restarted node to report its restore")
            step, size = restores(tmp_path)[-1]
            assert step == steps[-1], f"restored step {step}, but the latest complete step was {steps[-1]} ({steps})"
            assert size % BATCH == 0 and held[:size // BATCH] in (safe, held), \
                f"restored {size} items; complete checkpoints held {len(safe)} or {len(held)} batches"
            if cut:
                torn += 1
                assert step < int(cut[0].split(".")[0]), f"restored step {step} although the save of {cut} was cut"
                if "checkpoint_every_inserts" in interval:  # the cut save was the doomed batch's own
                    assert size == len(safe) * BATCH
            held = held[:size // BATCH]
            assert replay.size() == size
        # The torn steps' numbers were written again: the node checkpoints on after its restores.
        step_before = latest(directory)
        replay.insert_many(batch(number), timeout=60)
        held.append(number)
        wait_until(lambda: latest(directory) > step_before, "a checkpoint after the restores")
        drained = replay.sample(replay.size(), timeout=60)["data"]
    finally:
        running.stop()
    print(f"\n{interval}: {number + 1} batches, {kills} kills during saves ({torn} cut a save short), "
          f"restores {restores(tmp_path)}, {len(held)} batches held at the end")
    assert [tuple(row) for row in drained["id"].tolist()] == [(b, i) for b in held for i in range(BATCH)]
    expected = np.array([(b * BATCH + i) % 251 for b in held for i in range(BATCH)], np.uint8)
    assert (drained["payload"] == expected[:, None]).all(), "an item's payload changed across a restore"
