"""mpt_lab.profile(), mpt_lab.device and mpt_lab.bench."""

import json
import time

import pytest
import torch

import mpt_lab
from mpt_lab import bench, device


def test_profile_from_environment(monkeypatch):
    for p in ("quick", "cpu", "full", " QUICK "):
        monkeypatch.setenv("MPT_LAB_PROFILE", p)
        assert mpt_lab.profile() == p.strip().lower()


def test_profile_default_depends_on_cuda(monkeypatch):
    monkeypatch.delenv("MPT_LAB_PROFILE", raising=False)
    assert mpt_lab.profile() == ("full" if torch.cuda.is_available() else "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert mpt_lab.profile() == "full"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert mpt_lab.profile() == "cpu"


def test_profile_rejects_unknown(monkeypatch):
    monkeypatch.setenv("MPT_LAB_PROFILE", "fast")
    with pytest.raises(ValueError, match="quick"):
        mpt_lab.profile()


def test_device_and_description():
    d = device.default_device()
    assert d.type == ("cuda" if torch.cuda.is_available() else "cpu")
    text = device.describe("cpu")
    assert text.startswith("CPU: ") and "\n" not in text
    assert device.describe() == device.describe(d)
    with pytest.raises(TypeError, match="device"):
        device.describe(3)


def test_provenance_is_json_and_complete():
    p = device.provenance(command="python -m x --profile quick", config={"n": 3})
    s = json.dumps(p)
    back = json.loads(s)
    assert back["command"] == "python -m x --profile quick"
    assert back["config"] == {"n": 3}
    assert back["versions"]["torch"] == torch.__version__
    assert back["device"].startswith(("CPU", "NVIDIA")) or back["device"]
    assert back["date"].endswith("+00:00")


def test_time_call_measures_and_validates():
    t = bench.time_call(lambda: time.sleep(0.01), repeat=3, warmup=1)
    assert len(t.times) == 3 and t.warmup == 1
    assert 0.009 <= t.min <= t.median <= t.max  # sleep() sleeps at least that long (no upper bound)
    d = t.as_dict()
    assert d["median"] == t.median and len(d["times"]) == 3
    calls = []
    bench.time_call(lambda: calls.append(1), repeat=4, warmup=2)
    assert len(calls) == 6
    with pytest.raises(TypeError):
        bench.time_call(3)
    with pytest.raises(ValueError):
        bench.time_call(lambda: None, repeat=0)
    with pytest.raises(ValueError):
        bench.time_call(lambda: None, warmup=-1)


def test_device_resolve_synchronize_and_cpu_flags():
    assert device.resolve("auto") == device.default_device() == device.resolve(None)
    assert device.resolve("cpu") == torch.device("cpu") and device.resolve(torch.device("cpu")).type == "cpu"
    with pytest.raises(ValueError, match="device"):
        device.resolve("gpu")
    with pytest.raises(TypeError, match="device"):
        device.resolve(3)
    device.synchronize("cpu")
    device.synchronize(None)
    flags = device.cpu_flags()
    assert isinstance(flags, list) and set(flags) <= set(device.CPU_FEATURES)


def test_no_tracked_file_names_the_source_documents_by_file_name():
    """The book cites works (the paper, the DGL User Guide, ...), never "seed 00N": not in pages (test_book), and
    not in the package, notebooks, benchmarks or saved results, whose text the chapters print."""
    import re
    import subprocess

    from conftest import ROOT

    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    pattern = re.compile(r"[Ss]eed 0\d\d")
    hits = [
        f
        for f in files
        if not f.startswith("tests/")
        and (ROOT / f).is_file()
        and pattern.search((ROOT / f).read_text(encoding="utf-8", errors="ignore"))
    ]
    assert not hits, hits


def _public_objects():
    """(qualified name, object) of every public function and class of every mpt_lab module (its ``__all__``, else
    its public names defined there), and of every public method and property those classes define."""
    import importlib
    import inspect
    import pkgutil

    seen, out = set(), []
    for info in pkgutil.walk_packages(mpt_lab.__path__, "mpt_lab."):
        module = importlib.import_module(info.name)
        names = getattr(module, "__all__", None)
        if names is None:
            names = [
                k
                for k, v in vars(module).items()
                if not k.startswith("_")
                and (inspect.isfunction(v) or inspect.isclass(v))
                and v.__module__ == module.__name__
            ]
        for name in names:
            obj = getattr(module, name)
            if not (inspect.isfunction(obj) or inspect.isclass(obj)) or not obj.__module__.startswith("mpt_lab"):
                continue  # constants; torch's classes re-exported
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            out.append((f"{obj.__module__}.{obj.__qualname__}", obj))
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if attr.startswith("_"):
                        continue
                    if isinstance(member, property):
                        out.append((f"{obj.__module__}.{obj.__qualname__}.{attr}", member))
                    elif inspect.isfunction(member) or isinstance(member, (staticmethod, classmethod)):
                        out.append((f"{obj.__module__}.{obj.__qualname__}.{attr}", getattr(obj, attr)))
    return out


def test_help_shows_every_public_docstring():
    """Issue 29, item 6: help() shows a docstring for every public function, class, method and property of the
    package (a docstring built with ``+`` at import is no docstring: __doc__ was None for accumulation.dot)."""
    import inspect
    import pydoc

    objects = _public_objects()
    assert len(objects) > 500
    missing = []
    for name, obj in objects:
        doc = obj.__doc__ if isinstance(obj, property) else inspect.getdoc(obj)
        if inspect.isclass(obj):
            own = vars(obj).get("__doc__") or ""
            if own.startswith(obj.__name__ + "("):  # a dataclass's generated signature, not a docstring
                doc = None
        if not (doc and doc.strip()):
            missing.append(name)
    assert not missing, missing
    from mpt_lab import accumulation

    for fn in (accumulation.dot, accumulation.matmul):
        text = pydoc.render_doc(fn, renderer=pydoc.plaintext)
        assert fn.__doc__ and "accumulator : FloatFormat or str" in text and "Returns" in text
        assert "_KEYWORDS" not in text and "Raises" in text
