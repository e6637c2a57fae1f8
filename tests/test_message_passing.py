"""mpt_lab.experiments.message_passing: the DGL User Guide's four float16 examples in PyG and plain PyTorch stay float16
and agree with FP32 references on the CPU.

Tolerances (stated): on the guide's graph (30 nodes, 100 edges, values in [0, 1)) every float16 result is within
2 FP16 ulps of the FP32 reference computed from the same inputs, and its normwise relative error is below
2⁻¹⁰ (FP16's unit roundoff is 2⁻¹¹; a sum of a few terms rounds a few times).  The PyG and PyTorch results of
one example differ by at most 1 FP16 ulp of the reference.
"""

import pytest
import torch

from mpt_lab import figures, formats
from mpt_lab.experiments import message_passing as mp


@pytest.fixture(scope="module")
def inputs():
    return mp.make_inputs(30, 100, 16, seed=0)


def test_inputs_are_the_seeds(inputs):
    ei, h, w = inputs
    assert ei.shape == (2, 100) and h.shape == (30, 16) and w.shape == (100, 1)
    assert h.dtype == w.dtype == torch.float16
    assert float(h.min()) >= 0 and float(h.max()) < 1


@pytest.mark.parametrize("library", list(mp.IMPLEMENTATIONS))
def test_examples_stay_fp16_and_match_fp32(inputs, library):
    ei, h, w = inputs
    ref = mp.torch_examples(ei, h.float(), w.float())
    out = mp.IMPLEMENTATIONS[library](ei, h, w)
    assert set(out) == set(mp.EXAMPLES)
    for ex, y in out.items():
        assert y.dtype == torch.float16, (library, ex)
        assert ref[ex].dtype == torch.float32
        assert y.shape == ref[ex].shape == ((30, 16) if "sum" in ex or "reduce" in ex else (100, 1))
        e = mp.errors(y, ref[ex])
        assert e["max_ulp"] <= 2.0, (library, ex, e)
        assert e["rel_norm"] < 2.0**-10, (library, ex, e)
        # and the error is a rounding error, not zero: float16 arithmetic did happen
        assert e["max_abs"] > 0, (library, ex)


def test_libraries_agree(inputs):
    ei, h, w = inputs
    a, b = mp.pyg_examples(ei, h, w), mp.torch_examples(ei, h, w)
    ref = mp.torch_examples(ei, h.float(), w.float())
    for ex in mp.EXAMPLES:
        u = formats.ulp(ref[ex].double(), "FP16")
        assert bool(((a[ex].double() - b[ex].double()).abs() <= u).all()), ex


def test_udf_equals_builtin_in_fp32(inputs):
    ei, h, w = inputs
    out = mp.pyg_examples(ei, h.float(), w.float())
    torch.testing.assert_close(out["UDF message+reduce"], out["builtin u_mul_e+sum"], rtol=1e-6, atol=1e-6)


def test_mailbox_pads_with_zeros():
    msgs = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    dst = torch.tensor([2, 0, 2, 2])
    box = mp.mailbox(msgs, dst, 3)
    assert box.shape == (3, 3, 1)
    assert box[2, :, 0].tolist() == [1.0, 3.0, 4.0] and box[0, :, 0].tolist() == [2.0, 0.0, 0.0]
    assert box[1].abs().sum() == 0
    with pytest.raises(ValueError, match="messages"):
        mp.mailbox(msgs, dst[:3], 3)


def test_cpu_scatter_sum_rounds_once():
    # 2,000 messages into one node: torch's CPU index_add_ for float16 accumulates in a wider format and rounds
    # the sum once, so the result is the correctly rounded sum of the (float16) messages: ≤ 0.5 ulp from it.
    ei = torch.stack([torch.arange(2000) % 50, torch.zeros(2000, dtype=torch.long)])
    g = torch.Generator().manual_seed(0)
    h = torch.rand(50, 4, generator=g).half()
    w = torch.rand(2000, 1, generator=g).half()
    x16 = mp.torch_examples(ei, h, w)["builtin u_mul_e+sum"][:1]
    exact = (h[ei[0]] * w).double().sum(0, keepdim=True)  # the same float16 products, summed exactly
    assert x16.dtype == torch.float16
    assert mp.errors(x16, exact)["max_ulp"] <= 0.5
    # a float16 running sum (what a naive kernel does, rounding after every addition) is far worse
    run = torch.zeros(1, 4, dtype=torch.float16)
    for m in h[ei[0]] * w:
        run = run + m
    assert mp.errors(run, exact)["max_ulp"] > 2.0


def test_run_result_and_roundtrip(tmp_path):
    res = mp.run(mp.config_for("quick"), progress=False)
    assert res.all_low_precision()
    assert len(res.rows) == 2 * len(mp.EXAMPLES)
    assert all(r["max_ulp"] <= 2.0 for r in res.rows)
    assert "float16" in res.describe()
    p = res.save(tmp_path / "mp.json")
    back = mp.MessagePassingResult.load(p)
    assert back == res and back.provenance["command"].startswith("python -m")
    assert figures.message_passing_table(res).count("<tr>") == 1 + len(res.rows)


def test_code_side_by_side_and_bad_input():
    c = mp.code_side_by_side("UDF message+reduce")
    assert "nodes.mailbox" in c["DGL"] and "def aggregate" in c["PyG"] and "mailbox(m, dst, n)" in c["PyTorch"]
    with pytest.raises(ValueError, match="example"):
        mp.code_side_by_side("u_add_v")
    table = figures.code_table("UDF message+reduce", c)  # the code is shown escaped, one row per library
    assert table.count("<tr>") == 1 + 3 and "{&#x27;m&#x27;: " in table and "{'m': " not in table
    assert "text-align:right" not in table  # the header "code" sits over its code, on the left
    with pytest.raises(TypeError, match="codes"):
        figures.code_table("x", ["def f(): pass"])
    with pytest.raises(TypeError, match="config"):
        mp.run(object())
    with pytest.raises(ValueError, match="dtype"):
        mp.run(mp.Config(dtype="float8"))
    with pytest.raises(TypeError, match="dtype"):
        mp.make_inputs(dtype=torch.int32)
