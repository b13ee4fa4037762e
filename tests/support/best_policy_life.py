"""An evaluator's life that a SIGKILL ends during a best-policy save; driven by tests/nodes/test_evaluator.py.

It saves version 4 (return 10) as the best policy and records its evaluation, as the Evaluator
does, then offers version 8 (return 20) and kills itself while that save is being written.
Parameters are ``{"w": <float32 array of SIZE, every element the version>}``.
"""

import os
import signal
import sys

import numpy as np

SIZE = 5_000_000  # 20 MB: a save long enough to be cut short


def params(value: float) -> dict[str, np.ndarray]:
    return {"w": np.full(SIZE, value, np.float32)}


def main(run_dir: str) -> None:
    from jaxdist.records.metrics import MetricsWriter, metrics_path
    from jaxdist.nodes.evaluator import EVALUATIONS, BestPolicy

    best = BestPolicy(run_dir)
    with MetricsWriter(metrics_path(run_dir, EVALUATIONS)) as writer:
        best.offer(4, params(4), np.array([10.0]))
        writer.write(4, {"mean_return": 10.0})
        writer.flush()
        best.offer(8, params(8), np.array([20.0]))  # returns while the save is written
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main(sys.argv[1])
