"""An endpoint in another process, for the conformance suite (test_conformance.py).

A process cannot open its own CUDA IPC handles, so the two endpoints of an nvlink pair in one
process take a shortcut (the published pointer) that users' two processes never take; and the
killed-peer test needs a peer it can SIGKILL. `PeerEndpoint.start()` spawns a child that owns
one endpoint, its buffers and its futures, and does what the test process asks over a Pipe.

In the test process a PeerEndpoint answers the same calls as a local endpoint (any method or
attribute is forwarded: `register_memory_region`, `endpoint_info`, `connect`, `recv`, ...),
and the buffers and futures it hands back are proxies with the same interface as local ones
(`ptr`, `nbytes`, `read`, `write`; `wait_for`, `status`, `message`, `nbytes`), so a test body
does not know which side lives where. An exception in the peer is raised here with its type
when it is a builtin one (ValueError, KeyError, ConnectionError, NotImplementedError...),
else as RuntimeError naming it.
"""

import builtins
import itertools
import multiprocessing
import os
import signal

import dlslime
from dlslime import testing

# Longer than any single wait a test asks the peer to run (20 s per op), so a slow answer
# is the peer's failure, reported as such, and never a hang.
REPLY_DEADLINE = 120

_PLAIN = (type(None), bool, int, float, str, bytes, list, tuple, dict)


def _serve(conn, transport, options):
    """The child: one endpoint (object 0), the buffers it registers, the futures it returns."""
    try:
        ep = dlslime.make_endpoint(transport, **options)
    except Exception as e:  # noqa: BLE001: reported to the test process, which raises it
        conn.send(("error", type(e).__name__, str(e)))
        return
    objects = {0: ep}
    ids = itertools.count(1)

    def reply(value):
        if isinstance(value, _PLAIN):
            return ("value", value)
        oid = next(ids)
        objects[oid] = value
        return ("object", oid)

    conn.send(("ready", os.getpid()))
    while True:
        try:
            request = conn.recv()
        except EOFError:  # the test process is gone
            break
        kind = request[0]
        if kind == "exit":
            break
        try:
            if kind == "buffer":  # memory this transport registers: host or device by capability
                answer = reply(testing.buffer_for(ep.capabilities(), request[1]))
            elif kind == "get":
                value = getattr(objects[request[1]], request[2])
                answer = ("method",) if callable(value) else reply(value)
            else:  # "call"
                _, oid, name, args, kwargs = request
                answer = reply(getattr(objects[oid], name)(*args, **kwargs))
        except Exception as e:  # noqa: BLE001: the test process raises it
            answer = ("error", type(e).__name__, str(e))
        conn.send(answer)
    ep.shutdown()


def _raise(type_name, message):
    exc = getattr(builtins, type_name, None)
    if isinstance(exc, type) and issubclass(exc, Exception):
        raise exc(message)
    raise RuntimeError(f"{type_name} in the peer process: {message}")


class _Remote:
    """An object that lives in the peer process: attribute reads and method calls go there."""

    def __init__(self, peer, oid):
        self._peer, self._oid = peer, oid

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        answer = self._peer._ask(("get", self._oid, name), name)
        if answer is not _METHOD:
            return answer
        return lambda *args, **kwargs: self._peer._ask(("call", self._oid, name, args, kwargs), name)


_METHOD = object()


class PeerEndpoint(_Remote):
    """An endpoint of `transport` in a spawned child process (see the module docstring)."""

    def __init__(self, conn, proc, pid):
        super().__init__(self, 0)
        self._conn, self._proc, self.pid = conn, proc, pid

    @classmethod
    def start(cls, transport, options):
        ctx = multiprocessing.get_context("spawn")  # never fork: this process has I/O threads
        conn, child = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(child, transport, options), daemon=True)
        proc.start()
        child.close()
        if not conn.poll(60):
            proc.kill()
            raise RuntimeError("the peer process did not start within 60 s")
        first = conn.recv()
        if first[0] != "ready":
            proc.join(10)
            _raise(*first[1:])
        return cls(conn, proc, first[1])

    def buffer(self, nbytes):
        """Zeroed memory of nbytes in the peer, of the kind its endpoint registers."""
        return self._ask(("buffer", nbytes), "buffer")

    def _ask(self, request, what):
        self._conn.send(request)
        if not self._conn.poll(REPLY_DEADLINE):
            raise TimeoutError(f"the peer process did not answer {what} within {REPLY_DEADLINE} s")
        answer = self._conn.recv()
        if answer[0] == "value":
            return answer[1]
        if answer[0] == "object":
            return _Remote(self, answer[1])
        if answer[0] == "method":
            return _METHOD
        _raise(*answer[1:])

    def kill(self):
        """SIGKILL, and waits until the kernel says it is gone."""
        os.kill(self.pid, signal.SIGKILL)
        self._proc.join(30)

    def close(self):
        """Ends the peer (its endpoint shuts down); kills it if it does not leave in time."""
        if self._proc.is_alive():
            try:
                self._conn.send(("exit",))
            except OSError:
                pass
            self._proc.join(30)
        if self._proc.is_alive():
            self.kill()
        self._conn.close()
