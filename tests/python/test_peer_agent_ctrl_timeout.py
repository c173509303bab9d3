"""PeerAgent(ctrl_timeout=...) (issue 27): the deadline of each control-plane request, in
seconds like every timeout of the Python API. A NanoCtrl that accepts the connection and
never answers fails the agent within it, not after the 10 s default."""

import math
import socket
import threading
import time

import pytest

from dlslime import PeerAgent
from dlslime.nanoctrl import NanoCtrlClient


@pytest.fixture
def silent_ctrl():
    """The URL of a "NanoCtrl" that never answers: a listening socket on 127.0.0.1 that never
    accepts. The kernel completes the client's connection (it waits in the backlog) and
    takes its request, so the client waits for a reply that never comes."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    yield listener, f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


@pytest.mark.parametrize("value", [0, 0.0, -1, -0.5, math.nan, -10**400])
def test_ctrl_timeout_not_positive_is_value_error(value):
    # Checked before anything is dialed: the URL is never used.
    with pytest.raises(ValueError, match="ctrl_timeout"):
        PeerAgent(ctrl_url="http://127.0.0.1:9", ctrl_timeout=value)


@pytest.mark.parametrize("value", ["1", b"1", [1], {}])
def test_ctrl_timeout_not_a_number_is_type_error(value):
    with pytest.raises(TypeError, match="ctrl_timeout"):
        PeerAgent(ctrl_url="http://127.0.0.1:9", ctrl_timeout=value)


def test_silent_control_plane_times_out_within_ctrl_timeout(silent_ctrl, unique):
    _, url = silent_ctrl
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="no reply within the client timeout"):
        PeerAgent(ctrl_url=url, alias=f"ct_{unique}", ctrl_timeout=0.5)
    elapsed = time.monotonic() - started
    # It waited for the deadline (not some other, immediate failure), and not the default 10 s.
    assert 0.4 <= elapsed < 5.0, elapsed


def agent_with(url, seconds):
    PeerAgent(ctrl_url=url, ctrl_timeout=seconds).shutdown()


def client_with(url, seconds):
    NanoCtrlClient(url, timeout=seconds).healthz()


@pytest.mark.parametrize("value", [4294967.297, math.inf])
@pytest.mark.parametrize("request_with", [agent_with, client_with])
def test_huge_ctrl_timeout_waits_instead_of_failing_at_once(silent_ctrl, value, request_with):
    """A deadline past poll()'s int of milliseconds (49.7 days + 1 ms) used to wrap to 1 ms:
    the request failed at once with ConnectionError ("is NanoCtrl running?"). Now it waits,
    and fails when the connection is reset (the listener closed)."""
    listener, url = silent_ctrl
    outcome = []

    def make():
        try:
            request_with(url, value)
            outcome.append(None)
        except Exception as e:  # noqa: BLE001 - the test looks at which one
            outcome.append(e)

    t = threading.Thread(target=make, daemon=True)
    t.start()
    # The wrapped deadline failed within milliseconds; a second is far past it.
    t.join(1.0)
    assert t.is_alive() and not outcome, outcome
    listener.close()  # resets the connection waiting in its backlog
    t.join(10.0)
    assert not t.is_alive(), "the request did not fail after its connection was reset"
    assert isinstance(outcome[0], ConnectionError), outcome


def test_ctrl_timeout_with_a_live_control_plane(ctrl_url, unique):
    """A valid ctrl_timeout (int or float) makes a working agent."""
    for i, value in enumerate((2, 0.75)):
        with PeerAgent(ctrl_url=ctrl_url, alias=f"ct_ok_{unique}_{i}", ctrl_timeout=value) as a:
            assert a.alias in a.list_agents()
