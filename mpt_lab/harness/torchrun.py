"""Start an experiment module under torchrun in a subprocess: progress streamed, errors shown, no rank left behind.

Used by experiments that run on several processes (``Experiment(..., launcher=…)``): outside torchrun, ``run``
calls such a launcher, which starts ``python -m torch.distributed.run --standalone --nproc_per_node N -m MODULE``,
streams what rank 0 prints, and returns when every rank has finished; a rank that fails makes torchrun exit
non-zero and its error output reaches the caller; a rank that hangs (waiting forever in a collective) is stopped
with the others when the time is up.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

__all__ = ["LaunchError", "in_torchrun", "run_torchrun", "PID_DIR_ENV", "write_pid"]

#: Each rank writes its pid into the folder this variable names (torchrun starts every rank in a session of its
#: own, so stopping torchrun's process group alone would leave them running).
PID_DIR_ENV = "MPT_LAB_PID_DIR"


class LaunchError(RuntimeError):
    """torchrun exited with a non-zero status; the message holds the ranks' error output."""


def in_torchrun() -> bool:
    """Whether this process is a rank started by torchrun (its environment names the rank, the world size and
    the rendezvous)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"))


def write_pid(rank: int) -> None:
    """Called by each rank at start-up: record its pid for :func:`run_torchrun`'s clean-up (no-op outside it)."""
    folder = os.environ.get(PID_DIR_ENV)
    if folder:
        Path(folder, f"rank{rank}.pid").write_text(str(os.getpid()))


def tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def stop(proc: subprocess.Popen, pid_dir: Path, grace: float = 5.0) -> None:
    """Stop torchrun and every rank it started: SIGTERM (torchrun's agent then stops its ranks), and after
    ``grace`` seconds SIGKILL to torchrun's process group and to each rank's own (torchrun starts every rank in
    a session of its own, so torchrun's group alone would leave them running)."""

    def ranks():
        pids = []
        for f in pid_dir.glob("rank*.pid"):
            try:
                pids.append(int(f.read_text()))
            except (OSError, ValueError):
                pass
        return pids

    def signal_all(sig):
        for pgid in [proc.pid, *ranks()]:
            try:
                if hasattr(os, "killpg"):
                    os.killpg(pgid, sig)
                elif pgid == proc.pid:  # pragma: no cover (Windows)
                    proc.kill()
            except (ProcessLookupError, PermissionError):
                pass

    signal_all(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    signal_all(getattr(signal, "SIGKILL", signal.SIGTERM))
    proc.wait()


def run_torchrun(
    module_args: list,
    *,
    nproc: int,
    timeout: float,
    env: dict,
    pid_dir: Path,
    err: IO[str],
    echo: Callable[[str], object],
    keep: Callable[[str], bool] = lambda line: True,
) -> int:
    """Run ``torchrun --standalone --nproc_per_node nproc -m …`` (``module_args``: the module and its
    arguments) with ``env`` (ranks write their pids into ``pid_dir``, or ``env[PID_DIR_ENV]`` when it is set); echo each line rank 0 prints that ``keep`` accepts; write the ranks' error output to
    the open file ``err``.  Returns torchrun's exit status.

    Raises TimeoutError (every rank stopped; the message ends with their last error lines) after ``timeout``
    seconds, and stops every rank on any other interruption (KeyboardInterrupt) before re-raising.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), *module_args]
    pid_dir = Path(env.get(PID_DIR_ENV, pid_dir))  # a caller (a test) may name the folder itself
    pid_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=err,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**env, PID_DIR_ENV: str(pid_dir)},
        start_new_session=True,
    )

    def stream():
        for line in proc.stdout:
            line = line.rstrip("\n")
            if keep(line):
                echo(line)

    reader = threading.Thread(target=stream, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(proc, pid_dir)
        reader.join(timeout=5)
        err.seek(0)
        raise TimeoutError(
            f"the {nproc} ranks did not finish within {timeout:g} s and were stopped; the last "
            f"lines of their error output:\n{tail(err.read())}"
        ) from None
    except BaseException:  # KeyboardInterrupt: leave no rank behind
        stop(proc, pid_dir)
        raise
    reader.join(timeout=5)
    return rc
