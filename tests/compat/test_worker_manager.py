"""What `lp.launch` returns, with Launchpad's worker-manager semantics: stop and wait, wait for
some groups or the first of them, a node's failure raised once (or kept, or raised at the test's
cleanup), a local launch that returns at once and holds the interpreter until the program is over;
and `Program.get_all_nodes`."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import unittest

import jaxdist.compat.launchpad as lp


def _fail() -> None:
    raise ValueError("Error")


def _return() -> None:
    pass


class WorkerManagerTest(unittest.TestCase):

    def test_stop_and_wait(self):
        program = lp.Program("stop_and_wait")
        with program.group("waiter"):
            for _ in range(3):
                program.add_node(lp.PyNode(lp.wait_for_stop))
        manager = lp.launch(program, launch_type=lp.LaunchType.TEST_MULTI_THREADING, test_case=self)
        self.assertEqual(manager.status()["waiter/0"]["state"], "running")  # launch returned at once
        manager.stop_and_wait()
        self.assertEqual({status["state"] for status in manager.status().values()}, {"stopped"})

    def test_failure_is_raised_once(self):
        program = lp.Program("failure_wait")
        program.add_node(lp.PyNode(lp.wait_for_stop), label="waiter")
        program.add_node(lp.PyNode(_fail), label="failure")
        manager = lp.launch(program, launch_type="test_mt", test_case=self)
        with self.assertRaisesRegex(RuntimeError, "ValueError: Error"):
            manager.wait(["waiter"])  # the failure of another group ends the wait
        manager.wait()  # raised once: not again

    def test_dont_raise_error_keeps_the_failure_for_the_next_wait(self):
        program = lp.Program("dont_raise")
        program.add_node(lp.PyNode(_fail), label="failure")
        manager = lp.launch(program, launch_type="test_mt", test_case=self)
        manager.wait(raise_error=False)
        with self.assertRaisesRegex(RuntimeError, "Error"):
            manager.wait()
        manager.stop_and_wait()  # stopping raises nothing either

    def test_wait_for_some_labels_while_others_serve(self):
        class Server:
            def ping(self) -> str:
                return "pong"

        program = lp.Program("labels")
        server = program.add_node(lp.CourierNode(Server), label="server")
        program.add_node(lp.PyNode(lp.wait_for_stop), label="waiter")  # the program ends with its last run()
        with program.group("quick"):
            for _ in range(2):
                program.add_node(lp.PyNode(_return))
        manager = lp.launch(program, launch_type="test_mt", test_case=self)
        manager.wait(labels_to_wait_for=["quick"])
        self.assertEqual({manager.status()[f"quick/{i}"]["state"] for i in range(2)}, {"finished"})
        self.assertEqual(server.dereference().ping(), "pong")  # the server still serves

    def test_return_on_first_completed(self):
        program = lp.Program("first_completed")
        program.add_node(lp.PyNode(lp.wait_for_stop), label="waiter")
        program.add_node(lp.PyNode(_return), label="worker")
        manager = lp.launch(program, launch_type="test_mt", test_case=self)
        manager.wait(return_on_first_completed=True)
        self.assertEqual(manager.status()["worker/0"]["state"], "finished")
        self.assertEqual(manager.status()["waiter/0"]["state"], "running")

    def test_a_failure_no_wait_raised_fails_the_test_at_cleanup(self):
        program = lp.Program("unnoticed")
        program.add_node(lp.PyNode(_fail), label="failure")
        manager = lp.launch(program, launch_type="test_mt")
        manager.wait(raise_error=False)
        with self.assertRaisesRegex(RuntimeError, "ValueError: Error"):
            manager.cleanup_after_test()

    def test_an_unknown_label_is_refused_by_name(self):
        program = lp.Program("typo")
        program.add_node(lp.PyNode(lp.wait_for_stop), label="waiter")
        manager = lp.launch(program, launch_type="test_mt", test_case=self)
        with self.assertRaisesRegex(ValueError, "no group 'waiters'.*groups: waiter"):
            manager.wait(["waiters"])
        with self.assertRaisesRegex(TypeError, r"pass \['waiter'\]"):
            manager.wait("waiter")

    def test_the_rest_of_running_is_reached_through_the_manager(self):
        program = lp.Program("running")
        program.add_node(lp.PyNode(lp.wait_for_stop), label="waiter")
        manager = lp.launch(program, launch_type="test_mt", test_case=self)
        self.assertEqual(manager.program_name, "running")
        manager.stop()
        self.assertEqual(manager.stop_reason, "stopped by the user")


class ProgramTest(unittest.TestCase):

    def test_get_all_nodes(self):
        program = lp.Program("test")
        nodes = [lp.PyNode(_return), lp.PyNode(_return)]
        program.add_node(nodes[0], label="foo")
        with program.group("bar"):
            program.add_node(nodes[1])
        colocation = lp.MultiThreadingColocation([lp.PyNode(_return), lp.PyNode(_return)])
        program.add_node(colocation, label="baz")
        self.assertCountEqual(program.get_all_nodes(), [*nodes, colocation])

    def test_a_node_added_twice_is_refused_naming_the_difference(self):
        program = lp.Program("twice")
        node = lp.PyNode(_return)
        program.add_node(node, label="foo")
        with self.assertRaisesRegex(ValueError, "added once in jaxdist.*Launchpad lets one object be added twice"):
            program.add_node(node, label="foo")


def _run_script(body: str, cwd) -> subprocess.CompletedProcess:
    """`body` as a script of its own, in `cwd` (where its launch makes its run directory)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(body)], capture_output=True, text=True, timeout=120,
                          cwd=cwd)


def test_a_local_launch_returns_at_once_and_the_interpreter_exits_once_the_program_is_over(tmp_path):
    done = _run_script("""
        import threading
        import jaxdist.compat.launchpad as lp

        released = threading.Event()

        def node():
            released.wait()
            print("node done", flush=True)

        program = lp.Program("at_exit")
        program.add_node(lp.PyNode(node), label="node")
        manager = lp.launch(program, launch_type="local_mt", terminal="current_terminal")
        print("launch returned", manager.status()["node/0"]["state"], flush=True)
        released.set()
    """, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.index("launch returned running") < done.stdout.index("node done"), done.stdout


def test_a_node_failure_no_wait_raised_ends_the_interpreter_with_status_1(tmp_path):
    done = _run_script("""
        import jaxdist.compat.launchpad as lp

        def node():
            raise ValueError("unnoticed")

        program = lp.Program("at_exit_failure")
        program.add_node(lp.PyNode(node), label="node")
        lp.launch(program, launch_type="local_mt")
    """, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "ValueError: unnoticed" in done.stderr
