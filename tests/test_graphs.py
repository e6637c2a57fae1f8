"""mpt_lab.data.graphs and mpt_lab.models.gat: the random graph, the synthetic Reddit-shaped graph (shape,
determinism, learnable class structure), self loops, and the GAT's shapes and dtypes."""

import pytest
import torch
import torch.nn.functional as F

from mpt_lab.data.graphs import REDDIT, add_self_loops, rand_graph, synthetic_reddit


def test_rand_graph_like_dgl():
    ei = rand_graph(30, 100, seed=3)
    assert ei.shape == (2, 100) and ei.dtype == torch.int64
    assert int(ei.min()) >= 0 and int(ei.max()) < 30
    assert torch.equal(ei, rand_graph(30, 100, seed=3))
    assert not torch.equal(ei, rand_graph(30, 100, seed=4))
    with pytest.raises(ValueError, match="num_nodes"):
        rand_graph(0, 10)
    with pytest.raises(TypeError, match="num_edges"):
        rand_graph(10, 2.5)


def test_add_self_loops_one_per_node():
    ei = torch.tensor([[0, 1, 2, 2], [1, 1, 0, 2]])
    out = add_self_loops(ei, 4)
    loops = out[:, out[0] == out[1]]
    assert sorted(loops[0].tolist()) == [0, 1, 2, 3]  # exactly one loop per node
    assert out.shape[1] == 2 + 4  # the two non-loop edges are kept
    with pytest.raises(ValueError, match="edge_index"):
        add_self_loops(torch.zeros(3, 4, dtype=torch.long), 4)


def test_synthetic_reddit_shape_and_determinism():
    g = synthetic_reddit(500, 8.0, seed=1)
    assert g.num_features == REDDIT["num_features"] == 602 and g.num_classes == REDDIT["num_classes"] == 41
    assert g.x.shape == (500, 602) and g.x.dtype == torch.float32 and g.y.dtype == torch.int64
    assert set(g.y.unique().tolist()) == set(range(41))  # every class present
    # undirected edges in both directions plus one self loop per node
    assert 4000 - 50 < g.num_edges - 500 <= 4000  # 2000 undirected edges (random self loops dropped)
    assert int((g.edge_index[0] == g.edge_index[1]).sum()) == 500
    m = g.train_mask.int() + g.val_mask.int() + g.test_mask.int()
    assert bool((m == 1).all())  # the split is a partition
    frac = REDDIT["train"] / (REDDIT["train"] + REDDIT["val"] + REDDIT["test"])
    assert abs(float(g.train_mask.float().mean()) - frac) < 0.01
    g2 = synthetic_reddit(500, 8.0, seed=1)
    assert torch.equal(g.edge_index, g2.edge_index) and torch.equal(g.x, g2.x) and torch.equal(g.y, g2.y)
    assert g.nbytes() == sum(
        t.numel() * t.element_size() for t in (g.edge_index, g.x, g.y, g.train_mask, g.val_mask, g.test_mask)
    )


def test_synthetic_reddit_is_homophilous():
    g = synthetic_reddit(2000, 10.0, homophily=0.7, seed=0)
    src, dst = g.edge_index
    keep = src != dst
    same = float((g.y[src[keep]] == g.y[dst[keep]]).float().mean())
    assert 0.6 < same < 0.8  # ≈ homophily + (1 − homophily)·Σ p_c²
    g0 = synthetic_reddit(2000, 10.0, homophily=0.0, seed=0)
    s0, d0 = g0.edge_index
    k0 = s0 != d0
    assert float((g0.y[s0[k0]] == g0.y[d0[k0]]).float().mean()) < 0.1


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_nodes": 10}, "num_nodes"),
        ({"avg_degree": 0.0}, "avg_degree"),
        ({"homophily": 1.5}, "homophily"),
        ({"feature_signal": -1.0}, "feature_signal"),
    ],
)
def test_synthetic_reddit_bad_args(kwargs, match):
    args = {"num_nodes": 100, "avg_degree": 4.0, **kwargs}
    with pytest.raises(ValueError, match=match):
        synthetic_reddit(**args)


def test_gat_shapes_dtypes_and_learning():
    from mpt_lab.models.gat import GAT

    g = synthetic_reddit(300, 8.0, seed=0)
    torch.manual_seed(0)
    model = GAT(602, 32, 41, (2, 2, 2))
    assert [layer.heads for layer in model.layers] == [2, 2, 2]
    assert model.layers[1].in_channels == 64  # hidden layers concatenate their heads
    out = model(g.x, g.edge_index)
    assert out.shape == (300, 41) and out.dtype == torch.float32
    assert float(out.detach().min()) >= -1.0  # ELU on the last layer, as the guide
    seen = []
    hook = model.layers[0].lin.register_forward_hook(lambda mod, inp, o: seen.append(o.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out16 = model(g.x, g.edge_index)
    hook.remove()
    assert seen == [torch.bfloat16]  # the projection W·h runs in BF16
    assert out16.dtype == torch.float32  # GATConv adds its FP32 bias: promoted
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = None
    for _ in range(15):
        opt.zero_grad()
        loss = F.cross_entropy(model(g.x, g.edge_index)[g.train_mask], g.y[g.train_mask])
        loss.backward()
        opt.step()
        first = first if first is not None else loss.item()
    assert loss.item() < 0.5 * first  # the class structure is learnable


def test_gat_bad_args():
    from mpt_lab.models.gat import GAT

    with pytest.raises(ValueError, match="heads"):
        GAT(8, 8, 2, [])
    with pytest.raises(ValueError, match="heads"):
        GAT(8, 8, 2, [1, 0])
    with pytest.raises(TypeError, match="in_feats"):
        GAT(8.0, 8, 2)
    with pytest.raises(TypeError, match="heads"):
        GAT(8, 8, 2, 3)
