"""The Triton RotatE distance kernels (earl_service/model/kernels/gpu.py) against the plain-torch maths: values and
gradients, with repeated candidates (the backward's atomic adds must sum them), sizes off the block sizes and
all-pairs.

On a CUDA machine the kernels run compiled on the GPU. Without one, `test_kernels_under_the_interpreter` runs this
file again in a child pytest under TRITON_INTERPRET=1, where Triton's interpreter runs them on CPU tensors: the
variable must be set before Triton is first imported, so it cannot be switched on inside this process."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from earl_service.model.kernels import EPS, rotate_distance_torch

pytest.importorskip("triton")
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = torch.device("cuda" if torch.cuda.is_available() and not INTERPRETED else "cpu")
runs_here = pytest.mark.skipif(not INTERPRETED and DEVICE.type != "cuda", reason="in the interpreter's child run")

if INTERPRETED:
    from triton.runtime import interpreter

    _patch_tensor = interpreter._patch_lang_tensor

    def _index_of_one_element(tensor, scope):
        # The interpreter holds a scalar as a one-element array and takes int() of it, which numpy >= 2.4 refuses
        # for arrays of one dimension: range(0, D, BLOCK) over a scalar argument raised TypeError.
        _patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = _index_of_one_element


@pytest.mark.skipif(INTERPRETED or DEVICE.type == "cuda", reason="the kernels run in this process")
def test_kernels_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-p", "no:cacheprovider", __file__], env=env,
                          cwd=Path(__file__).resolve().parents[3], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "5 passed" in proc.stdout, proc.stdout[-2000:]


def _inputs(rows: int, entities: int, d: int, k: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, 2 * d, generator=gen, dtype=torch.float64).float()
    ent = torch.randn(entities, 2 * d, generator=gen, dtype=torch.float64).float()
    idx = torch.randint(0, entities, (rows, k), generator=gen)
    idx[0, : min(3, k)] = 0  # one entity scored several times in a row and across rows
    idx[-1, 0] = 0
    return q.to(DEVICE), ent.to(DEVICE), idx.to(DEVICE)


@runs_here
@pytest.mark.parametrize("rows,entities,d,k", [(3, 20, 5, 7), (4, 50, 70, 40), (1, 3, 1, 1)])
def test_gathered_distances_and_gradients_match_torch(rows, entities, d, k):
    from earl_service.model.kernels import gpu

    q, ent, idx = _inputs(rows, entities, d, k)
    weights = torch.randn(rows, k, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    grads = []
    for kernel in (lambda *a: gpu.rotate_distance(*a, EPS), rotate_distance_torch):
        qq, ee = q.clone().requires_grad_(), ent.clone().requires_grad_()
        dist = kernel(qq, ee, idx)
        (dist * weights).sum().backward()
        grads.append((dist.detach(), qq.grad, ee.grad))
    for ours, ref in zip(grads[0], grads[1], strict=True):
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


@runs_here
def test_all_pairs_match_torch():
    from earl_service.model.kernels import gpu

    q, ent, _ = _inputs(5, 37, 70, 1)
    every = torch.arange(37, device=DEVICE).expand(5, 37)
    torch.testing.assert_close(gpu.rotate_distance_all(q, ent, EPS), rotate_distance_torch(q, ent, every),
                               rtol=1e-5, atol=1e-5)


@runs_here
def test_empty_inputs():
    from earl_service.model.kernels import gpu

    q, ent, _ = _inputs(2, 4, 3, 1)
    assert gpu.rotate_distance(q[:0], ent, torch.zeros(0, 3, dtype=torch.long, device=DEVICE), EPS).shape == (0, 3)
    assert gpu.rotate_distance_all(q, ent[:0], EPS).shape == (2, 0)
