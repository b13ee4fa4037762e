"""The compat CourierNode as Launchpad's tests use it: `courier_client_kwargs` reach the handles'
clients (a call past `call_timeout` fails), and an object with `set_courier_server` starts and
stops the node's server itself."""

from __future__ import annotations

import datetime
import threading
import time
import unittest

import jaxdist.compat.launchpad as lp
from jaxdist import courier


class Server:
    """Serves until it received one ping() and one call, then stops its own server."""

    def __init__(self) -> None:
        self._server = None
        self._has_ping = threading.Event()
        self._has_call = threading.Event()

    def ping(self) -> str:
        self._has_ping.set()
        return "pong"

    def ping_slow(self) -> str:
        time.sleep(1)
        return self.ping()

    def __call__(self) -> str:
        self._has_call.set()
        return "called"

    def set_courier_server(self, server) -> None:
        self._server = server

    def run(self) -> None:
        self._server.Start()
        self._has_ping.wait()
        self._has_call.wait()
        self._server.Stop()


class Echo:
    def echo(self, x):
        return x

    def slow(self) -> str:
        time.sleep(1)
        return "slow"


class CourierNodeTest(unittest.TestCase):

    def test_ping_pong_with_a_server_the_object_starts_and_stops(self):
        program = lp.Program("ping_pong")
        handle = program.add_node(lp.CourierNode(Server), label="server")
        manager = lp.launch(program, launch_type=lp.LaunchType.TEST_MULTI_THREADING, test_case=self)
        client = handle.dereference()
        self.assertNotIn("set_courier_server", client.methods())  # the protocol is not served
        self.assertEqual(client.ping(), "pong")
        self.assertEqual(client.futures().result(), "called")
        manager.wait()  # run() returned once it stopped its server
        self.assertEqual(manager.status()["server/0"]["state"], "finished")

    def test_calls_before_start_wait_for_it(self):
        class LateStarter:
            def set_courier_server(self, server) -> None:
                self._server = server

            def ping(self) -> str:
                return "pong"

            def run(self) -> None:
                time.sleep(0.3)
                self._server.Start()
                lp.wait_for_stop()
                self._server.Stop()

        program = lp.Program("late")
        handle = program.add_node(lp.CourierNode(LateStarter), label="late")
        lp.launch(program, launch_type="test_mt", test_case=self)
        self.assertEqual(handle.dereference().ping(), "pong")

    def test_courier_client_kwargs_reach_the_handles_clients(self):
        program = lp.Program("client_kwargs")
        node = lp.CourierNode(Echo, courier_client_kwargs={"call_timeout": datetime.timedelta(milliseconds=50)})
        handle = program.add_node(node, label="echo")
        lp.launch(program, launch_type="test_mt", test_case=self)
        client = handle.dereference()
        self.assertEqual(client.echo(3), 3)  # the kwargs went to the client, not to Echo()
        with self.assertRaisesRegex(courier.DeadlineExceededError, "no answer within 0.05 s"):
            client.slow()

    def test_set_client_kwargs_and_the_default_of_no_deadline(self):
        program = lp.Program("set_client_kwargs")
        handle = program.add_node(lp.CourierNode(Echo), label="echo")
        lp.launch(program, launch_type="test_mt", test_case=self)
        self.assertEqual(handle.dereference().slow(), "slow")
        handle.set_client_kwargs(call_timeout=0.05)
        with self.assertRaises(courier.DeadlineExceededError):
            handle.dereference().slow()

    def test_client_kwargs_jaxdist_has_no_use_for_are_refused_by_name(self):
        with self.assertRaisesRegex(TypeError, "compress=True.*does not compress.*call_timeout, wait_for_ready"):
            lp.CourierNode(Echo, courier_client_kwargs={"compress": True})
        node = lp.CourierNode(Echo, courier_client_kwargs={"compress": False, "wait_for_ready": False})
        handle = lp.Program("options").add_node(node, label="echo")
        self.assertEqual(handle.dereference(lambda name, **options: options),
                         {"timeout": None, "wait_for_ready": False})

    def test_server_kwargs_jaxdist_has_no_use_for_are_refused_by_name(self):
        with self.assertRaisesRegex(TypeError, r"courier_kwargs \['port'\].*no port or name.*thread_pool_size"):
            lp.CourierNode(Echo, courier_kwargs={"port": 8000})
        self.assertEqual(lp.CourierNode(Echo, courier_kwargs={"thread_pool_size": 2}).server_options,
                         {"thread_pool_size": 2})

    def test_start_and_stop_are_refused_out_of_order(self):
        server = courier.Server(None)
        try:
            control = lp.CourierServer(server.start(), Echo())
            with self.assertRaisesRegex(ValueError, "not started"):
                control.Stop()
            control.Start()
            with self.assertRaisesRegex(ValueError, "already started"):
                control.Start()
            self.assertTrue(control.has_started)
            control.Stop()
            control.Join()
        finally:
            server.stop()
