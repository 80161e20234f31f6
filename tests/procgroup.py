"""Run a command that starts processes of its own (torchrun, Lightning), killing all of them on
a timeout: ``subprocess.run(timeout=)`` kills only the direct child, and a hung rank left
behind keeps its ports and files and slows every later test."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any


def run_group(cmd: list[str], timeout: float, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmd, capture_output=True, text=True)`` in a new session; on a timeout
    the whole session is killed and ``TimeoutExpired`` raised with what was printed."""
    with subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **kwargs,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err) from None
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
