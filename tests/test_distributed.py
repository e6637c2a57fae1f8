"""Mixed precision across processes (mpt_lab.experiments.distributed): the summation-order arithmetic
(mpt_lab.collectives), checked
by hand and against the real gloo all-reduce on 3 processes; the quick profile under ``torchrun --nproc_per_node
2`` and its claims (DDP and FSDP2 agree, BF16 sums err more than FP32, our GradScaler is bit-identical to
torch's under FSDP2, an unsynchronised found-inf flag drifts); and the launcher: a timeout that leaves no rank
running, a killed or failing rank that makes torchrun exit non-zero with the rank's error shown.

Every launch has a timeout (``launch(timeout=…)``), so a hung rank fails the test instead of hanging it.  No
assertion is about wall time: a busy machine must not fail a test.
"""

import dataclasses
import json
import math
import os

import numpy as np
import pytest
import torch

from mpt_lab import collectives as C
from mpt_lab import figures
from mpt_lab import formats as F
from mpt_lab.experiments import distributed as D

#: Seconds a launch may take before its ranks are stopped and the test fails (generous: 2 shared cores).
TIMEOUT = 900


def _tiny(**over):
    """A configuration that starts the ranks and does almost nothing (for the launcher's tests)."""
    base = dict(
        profile="custom",
        recipes=("ddp_fp32",),
        steps=2,
        flag_steps=0,
        inject_steps=(),
        sweep_max=4,
        sweep_elements=64,
        threads=1,
    )
    return D.Config(**{**base, **over})


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, dead but not yet reaped, does not count)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # pragma: no cover (no /proc)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


# ================================================================================================== arithmetic
def test_ring_order_and_tree_shape():
    assert C.ring_order(4, 0) == [3, 2, 1, 0] and C.ring_order(4, 2) == [1, 0, 3, 2]  # gloo: ends at rank c
    assert C.ring_order(4, 0, direction=1) == [1, 2, 3, 0]  # NCCL's direction
    assert C.ring_order(1, 0) == [0]
    for n in (2, 3, 7):
        assert all(sorted(C.ring_order(n, c)) == list(range(n)) and C.ring_order(n, c)[-1] == c for c in range(n))
    assert C.tree_children(5) == [[1, 2], [3, 4], [], [], []]
    assert sorted(c for cs in C.tree_children(100) for c in cs) == list(range(1, 100))  # every rank but the root
    with pytest.raises(ValueError, match="chunk"):
        C.ring_order(3, 3)
    with pytest.raises(ValueError, match="direction"):
        C.ring_order(3, 0, direction=2)
    with pytest.raises(ValueError, match="n_ranks"):
        C.tree_children(0)


def _ring_by_hand(values, fmt, direction=-1):
    """The ring all-reduce element by element, hop by hop, with scalar round_to: the definition."""
    x = [[F.round_to(float(v), fmt) for v in row] for row in values]
    n, m = len(x), len(x[0])
    size = -(-m // n)
    out = []
    for j in range(m):
        order = C.ring_order(n, j // size, direction)
        acc = x[order[0]][j]
        for r in order[1:]:
            acc = F.round_to(acc + x[r][j], fmt)
        out.append(acc)
    return out


def _tree_by_hand(values, fmt):
    x = [[F.round_to(float(v), fmt) for v in row] for row in values]
    children = C.tree_children(len(x))

    def total(r, j):
        acc = x[r][j]
        for c in children[r]:
            acc = F.round_to(acc + total(c, j), fmt)
        return acc

    return [total(0, j) for j in range(len(x[0]))]


@pytest.mark.parametrize("n,m", [(1, 5), (2, 8), (3, 13), (5, 12), (8, 3), (13, 40)])
@pytest.mark.parametrize("fmt", ["BF16", "FP16", "FP32"])
def test_ring_and_tree_follow_their_order_hop_by_hop(n, m, fmt):
    rng = np.random.default_rng(n * 100 + m)
    values = rng.normal(0, 1, (n, m)) * np.exp2(rng.integers(-10, 10, (n, m)))
    for direction in (-1, 1):
        assert C.ring_allreduce(values, fmt, direction=direction).tolist() == _ring_by_hand(values, fmt, direction)
    assert C.tree_allreduce(values, fmt).tolist() == _tree_by_hand(values, fmt)
    assert C.ring_allreduce(torch.from_numpy(values).float(), fmt).dtype == np.float64  # tensors too


def test_the_order_changes_a_bf16_sum():
    values = [[1.0], [2.0**-8], [2.0**-8]]
    assert C.ring_allreduce(values, "BF16")[0] == 1 + 2.0**-7  # 2⁻⁸ + 2⁻⁸ first, then 1: both kept
    assert C.tree_allreduce(values, "BF16")[0] == 1.0  # 1 + 2⁻⁸ first: a tie, to even; twice
    assert C.ring_allreduce(values, "FP32")[0] == C.tree_allreduce(values, "FP32")[0] == 1 + 2.0**-7


def test_division_and_overflow():
    big = [[40000.0], [40000.0]]
    assert math.isinf(C.ring_allreduce(big, "FP16", postdivide=2)[0])  # sum first: overflows FP16
    assert C.ring_allreduce(big, "FP16", predivide=2)[0] == 40000.0  # divide first, as the hooks do
    assert C.ring_allreduce(big, "BF16", postdivide=2)[0] == 39936.0  # BF16 has the range, not the bits
    pre, post = C.fsdp_divide_factors(2)
    assert C.ring_allreduce(big, "FP16", predivide=pre, postdivide=post)[0] == 40000.0
    with pytest.raises(ValueError, match="predivide"):
        C.ring_allreduce(big, "FP16", predivide=0)
    with pytest.raises(ValueError, match="2-D"):
        C.ring_allreduce([1.0, 2.0], "FP16")
    with pytest.raises(ValueError):
        C.tree_allreduce(big, "FP17")


def test_fsdp_divide_factors_are_pytorchs():
    """The same pre/post factors as FSDP2's own rule for an FP16 reduce dtype (a private torch function: the
    test, not the package, imports it)."""
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import _get_gradient_divide_factors

    class Group:
        def __init__(self, n):
            self.n = n

        def size(self):
            return self.n

    for n in list(range(1, 70)) + [96, 128, 1000, 1024]:
        pre, post, _, _ = _get_gradient_divide_factors(Group(n), None, torch.float16)
        assert C.fsdp_divide_factors(n) == (float(pre), float(post)), n
    assert C.fsdp_divide_factors(1024) == (32.0, 32.0) and C.fsdp_divide_factors(8) == (4.0, 2.0)


def test_relative_error():
    assert C.relative_error([1.0, 2.0], [1.0, 2.0]) == 0.0
    assert C.relative_error([1.0, 0.0], [0.0, 0.0]) == math.inf
    assert C.relative_error([3.0, 4.0], [0.0, 0.0]) == math.inf and C.relative_error([0.0], [0.0]) == 0.0
    assert C.relative_error([1.0, math.inf], [1.0, 1.0]) == math.inf
    assert math.isclose(C.relative_error([1.1, 0.0], [1.0, 0.0]), 0.1)
    with pytest.raises(ValueError, match="shape"):
        C.relative_error([1.0], [1.0, 2.0])


def test_config_is_checked():
    for bad in (
        dict(backend="mpi"),
        dict(recipes=("ddp_fp64",)),
        dict(nproc=-1),
        dict(sweep_max=1),
        dict(inject_steps=(40,)),
        dict(lr=0.0),
    ):
        with pytest.raises(ValueError, match="config."):
            dataclasses.replace(D.config_for("quick"), **bad).validate()
    with pytest.raises(TypeError, match="Config"):
        D.launch(3)
    with pytest.raises(ValueError, match="nproc"):
        D.launch("quick", nproc=0)


def test_runner_hooks(monkeypatch, tmp_path, capsys):
    """Outside torchrun, run() launches; in a rank, it measures; a rank other than 0 prints and writes nothing."""
    assert (
        D.EXPERIMENT.command(D.config_for("full"), "book/results/distributed_full.json")
        == "python -m mpt_lab.experiments.distributed --profile full --out book/results/distributed_full.json"
    )
    seen = []
    monkeypatch.setattr(D, "launch", lambda config, **kw: seen.append((config, kw)) or "launched")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    assert not D.in_torchrun()
    assert D.run(D.config_for("quick")) == "launched" and seen[0][1]["command"].startswith("python -m")
    for k, v in dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="1").items():
        monkeypatch.setenv(k, v)
    assert D.in_torchrun()
    monkeypatch.setattr(D.EXPERIMENT, "measure", lambda config, run: None)  # what rank 1 returns
    out = tmp_path / "r.json"
    assert D.main(["--profile", "quick", "--out", str(out)]) == 0
    assert not out.exists() and capsys.readouterr().out == "" and len(seen) == 1


# ==================================================================================================== torchrun
@pytest.fixture(scope="module")
def quick():
    """The quick profile under torchrun, 2 processes, gloo: what the chapter runs in CI."""
    lines = []
    result = D.launch("quick", nproc=2, timeout=TIMEOUT, progress=True, echo=lines.append)
    return result, lines


def test_quick_profile_claims(quick):
    r, lines = quick
    assert r.world_size == 2 and r.backend == "gloo" and r.nnodes == 1
    # DDP FP32 and FSDP2 with BF16 parameters and FP32 reduction agree within the stated tolerance ...
    assert r.agreement("fsdp_bf16_fp32")["agree"], r.agreement("fsdp_bf16_fp32")
    assert all(r.agreement(name)["agree"] for name in r.recipes), {n: r.agreement(n) for n in r.recipes}
    # ... and FSDP2 in FP32 is DDP in FP32, bit for bit, on 2 ranks (a sum of two values has one order)
    assert r.recipes["fsdp_fp32"]["identical_to_reference"] and r.recipes["fsdp_fp32"]["param_diff"] == 0
    assert all(0 < r.recipes[n]["param_diff"] < 0.1 for n in r.recipes if "16" in n)
    # FSDP2 holds half of what DDP holds on each of 2 ranks
    for name, rec in r.recipes.items():
        ddp = r.recipes["ddp_fp32"]["memory"][0]
        m = rec["memory"][0]
        p = rec["parameters"]
        assert m["params"] >= 4 * p / 2 and m["grads"] >= 4 * p / 2 and m["optimizer"] >= 8 * p / 2
        if rec["wrapper"] == "fsdp":
            assert m["params"] + m["grads"] + m["optimizer"] < 0.6 * (ddp["params"] + ddp["grads"] + ddp["optimizer"])
            assert m["gathered"] > 0
        else:
            assert m == ddp and m["params"] == 4 * p
    # the loss scales of the scaled recipes are the same on both ranks (DDP: one all-reduced gradient; FSDP2: the
    # found-inf flag is all-reduced)
    for name in ("ddp_amp_fp16", "fsdp_fp16_fp32"):
        assert r.recipes[name]["scales"][0] == r.recipes[name]["scales"][1]
    # progress was streamed: one line per recipe, then the reduction and the overflow study
    assert sum(line.startswith("[") for line in lines) == len(r.recipes)
    assert not any(line.startswith("wrote ") or line.startswith("distributed (quick profile, ") for line in lines)


def test_quick_profile_reduction(quick):
    r, _ = quick
    m = r.reduction["measured"]
    assert m["n"] == 2 and all(m[f]["matches_ring"] for f in ("FP32", "BF16", "FP16"))  # real = simulated
    assert r.reduction["hooks"] == {"bf16": True, "fp16": True}
    assert m["BF16"]["rel_error"] > m["FP16"]["rel_error"] > m["FP32"]["rel_error"] > 0
    sweep = r.reduction["sweep"]
    assert sweep["n"][0] == 2 and sweep["n"][-1] == 1024
    for algorithm in ("ring", "tree"):
        assert all(b > f for b, f in zip(sweep[algorithm]["BF16"], sweep[algorithm]["FP32"]))
    assert sweep["ring"]["BF16"][-1] > 10 * sweep["tree"]["BF16"][-1]  # the ring's long sequential sum swamps
    fp16 = r.reduction["fp16"]
    n0 = fp16["first_overflow_n"]
    assert n0 is not None and n0 > 2  # the scale is safe for each rank alone
    i = fp16["n"].index(n0)
    assert fp16["sum_then_divide"]["overflow_share"][i] > 0
    assert not any(fp16["predivide"]["overflow_share"]) and not any(fp16["fsdp_split"]["overflow_share"])


def test_quick_profile_overflow_agreement(quick):
    r, _ = quick
    fa = r.flag_agreement
    v = fa["variants"]
    assert fa["identical_to_torch"]  # scales and parameters, every step
    for name in ("torch", "mpt_lab"):
        assert v[name]["scales"][0] == v[name]["scales"][1]  # both ranks keep one scale ...
        assert v[name]["skipped"][0] == v[name]["skipped"][1]  # ... and skip the same steps
        assert set(fa["inject_steps"]) <= set(v[name]["skipped"][0])
    assert v["mpt_lab"]["scales"] == v["torch"]["scales"]
    unsync = v["unsynchronised"]
    assert set(fa["inject_steps"]) <= set(unsync["skipped"][fa["inject_rank"]])
    assert not set(fa["inject_steps"]) & set(unsync["skipped"][0])  # rank 0 never saw the inf
    assert unsync["scales"][0] != unsync["scales"][1] and r.scales_part_at() == fa["inject_steps"][0] + 1
    first = fa["inject_steps"][0]
    assert all(d == 0 for d in fa["drift"][:first]) and fa["drift"][-1] > 1e-3  # identical, then apart
    assert fa["drift"][-1] > fa["drift"][first]


def test_result_provenance_json_and_figures(quick, tmp_path):
    r, _ = quick
    prov = r.provenance
    assert prov["command"] == "python -m mpt_lab.experiments.distributed --profile quick"
    assert prov["launcher"].startswith("torchrun --standalone --nproc_per_node 2 -m mpt_lab.experiments.distributed")
    assert prov["distributed"] == {"world_size": 2, "nnodes": 1, "backend": "gloo", "ranks_device": "cpu"}
    assert "torch" in prov["versions"] and r.ranks_device == "cpu"
    back = D.DistributedResult.load(r.save(tmp_path / "d.json"))
    assert back.recipes == r.recipes and back.describe() == r.describe()
    assert json.loads((tmp_path / "d.json").read_text())["experiment"] == "distributed"
    for fn in (
        figures.plot_recipe_losses,
        figures.plot_memory_per_rank,
        figures.plot_reduction_error,
        figures.plot_flag_agreement,
    ):
        fig = fn(r)
        for ax in fig.axes:
            assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
            assert ax.get_legend() is not None or fig.legends
            if ax.get_legend() is not None:  # the legend lists only what is drawn
                drawn = {line.get_label() for line in ax.lines if len(line.get_xdata())}
                drawn |= {c.get_label() for c in ax.containers} | {c.get_label() for c in ax.collections}
                assert {t.get_text() for t in ax.get_legend().get_texts()} <= drawn, fn.__name__
    assert "DDP, FP32 all-reduce" in figures.memory_table(r) and "bit for bit" in figures.reduction_table(r)
    assert "KiB held" in figures.memory_table(r)  # the figure's unit, KiB
    lines = figures.plot_recipe_losses(r).axes[0].lines
    styles = [(line.get_color(), line.get_linestyle(), line.get_linewidth()) for line in lines]
    assert len(lines) == len(r.recipes) and len(set(styles)) == len(styles)  # no two recipes drawn alike
    ax = figures.plot_memory_per_rank(r).axes[0]
    top = max(p.get_y() + p.get_height() for p in ax.patches)
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= 1.3 * top  # every bar whole, room above
    with pytest.raises(TypeError):
        figures.plot_reduction_error(object())


def test_gloo_ring_order_on_three_ranks(quick):
    """On 3 processes the order of a sum shows: gloo's all-reduce equals ring_allreduce bit for bit, and a
    tree's order would give other values for some elements.  reduction_config runs that check alone, as the
    chapter does beside its 2-rank run, and the table shows both."""
    cfg = D.reduction_config("quick", nproc=3)
    assert cfg.recipes == () and cfg.sweep_max == 0 and cfg.flag_steps == 0 and cfg.batch_size % 3 == 0
    assert cfg.backend == "gloo" and cfg.device == "cpu" and cfg.nproc == 3
    cfg.validate()
    r = D.launch(cfg, nproc=3, timeout=TIMEOUT, progress=False, echo=lambda line: None)
    m = r.reduction["measured"]
    assert m["n"] == 3 and r.world_size == 3 and r.recipes == {} and r.flag_agreement == {}
    assert "sweep" not in r.reduction and "fp16" not in r.reduction
    assert all(m[f]["matches_ring"] for f in ("FP32", "BF16", "FP16")), m
    assert m["BF16"]["differs_from_tree"] > 0
    assert r.reduction["hooks"] == {"bf16": None, "fp16": None}
    assert "N = 3" in r.describe()
    two, _ = quick
    assert all(two.reduction["measured"][f]["differs_from_tree"] == 0 for f in ("FP32", "BF16", "FP16"))  # one order
    table = figures.reduction_table(two, r)
    assert table.count("<tr>") == 1 + 2 * 3 and "3 (gloo)" in table and "2 (gloo)" in table
    with pytest.raises(ValueError, match="nproc"):
        D.reduction_config("quick", nproc=1)
    with pytest.raises(TypeError, match="config"):
        D.reduction_config(3)


def test_reduction_orders_diagram_comes_from_collectives():
    fig = figures.plot_reduction_orders(6)
    ring, tree = fig.axes
    assert str(C.ring_order(6, 0)) in ring.get_title() and str(C.tree_children(6)) in tree.get_title()
    texts = [t.get_text() for t in ring.texts]
    assert "chunk 0: ((((x5 + x4) + x3) + x2) + x1) + x0" in texts  # the chain ring_order(6, 0) gives
    assert sum(t.startswith("hop ") for t in texts) == 5
    assert "root: (x0 + ((x1 + x3) + x4)) + (x2 + x5)" in [t.get_text() for t in tree.texts]
    assert fig.get_suptitle()
    with pytest.raises(ValueError, match="n_ranks"):
        figures.plot_reduction_orders(1)


@pytest.mark.parametrize("fault,shown", [("kill:1", "Signal 9 (SIGKILL)"), ("raise:1", "fault injected on rank 1")])
def test_a_failing_rank_makes_torchrun_fail_and_show_why(fault, shown, tmp_path):
    pids = tmp_path / "pids"
    with pytest.raises(D.LaunchError) as err:
        D.launch(
            _tiny(),
            timeout=TIMEOUT,
            progress=False,
            echo=lambda line: None,
            env={D.FAULT_ENV: fault, "MPT_LAB_PID_DIR": str(pids)},
        )
    text = str(err.value)
    assert "torchrun exited with status" in text and shown in text and "rank      : 1" in text
    ranks = [int(p.read_text()) for p in pids.glob("rank*.pid")]
    assert len(ranks) == 2 and not any(_alive(pid) for pid in ranks)  # no rank is left running


def test_a_hanging_rank_is_stopped_at_the_timeout(tmp_path):
    pids = tmp_path / "pids"
    # 30 s: the failing-rank cases above start, fail and report in ~5 s on 2 busy cores; a rank that hangs is
    # stopped only by the timeout, so every second of it is a second this test waits
    with pytest.raises(TimeoutError, match="did not finish within 30 s"):
        D.launch(
            _tiny(),
            timeout=30,
            progress=False,
            echo=lambda line: None,
            env={D.FAULT_ENV: "hang:1", "MPT_LAB_PID_DIR": str(pids)},
        )
    ranks = [int(p.read_text()) for p in pids.glob("rank*.pid")]
    assert ranks and not any(_alive(pid) for pid in ranks)
