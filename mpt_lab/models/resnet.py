"""A small ResNet-style classifier for (upsampled) handwritten digits, with optional activation checkpointing.

The shape follows He et al., "Deep Residual Learning for Image Recognition" (CVPR 2016), CIFAR variant: a 3×3
stem convolution, ``stages`` residual stages of ``depth`` BasicBlocks each (two 3×3 convolutions with
BatchNorm and a shortcut), the channel count doubling and the resolution halving from stage to stage, global
average pooling and a linear classifier.  It is small enough to train on a CPU, and when the 8×8 digits are
upsampled (to 32×32, say) its activations, not its weights, dominate the memory of a training step, which is
what activation checkpointing trades against compute.

With ``checkpoint=True`` each residual stage runs under ``torch.utils.checkpoint.checkpoint(...,
use_reentrant=False)``: the stage's inner activations are dropped after the forward pass and recomputed in
backward.  The recomputation would update the BatchNorm running statistics a second time; this module restores
them after the recomputation, so a checkpointed step leaves the model exactly as a plain step does.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as _checkpoint

__all__ = ["BasicBlock", "ResNet", "build_resnet"]

#: The batch normalisation layers whose running statistics a recomputed stage must not update twice.
_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


class BasicBlock(nn.Module):
    """Two 3×3 conv + BatchNorm layers with a residual shortcut (a 1×1 conv + BN when shape changes).

    Input ``[N, in_ch, H, W]`` → output ``[N, out_ch, H/stride, W/stride]``.
    """

    def __init__(self, in_ch: int, out_ch: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.shortcut = nn.Identity()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


@contextlib.contextmanager
def _keep_bn_buffers(module: nn.Module):
    """Save the BatchNorm running statistics of ``module`` and put them back on exit (used around the
    recomputation of a checkpointed stage, which would otherwise count the batch twice)."""
    saved = [(b, b.detach().clone()) for m in module.modules() if isinstance(m, _BATCH_NORMS) for b in m.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, v in saved:
                b.copy_(v)


class ResNet(nn.Module):
    """ResNet-style classifier.

    Parameters
    ----------
    num_classes : int
        Number of output logits (10 for digits).
    in_channels : int
        Channels of the input image (1 for digits).
    width : int
        Channels of the stem and the first stage; stage ``i`` has ``width * 2**i``.
    stages : int
        Number of residual stages (≥ 1); every stage after the first halves the resolution.
    depth : int
        BasicBlocks per stage (≥ 1).
    checkpoint : bool
        Run each stage under activation checkpointing while gradients are enabled.

    Input ``[N, in_channels, H, W]`` float (any H, W ≥ 2**(stages-1)); output logits ``[N, num_classes]``.

    Raises
    ------
    ValueError
        A size argument is not a positive int.
    """

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 1,
        width: int = 16,
        stages: int = 3,
        depth: int = 1,
        checkpoint: bool = False,
    ):
        super().__init__()
        for name, v in (
            ("num_classes", num_classes),
            ("in_channels", in_channels),
            ("width", width),
            ("stages", stages),
            ("depth", depth),
        ):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        self.checkpoint = bool(checkpoint)
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        layers, ch = [], width
        for i in range(stages):
            out = width * 2**i
            blocks = [BasicBlock(ch, out, stride=1 if i == 0 else 2)]
            blocks += [BasicBlock(out, out) for _ in range(depth - 1)]
            layers.append(nn.Sequential(*blocks))
            ch = out
        self.stages = nn.ModuleList(layers)
        self.fc = nn.Linear(ch, num_classes)

    def _run_stage(self, stage: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if self.checkpoint and torch.is_grad_enabled():
            return _checkpoint(
                stage, x, use_reentrant=False, context_fn=lambda: (contextlib.nullcontext(), _keep_bn_buffers(stage))
            )
        return stage(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for stage in self.stages:
            x = self._run_stage(stage, x)
        x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


def build_resnet(
    width: int = 16,
    stages: int = 3,
    depth: int = 1,
    *,
    num_classes: int = 10,
    in_channels: int = 1,
    checkpoint: bool = False,
    seed: int | None = None,
) -> ResNet:
    """A :class:`ResNet`; with ``seed`` its initial weights are a deterministic function of the seed."""
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return ResNet(num_classes, in_channels, width, stages, depth, checkpoint)
    return ResNet(num_classes, in_channels, width, stages, depth, checkpoint)
