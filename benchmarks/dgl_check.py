"""What actually happens on this machine when DGL is installed beside the book's PyTorch and used in float16.

The Deep Graph Library's own mixed-precision chapter (DGL User Guide, chapter 8) runs its examples
on a GPU.  Chapter 9 of the book reproduces them with PyTorch Geometric and plain PyTorch, because DGL does
not run with the PyTorch this book pins.  This script records that fact instead of asserting it: for each DGL
version it

1. creates a throw-away virtual environment under ``/tmp`` (removed afterwards) whose ``site-packages`` holds a
   ``.pth`` file pointing at *this* interpreter's ``site-packages``, so that DGL sees the book's torch and pip
   counts torch as already installed (``python -m venv --system-site-packages`` would expose the base
   interpreter's packages, which hold no torch; a dry run, recorded as ``would_install``, checks that pip does
   not pull another torch — if it would, the install uses ``--no-deps`` and the result says so);
2. ``pip install dgl==VERSION`` and records pip's exit status;
3. runs ``import dgl`` in that environment; when the import fails for a missing Python module that a pip
   install can supply (:data:`FIXES`, e.g. DGL 2.1.0 needs ``torchdata.datapipes``, removed in torchdata 0.10,
   and imports ``pandas`` and ``pydantic`` without declaring them), installs it and tries again, recording
   every attempt;
4. once ``import dgl`` works, runs the guide's four examples on the CPU (``dgl.rand_graph(30, 100)``, 16-dim
   float16 node features, float16 edge weights: built-in ``u_mul_e``/``sum`` and ``u_dot_v``, then the
   user-defined message/reduce/edge functions), and the built-ins again in bfloat16 and float32 as controls.

Every outcome is the exception's type and text as raised (stack-trace lines of DGL's C++ errors, which start
with ``[bt]``, are dropped), or the dtype of the result.

    python benchmarks/dgl_check.py --profile cpu --out book/results/dgl_check_cpu.json

Needs the pip registry (a few downloads); about a minute.  Run by the experiment runner
(:mod:`mpt_lab.harness.benchmark`): the JSON records the configuration, the provenance (command, device,
versions, date), the method and each version's record.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from mpt_lab.harness.benchmark import Benchmark
from mpt_lab.harness.runner import ExperimentConfig, ExperimentResult, Run, run_main

#: The DGL versions checked: the newest wheel on the registry for this Python, and the last 1.x release.
VERSIONS = ("2.1.0", "1.1.3")

#: Missing module (as named by ModuleNotFoundError) → the pip requirement that supplies it.
FIXES = {"torchdata.datapipes": "torchdata==0.9.0", "pandas": "pandas", "pydantic": "pydantic", "yaml": "pyyaml"}

#: Run inside the throw-away environment; prints one JSON object.
PROBE = r"""
import json, sys, traceback
out = {}
def err(e):
    lines = [l for l in str(e).splitlines() if not l.lstrip().startswith("[bt]") and l.strip() != "Stack trace:"]
    return {"ok": False, "exception": type(e).__name__, "message": "\n".join(lines).strip(),
            "missing_module": getattr(e, "name", None) if isinstance(e, ModuleNotFoundError) else None}
try:
    import torch
    out["torch"] = torch.__version__
    import dgl
    import dgl.function as fn
    out["import"] = {"ok": True, "dgl": dgl.__version__}
except BaseException as e:
    out["import"] = err(e)
    print(json.dumps(out)); sys.exit(0)

def rand_graph(dtype):
    torch.manual_seed(0)
    g = dgl.rand_graph(30, 100)
    g.ndata["h"] = torch.rand(30, 16).to(dtype)
    g.edata["w"] = torch.rand(100, 1).to(dtype)
    return g

def message(edges):
    return {"m": edges.src["h"] * edges.data["w"]}
def reduce(nodes):
    return {"y": torch.sum(nodes.mailbox["m"], 1)}
def dot(edges):
    return {"hy": (edges.src["h"] * edges.dst["y"]).sum(-1, keepdims=True)}

def attempt(f):
    try:
        return {"ok": True, "dtype": str(f()).replace("torch.", "")}
    except BaseException as e:
        return err(e)

ex = {}
for name in ("float16", "bfloat16", "float32"):
    dt = getattr(torch, name)
    g = rand_graph(dt)
    def builtin_u_mul_e_sum():
        g.update_all(fn.u_mul_e("h", "w", "m"), fn.sum("m", "x")); return g.ndata["x"].dtype
    def builtin_u_dot_v():
        if "x" not in g.ndata:       # the guide's second example uses x from the first
            g.ndata["x"] = torch.rand(30, 16).to(dt)
        g.apply_edges(fn.u_dot_v("h", "x", "hx")); return g.edata["hx"].dtype
    ex[f"builtin u_mul_e+sum ({name})"] = attempt(builtin_u_mul_e_sum)
    ex[f"builtin u_dot_v ({name})"] = attempt(builtin_u_dot_v)
    if name == "float16":
        def udf_message_reduce():
            g.update_all(message, reduce); return g.ndata["y"].dtype
        def udf_dot():
            g.apply_edges(dot); return g.edata["hy"].dtype
        ex[f"UDF message+reduce ({name})"] = attempt(udf_message_reduce)
        ex[f"UDF dot ({name})"] = attempt(udf_dot)
out["examples_cpu"] = ex
print(json.dumps(out))
"""


def _pip(venv: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=900,
    )


def _pip_tail(res: subprocess.CompletedProcess, n: int = 6) -> list:
    lines = [
        line
        for line in (res.stdout + res.stderr).splitlines()
        if line.strip() and "is ignored: it is neither" not in line
    ]
    return lines[-n:]


def check_version(version: str, base_python: str, workdir: Path) -> dict:
    """Install DGL ``version`` into a fresh environment under ``workdir`` and record what happens (a dict)."""
    venv = workdir / f"dgl-{version}"
    subprocess.run([base_python, "-m", "venv", str(venv)], check=True, capture_output=True)
    site = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    ours = sysconfig.get_paths()["purelib"]
    (site / "book_site_packages.pth").write_text(ours + "\n")
    rec: dict = {"version": version, "environment": f"fresh venv; .pth → {ours}"}

    report = workdir / f"report-{version}.json"
    _pip(venv, "install", "--dry-run", "--quiet", "--report", str(report), f"dgl=={version}")
    would = []
    if report.exists():
        would = [
            f"{i['metadata']['name']}=={i['metadata']['version']}" for i in json.loads(report.read_text())["install"]
        ]
    rec["would_install"] = would
    no_deps = any(w.split("==")[0].lower() == "torch" for w in would)
    rec["no_deps"] = no_deps
    inst = _pip(venv, "install", f"dgl=={version}", *(["--no-deps"] if no_deps else []))
    rec["pip_install"] = {
        "command": f"pip install dgl=={version}" + (" --no-deps" if no_deps else ""),
        "returncode": inst.returncode,
        "tail": _pip_tail(inst),
    }
    attempts = []
    for _ in range(len(FIXES) + 2):
        res = subprocess.run(
            [str(venv / "bin" / "python"), "-c", PROBE], capture_output=True, text=True, timeout=600, cwd=str(workdir)
        )
        try:
            probe = json.loads(res.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            probe = {"import": {"ok": False, "exception": "probe crashed", "message": (res.stderr or "")[-2000:]}}
        attempts.append({"import": probe["import"], "torch": probe.get("torch")})
        missing = probe["import"].get("missing_module")
        if probe["import"]["ok"] or missing not in FIXES:
            break
        fix = _pip(venv, "install", FIXES[missing])
        attempts[-1]["then_installed"] = {"requirement": FIXES[missing], "returncode": fix.returncode}
    rec["import_attempts"] = attempts
    # the PyTorch versions DGL's wheel ships compiled libraries for (file names libX_pytorch_<version>.so)
    shipped = {}
    for lib in sorted((site / "dgl").glob("**/lib*_pytorch_*.so")):
        name, _, ver = lib.stem.rpartition("_pytorch_")
        shipped.setdefault(name, []).append(ver)
    rec["shipped_torch_builds"] = {
        k: sorted(v, key=lambda s: tuple(int(p) for p in s.split(".") if p.isdigit())) for k, v in shipped.items()
    }
    rec["import"] = attempts[-1]["import"]
    rec["torch"] = attempts[-1]["torch"]
    rec["examples_cpu"] = probe.get("examples_cpu")
    return rec


@dataclass
class Config(ExperimentConfig):
    versions: tuple = VERSIONS  # the DGL versions to check


PROFILES = {"cpu": {}}


@dataclass
class DglCheckResult(ExperimentResult):
    """``method``: what was done (from the module docstring); ``results``: DGL version → its record (pip's exit
    status, every ``import dgl`` attempt, the torch builds DGL ships libraries for, the examples' outcomes)."""

    method: str = ""
    results: dict = field(default_factory=dict)

    def describe(self) -> str:
        lines = []
        for v, r in self.results.items():
            imp = r["import"]
            lines.append(
                f"DGL {v}: import " + ("ok" if imp["ok"] else f"failed: {imp['exception']}: {imp['message'][:200]}")
            )
            lines += [
                f"   {k}: " + (e["dtype"] if e["ok"] else f"{e['exception']}: {e['message'][:160]}")
                for k, e in (r["examples_cpu"] or {}).items()
            ]
        return "\n".join(lines)


def measure(config: Config, run: Run) -> dict:
    """Check each DGL version of ``config.versions``."""
    base_python = str(Path(sys.base_prefix) / "bin" / "python3")
    workdir = Path(tempfile.mkdtemp(prefix="mpt_lab_dgl_check_"))
    try:
        results = {v: check_version(v, base_python, workdir) for v in run.bar(config.versions, desc="DGL versions")}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {"method": " ".join(__doc__.split("\n\n")[1:4]).replace("\n", " "), "results": results}


BENCHMARK = Benchmark("dgl_check", Config, PROFILES, measure, DglCheckResult, __doc__)
main = BENCHMARK.main

if __name__ == "__main__":
    run_main(BENCHMARK)
