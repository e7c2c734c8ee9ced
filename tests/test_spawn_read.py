"""read_until, the launch's wait for a sandbox's first words: it works on a descriptor
past FD_SETSIZE (1024), as a server holding hundreds of agents has; select() could not."""

from __future__ import annotations

import os
import resource
import time

import pytest

from guilds.sandbox._spawn import read_until

HIGH_FD = 2000


@pytest.fixture
def high_pipe():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= HIGH_FD:
        pytest.skip(f"the descriptor limit ({hard}) is below {HIGH_FD}")
    if soft != resource.RLIM_INFINITY and soft <= HIGH_FD:
        resource.setrlimit(resource.RLIMIT_NOFILE, (HIGH_FD + 1, hard))
    read, write = os.pipe()
    os.dup2(read, HIGH_FD)
    os.close(read)
    try:
        yield HIGH_FD, write
    finally:
        os.close(HIGH_FD)
        os.close(write)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_it_reads_up_to_the_stop_on_a_descriptor_past_fd_setsize(high_pipe):
    fd, write = high_pipe
    os.write(write, b"ready\n")
    assert read_until(fd, timeout=5, stop=b"ready") == b"ready\n"


def test_it_gives_up_at_its_timeout_on_a_descriptor_past_fd_setsize(high_pipe):
    fd, _ = high_pipe
    began = time.monotonic()
    assert read_until(fd, timeout=0.3, stop=b"ready") == b""
    assert 0.25 < time.monotonic() - began < 3
