"""The Python client against `redquorum serve` and real nodes (run by cli/tests/serve.rs).

Environment: REDQUORUM_SERVE_URLS (comma-separated server URLs), REDQUORUM_RESOURCE
(host:port of a plain Redis server used as the fenced resource), REDQUORUM_FENCED_SET_LUA
(a file holding redquorum's fenced-set script).
"""

import os
import socket
import threading
import unittest

import redquorum


def resp(*args):
    """One RESP command."""
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


def read_reply(f):
    """One RESP reply (integers, bulk and simple strings, arrays, errors)."""
    line = f.readline()
    kind, rest = line[:1], line[1:-2]
    if kind == b"-":
        raise RuntimeError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"+":
        return rest.decode()
    if kind == b"$":
        n = int(rest)
        return None if n < 0 else f.read(n + 2)[:-2].decode()
    if kind == b"*":
        return [read_reply(f) for _ in range(int(rest))]
    raise RuntimeError("unexpected reply %r" % line)


class Resource:
    """The fenced resource: a Redis key written only through the fenced-set script."""

    def __init__(self, address, script):
        host, port = address.rsplit(":", 1)
        self.address = (host, int(port))
        self.script = script

    def command(self, *args):
        with socket.create_connection(self.address, timeout=10) as s:
            s.sendall(resp(*args))
            return read_reply(s.makefile("rb"))

    def fenced_set(self, key, token, value):
        """Whether the write with `token` was applied (a newer token refuses it)."""
        applied, _ = self.command("EVAL", self.script, 2, key, key + ":fence", token, value)
        return applied == 1


class PythonClient(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        urls = os.environ["REDQUORUM_SERVE_URLS"].split(",")
        cls.clients = [redquorum.Client(u) for u in urls]
        with open(os.environ["REDQUORUM_FENCED_SET_LUA"]) as f:
            cls.resource = Resource(os.environ["REDQUORUM_RESOURCE"], f.read())

    def test_ids_are_unique_and_increasing_across_servers(self):
        last = 0
        for i in range(10):
            ids = self.clients[i % len(self.clients)].next_ids("py-orders", count=3)
            self.assertEqual(len(ids), 3)
            self.assertEqual(ids, list(range(ids[0], ids[0] + 3)))
            self.assertGreater(ids[0], last, "IDs went back across servers")
            last = ids[-1]

    def test_a_period_runs_once_across_three_callers(self):
        ran, tokens, lock = [], [], threading.Lock()

        def caller(i):
            client = self.clients[i % len(self.clients)]
            run = client.begin_period("py-nightly", "2026-11-27", ttl="3s", wait="15s")
            if run.due:
                with lock:
                    ran.append(i)
                threading.Event().wait(0.3)  # the work
                run.complete()
            with lock:
                tokens.append(run.token)

        threads = [threading.Thread(target=caller, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        self.assertEqual(len(ran), 1, "the period ran %d times" % len(ran))
        self.assertEqual(len(set(tokens)), 1, "callers saw different runs: %r" % tokens)

    def test_a_lock_fences_a_late_write(self):
        client = self.clients[0]
        with client.lock("py-account", ttl="2s") as first:
            self.assertTrue(self.resource.fenced_set("py-balance", first.token, "100"))
            held = None
            try:
                client.lock("py-account", ttl="2s")
            except redquorum.Error as e:
                held = e
            self.assertIsNotNone(held, "a second caller got the held lock")
            self.assertEqual(held.code, "held")
        # The first holder released; a new holder writes with a higher token ...
        with client.lock("py-account", ttl="2s", wait="5s") as second:
            self.assertGreater(second.token, first.token)
            self.assertTrue(self.resource.fenced_set("py-balance", second.token, "200"))
        # ... and the first holder's late write is refused.
        self.assertFalse(self.resource.fenced_set("py-balance", first.token, "stale"))
        self.assertEqual(self.resource.command("GET", "py-balance"), "200")

    def test_bad_input_is_an_error_naming_the_field(self):
        with self.assertRaises(redquorum.Error) as caught:
            self.clients[0].next_ids("py-orders", count=0)
        self.assertEqual((caught.exception.status, caught.exception.field), (400, "count"))


if __name__ == "__main__":
    unittest.main()
