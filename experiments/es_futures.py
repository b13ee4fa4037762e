"""Evolution strategies with futures (Launchpad paper, listings 6 and 10).

A learner keeps the parameters; each iteration it asks every worker, with futures, to evaluate
antithetic perturbations regenerated from seeds (only seeds and fitnesses cross the wire, not
noise vectors), then steps along the rank-normalised fitness-weighted noise. The objective is
the sphere function around a target point, so progress is easy to read: distance shrinks.

    python experiments/es_futures.py --launcher processes --num-workers 4 --iterations 100
"""

from __future__ import annotations

import argparse

import numpy as np

import jaxdist as jd


def noise(seed: int, dimension: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(dimension)


def fitness(theta: np.ndarray, target: np.ndarray) -> float:
    return -float(np.sum((theta - target) ** 2))


class Worker:
    def __init__(self, target: np.ndarray) -> None:
        self._target = target

    def evaluate(self, theta: np.ndarray, seeds: list[int], sigma: float) -> list[tuple[float, float]]:
        """Fitness of theta +/- sigma * noise(seed) for each seed."""
        results = []
        for seed in seeds:
            epsilon = sigma * noise(seed, theta.size)
            results.append((fitness(theta + epsilon, self._target), fitness(theta - epsilon, self._target)))
        return results


def centered_ranks(values: np.ndarray) -> np.ndarray:
    ranks = np.empty(values.size)
    ranks[values.ravel().argsort()] = np.arange(values.size)
    return (ranks / (values.size - 1) - 0.5).reshape(values.shape)


class Learner:
    def __init__(self, workers: list, dimension: int, iterations: int, seeds_per_worker: int) -> None:
        self._workers = workers
        self._dimension, self._iterations, self._seeds_per_worker = dimension, iterations, seeds_per_worker

    def run(self) -> None:
        theta, sigma, learning_rate = np.zeros(self._dimension), 0.1, 0.05
        next_seed = 0
        for iteration in range(self._iterations):
            seeds, futures = [], []
            for worker in self._workers:
                batch = list(range(next_seed, next_seed + self._seeds_per_worker))
                next_seed += self._seeds_per_worker
                seeds.extend(batch)
                futures.append(worker.futures.evaluate(theta, batch, sigma))
            pairs = np.array([pair for future in futures for pair in future.result()])
            weights = centered_ranks(pairs)
            step = sum((weights[i, 0] - weights[i, 1]) * noise(seed, self._dimension) for i, seed in enumerate(seeds))
            theta = theta + learning_rate / (len(seeds) * sigma) * step
            if iteration % 10 == 0 or iteration == self._iterations - 1:
                print(f"iteration {iteration:4d}  mean fitness {pairs.mean():10.3f}", flush=True)
        print(f"final fitness {fitness(theta, np.ones(self._dimension)):.4f}", flush=True)
        jd.stop()


def make_program(num_workers: int, dimension: int, iterations: int, seeds_per_worker: int) -> jd.Program:
    program = jd.Program("es_futures")
    target = np.ones(dimension)
    with program.group("worker"):
        workers = [program.add_node(jd.CourierNode(Worker, target)) for _ in range(num_workers)]
    with program.group("learner"):
        program.add_node(jd.CourierNode(Learner, workers, dimension, iterations, seeds_per_worker))
    return program


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launcher", choices=["threads", "processes"], default="processes")
    parser.add_argument("--num-workers", type=int, default=4)
    parser.add_argument("--dimension", type=int, default=20)
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--seeds-per-worker", type=int, default=8)
    parser.add_argument("--run-dir", default=None)
    args = parser.parse_args()
    program = make_program(args.num_workers, args.dimension, args.iterations, args.seeds_per_worker)
    jd.launch(program, launcher=args.launcher, run_dir=args.run_dir).wait()


if __name__ == "__main__":
    main()
