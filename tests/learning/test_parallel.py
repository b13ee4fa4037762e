"""jaxdist.learning.parallel: meshes, data-parallel steps on 1 vs 8 devices, two processes vs one.

Multi-device runs happen in subprocesses (tests/helpers/dist_worker.py) because this pytest
process may already have started JAX with one device.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

import xla_flags
from jaxdist.learning import parallel

WORKER = Path(__file__).parents[1] / "helpers" / "dist_worker.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load(prefix: Path, process: int = 0) -> dict[str, np.ndarray]:
    with np.load(f"{prefix}.{process}.npz") as f:
        return dict(f)


def run_workers(argvs: list[list[str]], timeout: float = 90) -> None:
    """Start all workers at once, wait for all, kill any survivor."""
    procs = [subprocess.Popen([sys.executable, str(WORKER), *argv], env=xla_flags.environ(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for argv in argvs]
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-4000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Reference on 1 device and the same training on 8 devices, run side by side.

    The 8-device worker also asserts that a checkpoint of the replicated state restores with
    the same sharding, and that 64 unblocked step calls do not hang.
    """
    d = tmp_path_factory.mktemp("runs")
    run_workers([["--devices", "1", "--out", str(d / "one")],
                 ["--devices", "8", "--out", str(d / "eight"), "--ckpt-dir", str(d / "ckpt"),
                  "--unblocked-calls", "64"]])
    return d


PARAMS = ("w1", "b1", "w2", "b2")


def params_of(run: dict, variant: str) -> dict[str, np.ndarray]:
    return {name: run[f"{variant}/{name}"] for name in PARAMS}


def assert_close(got: dict, want: dict, what: str) -> None:
    for name in PARAMS:
        err = np.linalg.norm(got[name] - want[name]) / np.linalg.norm(want[name])
        assert err <= 1e-5, f"{what}/{name}: relative error {err:.2e}"


def numpy_training(run: dict, lr: float = 1e-2, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> dict:
    """The workers' training written out in float64 NumPy, from the initial parameters and batches
    a worker saved: a tanh MLP, mean squared error, gradients by hand, Adam (optax.adam's defaults)."""
    params = {name: run[f"init/{name}"].astype(np.float64) for name in PARAMS}
    mu = {name: np.zeros_like(value) for name, value in params.items()}
    nu = {name: np.zeros_like(value) for name, value in params.items()}
    for t, (x, y) in enumerate(zip(run["data/x"].astype(np.float64), run["data/y"].astype(np.float64)), start=1):
        h = np.tanh(x @ params["w1"] + params["b1"])
        error = 2 * ((h @ params["w2"] + params["b2"])[:, 0] - y) / len(y)  # d loss / d prediction
        dz = error[:, None] @ params["w2"].T * (1 - h**2)
        grads = {"w1": x.T @ dz, "b1": dz.sum(0), "w2": h.T @ error[:, None], "b2": error.sum(keepdims=True)}
        for name, grad in grads.items():
            mu[name] = b1 * mu[name] + (1 - b1) * grad
            nu[name] = b2 * nu[name] + (1 - b2) * grad**2
            params[name] -= lr * (mu[name] / (1 - b1**t)) / (np.sqrt(nu[name] / (1 - b2**t)) + eps)
    return params


@pytest.fixture(scope="module")
def reference(runs) -> dict[str, np.ndarray]:
    return numpy_training(load(runs / "one"))


def test_make_mesh_is_one_auto_axis_over_all_devices():
    mesh = parallel.make_mesh(axis_name="batch")
    assert mesh.axis_names == ("batch",)
    assert mesh.axis_types == (AxisType.Auto,)
    assert list(mesh.devices.flat) == jax.devices()


def test_pmean_is_identity_outside_a_pmap_step():
    tree = {"g": jnp.arange(3.0)}
    assert parallel.pmean(tree) is tree


def test_data_parallel_rejects_unknown_mode_and_zero_steps():
    with pytest.raises(ValueError, match="mode"):
        parallel.data_parallel(lambda s, b, r: (s, {}), mode="pjit")
    with pytest.raises(ValueError, match="steps_per_call"):
        parallel.data_parallel(lambda s, b, r: (s, {}), steps_per_call=0)


def test_prefetch_yields_every_batch_in_order_already_on_devices():
    mesh = parallel.make_mesh(jax.devices()[:1])
    step = parallel.data_parallel(lambda s, b, r: (s, {}), mesh=mesh)
    batches = [{"x": np.full((2, 3), i, np.float32)} for i in range(5)]
    got = list(step.prefetch(iter(batches), size=2))
    assert [int(b["x"][0, 0]) for b in got] == list(range(5))
    assert all(isinstance(b["x"], jax.Array) for b in got)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("variant", ["jit", "pmap", "jit_scan", "pmap_scan"])
def test_one_and_eight_devices_match_a_numpy_reference_and_each_other(runs, reference, variant):
    # Every variant trains the same 10 steps (float32 on devices, float64 in the reference).
    one, eight = params_of(load(runs / "one"), variant), params_of(load(runs / "eight"), variant)
    assert_close(one, reference, f"one device {variant}")
    assert_close(eight, reference, f"eight devices {variant}")
    assert_close(eight, one, f"eight devices {variant} against one")


@pytest.mark.timeout(120)
def test_random_draws_over_the_global_batch_do_not_depend_on_device_count(runs):
    assert_close(params_of(load(runs / "eight"), "jit_noisy"), params_of(load(runs / "one"), "jit_noisy"), "jit_noisy")


@pytest.mark.timeout(120)
def test_two_processes_of_four_devices_match_one_process_of_eight(runs, tmp_path):
    coordinator = f"127.0.0.1:{free_port()}"
    run_workers([["--devices", "4", "--out", str(tmp_path / "two"),
                  "--ckpt-dir", str(tmp_path / "ckpt"), "--variants", "jit,jit_scan,pmap",
                  "--coordinator", coordinator, "--num-processes", "2", "--process-id", str(i)]
                 for i in range(2)])
    eight = load(runs / "eight")
    for process in range(2):
        two = load(tmp_path / "two", process)
        for variant in ("jit", "jit_scan", "pmap"):
            assert_close(params_of(two, variant), params_of(eight, variant), f"two processes {variant}")


def test_sigterm_runs_the_chained_handler_before_it_raises_the_flag():
    """A learner in a launched node checks the program's stop, then the SIGTERM flag: with the
    flag raised first, a SIGTERM could read as "preempted (SIGTERM)" before the worker's handler
    had stopped the program."""
    script = (
        "import os, signal\n"
        "from jaxdist.learning import parallel\n"
        "seen = []\n"
        "signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(parallel.preemption_requested(0)))\n"
        "parallel.install_sigterm_flag()\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "print(seen, parallel.preemption_requested(0))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env=xla_flags.environ())
    assert done.stdout.strip() == "[False] True", done.stdout + done.stderr


PREEMPTED_ON_THE_MAIN_THREAD = """
import os, signal, sys, time
from jaxdist.learning import parallel
parallel.initialize(coordinator_address=f"127.0.0.1:{sys.argv[1]}", num_processes=1, process_id=0)
os.kill(os.getpid(), signal.SIGTERM)
step = 0
while not parallel.preemption_requested(step) and step < 600:
    step += 1
    time.sleep(0.05)
print("sync point at", step, flush=True)
"""

# As in a launched node: the worker's handler on the main thread, the learner's parts built and
# run on threads of their own, its stop seen by the learner, which posts the notice.
PREEMPTED_IN_A_NODE = """
import os, signal, sys, threading, time
from jaxdist.learning import parallel
signal.signal(signal.SIGTERM, lambda signum, frame: print("the worker's handler ran", flush=True))
joining = threading.Thread(target=parallel.initialize, kwargs=dict(
    coordinator_address=f"127.0.0.1:{sys.argv[1]}", num_processes=1, process_id=0))
joining.start()
joining.join()
os.kill(os.getpid(), signal.SIGTERM)
def learn():
    parallel.post_preemption_notice()
    step = 0
    while not parallel.preemption_requested(step) and step < 600:
        step += 1
        time.sleep(0.05)
    print("sync point at", step, flush=True)
learning = threading.Thread(target=learn)
learning.start()
learning.join()
"""


@pytest.mark.parametrize("script", [PREEMPTED_ON_THE_MAIN_THREAD, PREEMPTED_IN_A_NODE], ids=["main", "node"])
def test_sigterm_under_jax_distributed_reaches_the_sync_point_without_jaxs_sigterm_caught_line(script):
    """JAX's preemption service caught SIGTERM with a C++ handler of its own, which logged
    ``SIGTERM caught at <time>`` into the output of every stop of a learner spanning hosts (and
    in a node, left the worker's handler unrun)."""
    from ports import reserve_base_port

    done = subprocess.run([sys.executable, "-c", script, str(reserve_base_port(1))], capture_output=True,
                          text=True, timeout=120, env=xla_flags.environ())
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "sync point at" in done.stdout and "at 600" not in done.stdout, output[-3000:]
    assert "SIGTERM caught" not in output and "preemption_notifier" not in output, output[-3000:]
    if script is PREEMPTED_IN_A_NODE:
        assert "the worker's handler ran" in done.stdout, output[-3000:]


COORDINATOR = """
import sys
from jaxdist.learning import parallel
port = sys.argv[1]
parallel.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=1, process_id=0)
listening = []
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(table).read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state == "0A" and int(local.rsplit(":", 1)[1], 16) == int(port):
            listening.append(local.rsplit(":", 1)[0])
print(" ".join(listening), flush=True)
"""


def test_the_jax_distributed_coordinator_listens_only_where_the_host_list_says():
    """It has no TLS nor token: on every interface, anyone who reaches the host reaches it."""
    from ports import reserve_base_port

    port = reserve_base_port(1)
    env = {key: value for key, value in os.environ.items() if key != "JAX_COORDINATOR_BIND_ADDRESS"}
    done = subprocess.run([sys.executable, "-c", COORDINATOR, str(port)], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    loopback = {"0100007F", "0000000000000000FFFF00000100007F"}  # 127.0.0.1, plain or IPv4-mapped
    assert done.stdout.split() and set(done.stdout.split()) <= loopback, done.stdout  # not 0.0.0.0 nor [::]
