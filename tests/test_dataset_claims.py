"""Claims on plan positions and hand-offs between siblings (``wids.dataset.claims``).

Two :class:`Claims` objects stand for two DataLoader workers: the names they bind live in the
machine's abstract socket namespace, shared by every process (and object) of it, so claims
made by one are seen by the other exactly as between processes. Between real worker
processes: ``tests/test_dataset_plan.py::test_out_of_order_loader_reads_no_batch_twice``.
"""

from __future__ import annotations

import os
import socket
import threading

import pytest

from wids.dataset.claims import Claims, decode, encode, shared
from wids.dataset.readers import Block

pytestmark = pytest.mark.skipif(not shared(), reason="abstract Unix sockets: Linux only")

BLOCKS = {Block(0, 0, 5): b"hello", Block(2, 1024, 1030): b"world!", Block(1, 7, 7): b""}


@pytest.fixture
def siblings():
    key = os.urandom(8).hex()  # a dataset of this test only
    a, b = Claims(key, timeout=10), Claims(key, timeout=10)
    yield a, b
    a.close()
    b.close()


def test_frames_round_trip_and_reject_garbage():
    assert decode(b"".join(encode(BLOCKS))) == BLOCKS
    assert decode(b"".join(encode({}))) == {}
    frame = b"".join(encode(BLOCKS))
    for bad in (b"", frame[:-1], frame + b"x", b"\xff" * 8, frame[:20]):
        with pytest.raises(ValueError):
            decode(bad)


def test_a_position_is_claimed_once(siblings):
    a, b = siblings
    assert a.claim(1, 64)
    assert not b.claim(1, 64) and not a.claim(1, 64)
    assert b.claim(1, 96)  # another position
    assert b.claim(2, 64)  # another iteration
    assert Claims("other-dataset").claim(1, 64)  # another dataset


def test_the_sibling_given_a_started_batch_takes_its_bytes(siblings):
    a, b = siblings
    assert a.claim(5, 32) and a.start(5, 32)
    got: list = []
    taker = threading.Thread(target=lambda: got.append(b.take(5, 32)))
    taker.start()  # waits: the reads are out
    a.serve(5, 32, BLOCKS)
    taker.join(10)
    assert got == [BLOCKS]
    assert a.served(5, 32) and a.sent == 1 and b.received == 1
    assert b.take(5, 32) is None  # handed over once


def test_a_batch_not_started_is_read_by_the_sibling_given_it(siblings):
    a, b = siblings
    assert a.claim(5, 32)
    assert b.take(5, 32) is None  # b reads it itself...
    assert not a.start(5, 32)  # ... and a does not


def test_an_unclaimed_batch_is_read_once(siblings):
    a, b = siblings
    assert b.take(5, 40) is None  # read directly; the name is kept
    assert not a.claim(5, 40)  # nobody reads it ahead afterwards


def test_a_failed_read_is_read_again_by_the_sibling(siblings):
    a, b = siblings
    assert a.claim(5, 48) and a.start(5, 48)
    a.serve(5, 48, None)
    assert b.take(5, 48) is None


def test_a_sibling_that_goes_away_is_not_waited_for(siblings):
    a, b = siblings
    assert a.claim(5, 56) and a.start(5, 56)
    got: list = []
    taker = threading.Thread(target=lambda: got.append(b.take(5, 56)))
    taker.start()
    a.close()  # a process that ends: the kernel drops its names and connections
    taker.join(10)
    assert got == [None] and not taker.is_alive()


def test_names_are_released_behind_and_on_close(siblings):
    a, b = siblings
    for position in (0, 8, 16):
        assert a.claim(9, position)
    assert b.take(9, 24) is None  # a tombstone
    a.release_where(9, 16)
    b.release_where(9, 16)
    assert b.claim(9, 0) and b.claim(9, 8)
    assert not b.claim(9, 16) and not a.claim(9, 24)
    b.close()
    assert a.claim(9, 24) and a.claim(9, 8)
    assert not b.claim(9, 40)  # closed: claims nothing


def test_tombstones_are_bounded():
    key = os.urandom(8).hex()
    a, b = Claims(key, keep=4), Claims(key)
    try:
        for position in range(10):
            assert a.take(1, position) is None
        assert b.claim(1, 0)  # the oldest released
        assert not b.claim(1, 9)
    finally:
        a.close()
        b.close()


IMPOSTOR = """
import os, socket, sys
name, frame = sys.argv[1].encode(), bytes.fromhex(sys.argv[2])
os.setuid(65534)  # nobody
claim, started = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
claim.bind(b"\\0" + name)
started.bind(b"\\0" + name + b"-r")
claim.listen(1)
print("ready", flush=True)
conn, _ = claim.accept()
conn.sendall(frame)
conn.close()
"""


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a process as another user")
def test_another_user_is_not_believed(siblings):
    """A process of another user claiming a position (names are visible machine-wide): its
    bytes are refused (``SO_PEERCRED``), and the batch is read directly."""
    import subprocess
    import sys

    a, _ = siblings
    name = f"wids-ahead-{a.key}-{5:x}-{72}"
    frame = b"".join(encode({Block(0, 0, 5): b"wrong"})).hex()
    proc = subprocess.Popen(
        [sys.executable, "-c", IMPOSTOR, name, frame], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        assert a.take(5, 72) is None
    finally:
        proc.kill()
        proc.wait()


def test_the_peer_check_accepts_this_user():
    from wids.dataset.claims import _same_user

    left, right = socket.socketpair(socket.AF_UNIX)
    with left, right:
        assert _same_user(left)
