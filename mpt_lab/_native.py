"""C kernels compiled once per machine and loaded with :mod:`ctypes`.

A few loops of this package run many times over hundreds of millions of values (the precision report histograms
every gradient of a GPT-2 step, ~7·10⁸ values) and no PyTorch op does them in one pass: counting the values of
a tensor per fine bin of :mod:`mpt_lab.histogram` needs the bin index of each value (leading zeros of bit
patterns) and a count per bin.  :func:`native_library` compiles such a kernel, written in C beside the Python code that
uses it, with the machine's C compiler (the one torch.compile also needs on a CPU), caches the shared library on
disk per source, compiler, flags and CPU, and loads it.  The caller checks the kernel against its PyTorch
reference before using it and falls back to PyTorch where there is no compiler or the check fails.

Compiled with ``-O3 -march=native`` (the vector instructions of this CPU: AVX-512 with its leading-zero count
on the Intel Xeon, AVX2 on the AMD EPYC), and without ``-march=native`` when the compiler refuses it.  The
compiler is ``$CC``, else ``cc``, ``gcc`` or ``clang`` on the ``PATH``.  The cache lives in
``$MPT_LAB_CACHE_DIR``, else ``$XDG_CACHE_HOME/mpt_lab``, else ``~/.cache/mpt_lab`` (a directory of the
system's temporary directory when that is not writable).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

__all__ = ["native_library", "NativeUnavailable"]

#: Flag sets tried in order; the first that compiles is used.
FLAG_SETS = (
    ("-O3", "-march=native", "-mprefer-vector-width=512"),
    ("-O3", "-march=native"),
    ("-O3",),
)

_lock = threading.Lock()
_loaded: dict = {}  # (name, source) -> CDLL


class NativeUnavailable(RuntimeError):
    """No C kernel on this machine: no C compiler, or none of :data:`FLAG_SETS` compiled the source (the message
    says which and why)."""


def _compiler() -> str:
    cc = os.environ.get("CC")
    if cc:
        found = shutil.which(cc)
        if found is None:
            raise NativeUnavailable(f"$CC names {cc!r}, which is not an executable on the PATH")
        return found
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found is not None:
            return found
    raise NativeUnavailable("no C compiler (cc, gcc or clang) on the PATH")


def _cpu_identity() -> str:
    """The CPU's model and instruction-set flags (``/proc/cpuinfo``), or what :mod:`platform` says elsewhere: a
    library built with ``-march=native`` is reused only on the same kind of CPU (a shared home directory may
    serve machines of several kinds)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags", "Features", "CPU part"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return f"{platform.machine()} {platform.processor()}"


def _cache_dir() -> Path:
    for d in (
        os.environ.get("MPT_LAB_CACHE_DIR"),
        os.path.join(os.environ["XDG_CACHE_HOME"], "mpt_lab") if os.environ.get("XDG_CACHE_HOME") else None,
        os.path.join(os.path.expanduser("~"), ".cache", "mpt_lab"),
    ):
        if not d:
            continue
        try:
            Path(d).mkdir(parents=True, exist_ok=True)
            if os.access(d, os.W_OK):
                return Path(d)
        except OSError:
            continue
    d = Path(tempfile.gettempdir()) / f"mpt_lab-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as err:
        raise NativeUnavailable(f"{cc} --version failed: {err}") from None


def _build(name: str, source: str, openmp: bool) -> Path:
    cc = _compiler()
    ident = "\n".join([source, cc, _version(cc), _cpu_identity(), sys.platform, platform.machine()])
    errors = []
    flag_sets = [(*f, "-fopenmp") for f in FLAG_SETS] + list(FLAG_SETS) if openmp else FLAG_SETS
    for flags in flag_sets:
        key = hashlib.sha256("\n".join([ident, *flags]).encode()).hexdigest()[:20]
        out = _cache_dir() / f"{name}-{key}.so"
        if out.exists():
            return out
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / f"{name}.c"
            src.write_text(source)
            part = Path(tmp) / f"{name}.so"
            cmd = [cc, *flags, "-shared", "-fPIC", str(src), "-o", str(part)]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            except (OSError, subprocess.SubprocessError) as err:
                errors.append(f"{' '.join(flags)}: {err}")
                continue
            if done.returncode != 0:
                errors.append(f"{' '.join(flags)}: {done.stderr.strip()[-300:]}")
                continue
            # written under a temporary name in the cache directory, then renamed: two processes building at
            # once each install a whole library
            fd, tmp_out = tempfile.mkstemp(prefix=f".{name}-", suffix=".so", dir=out.parent)
            os.close(fd)
            shutil.copyfile(part, tmp_out)
            os.replace(tmp_out, out)
            return out
    raise NativeUnavailable(f"{cc} did not compile {name}: " + " | ".join(errors))


def native_library(name: str, source: str, *, openmp: bool = False) -> ctypes.CDLL:
    """The shared library compiled from C ``source`` (cached on disk, and per process), loaded with
    :class:`ctypes.CDLL` (calls into it release the GIL).  ``name`` names the files.

    ``openmp``: compile with ``-fopenmp`` where the compiler can (else without: the source must compile both
    ways, ``#ifdef _OPENMP``).  The library then needs ``libgomp.so.1``, the soname of the OpenMP runtime that
    PyTorch's Linux wheels ship and load: the loader finds it already loaded, so the library's parallel regions
    run on torch's own intra-op threads (threads of a pool of one's own would share the cores with torch's, which
    spin for a while after each op).

    Raises
    ------
    NativeUnavailable
        No C compiler, or the source did not compile with any of :data:`FLAG_SETS`, or the library did not load.
    """
    key = (name, source, openmp)
    with _lock:
        lib = _loaded.get(key)
        if lib is None:
            path = _build(name, source, openmp)
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as err:
                raise NativeUnavailable(f"{path} did not load: {err}") from None
            _loaded[key] = lib
    return lib
