"""asyncio for dlslime.Future: ``await future`` and ``future.as_asyncio()`` (docs/api.md,
"Completion without blocking").

Built on ``Future.on_complete``: the library calls back on its I/O thread, which only hands
the result to the event loop (``loop.call_soon_threadsafe``); the asyncio future is settled
on the loop's own thread. Nothing here blocks the loop or the I/O thread."""

import asyncio


def as_asyncio(future):
    """An ``asyncio.Future`` of the running loop for ``future`` (a ``dlslime.Future``).

    It resolves to ``future`` itself when the op succeeds (read ``nbytes``, ``imm_data()``
    from it), and raises the op's error when it fails: the exception class the library
    raises for that status code (docs/api.md, "Errors"), with ``.status`` (the code) and
    ``.future``. ``Future.wait()`` returns the status instead of raising; in a coroutine an
    exception is the idiom. Cancelling the asyncio future only detaches it: the op goes on,
    and its completion is then ignored. Raises RuntimeError without a running loop."""
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()

    def deliver(done):  # on a library thread, with the GIL: hand over to the loop, nothing more
        try:
            loop.call_soon_threadsafe(_settle, waiter, done)
        except RuntimeError:
            pass  # the loop is closed: nobody can await the result any more

    future.on_complete(deliver)
    return waiter


def _settle(waiter, done):
    if waiter.done():  # cancelled meanwhile
        return
    error = done._exception()
    if error is None:
        waiter.set_result(done)
    else:
        waiter.set_exception(error)
