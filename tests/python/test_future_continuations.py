"""Completion without blocking (docs/api.md, "Completion without blocking"):
Future.on_complete, dlslime.wait_any / wait_all, and asyncio (`await future`,
`future.as_asyncio()`), on real TCP loopback transfers. Nothing here synchronises by
sleeping: threads signal Events, waits have deadlines."""

import asyncio
import sys
import threading

import pytest

import dlslime
from dlslime import StatusCode, TcpEndpoint
from conftest import Buffer, connect_pair, run_script

OK = 0
TIMEOUT = int(StatusCode.TIMEOUT)
OUT_OF_BOUNDS = int(StatusCode.OUT_OF_BOUNDS)
CANCELLED = int(StatusCode.CANCELLED)


@pytest.fixture
def pair(endpoint_pair):
    a, b = endpoint_pair
    connect_pair(a, b)
    return a, b


# --- on_complete ---------------------------------------------------------------------------


def test_on_complete_runs_once_on_a_library_thread_with_the_result(pair):
    a, b = pair
    inbox, msg = Buffer(64), Buffer(5, b"hello")
    recv = a.recv((inbox.addr, 0, 64))
    seen = []
    ran = threading.Event()

    def callback(fut):
        seen.append((threading.get_ident(), fut.status, fut.nbytes, inbox.bytes(0, fut.nbytes), fut.done()))
        ran.set()

    recv.on_complete(callback)
    assert not ran.is_set()  # nothing was sent yet
    assert b.send((msg.addr, 0, 5)).wait_for(10) == OK
    assert ran.wait(10)
    assert recv.wait_for(10) == OK
    assert len(seen) == 1
    thread, status, nbytes, data, done = seen[0]
    assert thread != threading.get_ident()
    assert (status, nbytes, data, done) == (OK, 5, b"hello", True)


def test_on_complete_after_the_op_ended_runs_at_once_on_this_thread(pair):
    a, b = pair
    buf = Buffer(8, b"x")
    inbox = Buffer(8)
    recv = a.recv((inbox.addr, 0, 8))
    assert b.send((buf.addr, 0, 8)).wait_for(10) == OK
    assert recv.wait_for(10) == OK
    calls = []
    recv.on_complete(lambda f: calls.append((threading.get_ident(), f.nbytes)))
    assert calls == [(threading.get_ident(), 8)]


def test_several_callbacks_run_in_registration_order(pair):
    a, b = pair
    inbox, msg = Buffer(8), Buffer(8, b"m")
    recv = a.recv((inbox.addr, 0, 8))
    order = []
    last = threading.Event()
    recv.on_complete(lambda f: order.append(1))
    recv.on_complete(lambda f: order.append(2))
    recv.on_complete(lambda f: (order.append(3), last.set()))
    assert b.send((msg.addr, 0, 8)).wait_for(10) == OK
    assert last.wait(10)
    assert order == [1, 2, 3]


def test_on_complete_needs_a_callable(pair):
    a, _ = pair
    inbox = Buffer(8)
    with pytest.raises(TypeError, match="callable"):
        a.recv((inbox.addr, 0, 8)).on_complete(42)


def test_an_exception_in_a_callback_is_reported_and_the_others_still_run(pair, monkeypatch):
    a, b = pair
    reported = []
    hook_ran = threading.Event()

    def hook(unraisable):
        reported.append((unraisable.exc_type, str(unraisable.exc_value), unraisable.object))
        hook_ran.set()

    monkeypatch.setattr(sys, "unraisablehook", hook)
    inbox, msg = Buffer(8), Buffer(8, b"e")
    recv = a.recv((inbox.addr, 0, 8))

    def broken(fut):
        raise ValueError("callback bug")

    after = threading.Event()
    recv.on_complete(broken)
    recv.on_complete(lambda f: after.set())
    assert b.send((msg.addr, 0, 8)).wait_for(10) == OK
    assert after.wait(10) and hook_ran.wait(10)
    assert reported == [(ValueError, "callback bug", broken)]
    # The I/O thread is fine: the endpoints go on moving bytes.
    recv2 = a.recv((inbox.addr, 0, 8))
    assert b.send((msg.addr, 0, 8)).wait_for(10) == OK
    assert recv2.wait_for(10) == OK
    # And a callback that raises at once (the op has ended) is reported, not raised.
    recv2.on_complete(broken)
    assert len(reported) == 2


def test_callbacks_in_a_process_that_exits_with_ops_pending(tmp_path):
    """A callback that raises on an I/O thread is printed; callbacks still registered when
    the interpreter exits (their ops end during teardown) neither run Python nor crash."""
    proc = run_script(tmp_path, """
        import ctypes, threading, dlslime
        a = dlslime.TcpEndpoint("127.0.0.1", 0)
        b = dlslime.TcpEndpoint("127.0.0.1", 0)
        a.connect(b.endpoint_info()); b.connect(a.endpoint_info())
        inbox, msg = ctypes.create_string_buffer(8), ctypes.create_string_buffer(b"12345678", 8)
        ran = threading.Event()
        def broken(f):
            ran.set()
            raise RuntimeError("raised in a callback")
        recv = a.recv((ctypes.addressof(inbox), 0, 8))
        recv.on_complete(broken)
        assert b.send((ctypes.addressof(msg), 0, 8)).wait_for(10) == 0
        assert ran.wait(10)
        pending = [a.recv((ctypes.addressof(inbox), 0, 8)) for _ in range(4)]
        for f in pending:
            f.on_complete(lambda f: print("late", f.status, flush=True))
        print("OK", flush=True)
    """)
    assert "raised in a callback" in proc.stderr


def test_callbacks_still_run_in_atexit_handlers_registered_after_import(tmp_path):
    proc = run_script(tmp_path, """
        import atexit, ctypes, threading, dlslime
        a = dlslime.TcpEndpoint("127.0.0.1", 0)
        inbox = ctypes.create_string_buffer(8)
        recv = a.recv((ctypes.addressof(inbox), 0, 8))
        ran = threading.Event()
        recv.on_complete(lambda f: (print("OK callback at exit", f.status, flush=True), ran.set()))
        def stop():  # runs before dlslime's own atexit hook (LIFO): Python still runs callbacks
            a.shutdown()  # cancels the recv
            assert ran.wait(10)
        atexit.register(stop)
        print("registered", flush=True)
    """)
    assert proc.stdout.strip().splitlines()[-1] == f"OK callback at exit {CANCELLED}"


def test_exiting_while_ops_complete_on_io_threads_does_not_crash(tmp_path):
    """Ops keep completing (callbacks on I/O threads taking the GIL) and a daemon thread keeps
    submitting and waiting while the main thread exits: no thread of ours may take the GIL
    once finalization began (CPython would end it mid-frame and the process would abort;
    before the exit gate this failed about one run in four)."""
    for _ in range(5):
        run_script(tmp_path, """
            import ctypes, threading, dlslime
            a = dlslime.TcpEndpoint("127.0.0.1", 0)
            b = dlslime.TcpEndpoint("127.0.0.1", 0)
            a.connect(b.endpoint_info()); b.connect(a.endpoint_info())
            inbox, msg = ctypes.create_string_buffer(64), ctypes.create_string_buffer(b"x" * 64, 64)
            counts = [0]
            started = threading.Event()
            def pump():
                while True:
                    r = a.recv((ctypes.addressof(inbox), 0, 64))
                    r.on_complete(lambda f: counts.__setitem__(0, counts[0] + 1))
                    b.send((ctypes.addressof(msg), 0, 64)).on_complete(lambda f: started.set())
                    r.wait_for(5)
            threading.Thread(target=pump, daemon=True).start()
            assert started.wait(10)
            print("OK", flush=True)
        """)


# --- wait_any / wait_all ---------------------------------------------------------------------


def test_wait_any_and_wait_all_on_a_real_transfer(pair):
    a, b = pair
    never, inbox, msg = Buffer(8), Buffer(16), Buffer(16, b"w")
    idle = b.recv((never.addr, 0, 8))  # a never sends: stays pending
    recv = a.recv((inbox.addr, 0, 16))
    assert dlslime.wait_any([idle, recv], timeout=0) is None
    assert dlslime.wait_any([idle, recv], timeout=0.05) is None
    send = b.send((msg.addr, 0, 16))
    assert dlslime.wait_any([idle, recv], timeout=10) == 1
    assert dlslime.wait_any([idle, recv]) == 1  # no limit; already done
    assert dlslime.wait_all([send, recv], timeout=10) is True
    assert dlslime.wait_all([send, recv]) is True
    assert dlslime.wait_all([send, recv, idle], timeout=0.05) is False
    assert not idle.done()
    # The lowest index among those done.
    assert dlslime.wait_any([idle, send, recv], timeout=1) == 1


def test_wait_any_sees_an_op_end_while_it_waits(pair):
    a, b = pair
    never, inbox, msg = Buffer(8), Buffer(8), Buffer(8, b"t")
    idle = b.recv((never.addr, 0, 8))
    recv = a.recv((inbox.addr, 0, 8))
    # The send comes from another thread once this one waits (the wait releases the GIL).
    sender = threading.Thread(target=lambda: b.send((msg.addr, 0, 8)).wait_for(10))
    sender.start()
    assert dlslime.wait_any([idle, recv], timeout=10) == 1
    sender.join(10)
    # An op failed by shutdown ends too: any status counts.
    b.shutdown()
    assert dlslime.wait_all([idle], timeout=10) is True
    assert idle.status == CANCELLED


def test_wait_any_and_wait_all_arguments():
    assert dlslime.wait_all([]) is True
    assert dlslime.wait_all([], timeout=0) is True
    with pytest.raises(ValueError, match="no futures"):
        dlslime.wait_any([])
    with pytest.raises(TypeError):
        dlslime.wait_any([1, 2])
    ep = TcpEndpoint("127.0.0.1", 0)
    try:
        inbox = Buffer(8)
        fut = ep.recv((inbox.addr, 0, 8))
        with pytest.raises(ValueError, match="timeout"):
            dlslime.wait_any([fut], timeout=-1)
        with pytest.raises(ValueError, match="timeout"):
            dlslime.wait_all([fut], timeout=float("nan"))
    finally:
        ep.shutdown()


# --- asyncio ---------------------------------------------------------------------------------


def test_await_a_future_in_asyncio_run(pair):
    a, b = pair
    inbox, msg = Buffer(32), Buffer(11, b"async bytes")

    async def main():
        recv = a.recv((inbox.addr, 0, 32))
        send = b.send((msg.addr, 0, 11))
        done = await recv
        assert done is not None and done.status == OK
        sent = await send
        return done.nbytes, sent.status

    nbytes, sent_status = asyncio.run(main())
    assert (nbytes, sent_status) == (11, OK)
    assert inbox.bytes(0, 11) == b"async bytes"


def test_as_asyncio_is_a_future_of_the_running_loop(pair):
    a, b = pair
    inbox, msg = Buffer(8), Buffer(8, b"z")

    async def main():
        recv = a.recv((inbox.addr, 0, 8))
        afut = recv.as_asyncio()
        assert isinstance(afut, asyncio.Future)
        assert afut.get_loop() is asyncio.get_running_loop()
        assert not afut.done()
        b.send((msg.addr, 0, 8))
        result = await asyncio.wait_for(afut, 10)
        # Several at once, gathered.
        recvs = [a.recv((inbox.addr, 0, 8)) for _ in range(3)]
        for _ in range(3):
            b.send((msg.addr, 0, 8))
        gathered = await asyncio.wait_for(asyncio.gather(*(r.as_asyncio() for r in recvs)), 10)
        return result, recv, gathered, recvs

    result, recv, gathered, recvs = asyncio.run(main())
    assert result.status == OK and result.nbytes == 8
    assert all(g.status == OK for g in gathered)
    assert [g.nbytes for g in gathered] == [8, 8, 8]


def test_as_asyncio_needs_a_running_loop(pair):
    a, _ = pair
    inbox = Buffer(8)
    with pytest.raises(RuntimeError):
        a.recv((inbox.addr, 0, 8)).as_asyncio()


def test_a_failed_op_raises_in_await(pair):
    a, b = pair
    buf_a, buf_b = Buffer(64, b"s"), Buffer(64)
    h_a = a.register_memory_region("a", buf_a.addr, 0, 64)
    b.register_memory_region("b", buf_b.addr, 0, 64)
    h_b = a.register_remote_memory_region("b", b.endpoint_info()["mr_info"]["b"])

    async def main():
        fut = a.write([(h_a, h_b, 60, 0, 8)])  # past the end of the remote region
        with pytest.raises(ValueError, match="OUT_OF_BOUNDS") as info:
            await fut
        assert info.value.status == OUT_OF_BOUNDS
        assert info.value.future.status == OUT_OF_BOUNDS
        assert fut.wait() == OUT_OF_BOUNDS  # wait() still returns the status
        # The same through as_asyncio(), and a good op on the same connection succeeds.
        with pytest.raises(ValueError):
            await a.write([(h_a, h_b, 60, 0, 8)]).as_asyncio()
        ok = await a.write([(h_a, h_b, 0, 0, 64)])
        return ok.status

    assert asyncio.run(main()) == OK
    assert buf_b.bytes() == b"s" * 64


def test_a_timed_out_recv_raises_timeout_error_in_await():
    ep = TcpEndpoint("127.0.0.1", 0, recv_timeout=0.2)
    peer = TcpEndpoint("127.0.0.1", 0)
    try:
        connect_pair(ep, peer)
        inbox = Buffer(8)

        async def main():
            with pytest.raises(TimeoutError) as info:
                await ep.recv((inbox.addr, 0, 8))
            return info.value.status

        assert asyncio.run(main()) == TIMEOUT
    finally:
        ep.shutdown()
        peer.shutdown()


def test_cancelling_the_asyncio_future_only_detaches(pair):
    a, b = pair
    inbox, never = Buffer(8), Buffer(8)
    errors = []

    async def main():
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda loop, context: errors.append(context))
        idle = a.recv((inbox.addr, 0, 8))
        afut = idle.as_asyncio()
        afut.cancel()
        with pytest.raises(asyncio.CancelledError):
            await afut
        # The op ends later (shutdown cancels it); its callbacks run in order, so once this
        # one has reached the loop, the detached one's has been handled too.
        ended = asyncio.Event()
        idle.on_complete(lambda f: loop.call_soon_threadsafe(ended.set))
        a.shutdown()
        await asyncio.wait_for(ended.wait(), 10)
        # The loop goes on: a new await on an op that ended raises its error.
        with pytest.raises(ConnectionError, match="CANCELLED"):
            await idle
        return idle.status

    assert asyncio.run(main()) == CANCELLED
    assert errors == []


def test_a_callback_whose_loop_has_closed_is_dropped(pair):
    a, b = pair
    inbox, msg = Buffer(8), Buffer(8, b"c")
    holder = {}

    async def main():
        holder["recv"] = a.recv((inbox.addr, 0, 8))
        holder["afut"] = holder["recv"].as_asyncio()

    asyncio.run(main())  # returns with the op still pending; the loop closes
    reported = []
    old_hook = sys.unraisablehook
    sys.unraisablehook = reported.append
    try:
        ran = threading.Event()
        holder["recv"].on_complete(lambda f: ran.set())
        assert b.send((msg.addr, 0, 8)).wait_for(10) == OK
        assert ran.wait(10)
    finally:
        sys.unraisablehook = old_hook
    assert reported == []
