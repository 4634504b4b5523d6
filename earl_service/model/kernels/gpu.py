"""The RotatE distance as Triton kernels for CUDA: one pass over the candidates, nothing (B, K, 2d) materialised.

dist[b, k] = sum_i sqrt(re^2 + im^2 + EPS), re + i im = q[b, i] - ent[c, i], c = idx[b, k] (or k for all pairs).
The plain-torch path gathers each candidate's row into a (B, K, 2d) tensor, in chunks of 128 queries, and its
backward scatters another such tensor: on an H200, RotatE d500 at batch 1024 x 256 spent ~22 ms of GPU time per
step there (bench/results/cuda_profile.md). Here a program scores BLOCK_K candidates of one query, streaming the
complex dimensions in blocks of BLOCK_D. The backward recomputes the differences twice, without atomics: per
query, summing over its candidates; and per entity, summing over the places it was a candidate (the candidate ids
sorted once per step), so each gradient row is written once and the sums are deterministic.

Imported only where a CUDA tensor asks for it, and where Triton imports; `TRITON_INTERPRET=1` runs the same
kernels on CPU tensors (tests/earl_service/model/test_gpu_kernels.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_K, BLOCK_D, BLOCK_O = 32, 64, 16


@triton.jit
def _distance_fwd(q_ptr, ent_ptr, idx_ptr, out_ptr, K, D, stride_q, stride_e, stride_idx, stride_out, eps,
                  ALL: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    ks = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    kmask = ks < K
    if ALL:  # noqa: SIM108 (a constexpr if: Triton compiles the one branch)
        cand = ks.to(tl.int64)
    else:
        cand = tl.load(idx_ptr + row * stride_idx + ks, mask=kmask, other=0).to(tl.int64)
    acc = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        ds = d0 + tl.arange(0, BLOCK_D)
        dmask = ds < D
        mask = kmask[:, None] & dmask[None, :]
        q_re = tl.load(q_ptr + row * stride_q + ds, mask=dmask, other=0.0).to(tl.float32)
        q_im = tl.load(q_ptr + row * stride_q + D + ds, mask=dmask, other=0.0).to(tl.float32)
        rows = ent_ptr + cand[:, None] * stride_e + ds[None, :]
        re = q_re[None, :] - tl.load(rows, mask=mask, other=0.0).to(tl.float32)
        im = q_im[None, :] - tl.load(rows + D, mask=mask, other=0.0).to(tl.float32)
        acc += tl.sum(tl.where(mask, tl.sqrt(re * re + im * im + eps), 0.0), axis=1)
    tl.store(out_ptr + row * stride_out + ks, acc, mask=kmask)


@triton.jit
def _query_grad(grad_ptr, q_ptr, ent_ptr, idx_ptr, gq_ptr, K, D, stride_grad, stride_q, stride_e, stride_idx, eps,
                BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    """gq[b, dims] = sum_k g[b, k] (q[b] - ent[c]) / modulus: one program per (query, block of dims), summed in
    registers over the candidates and stored once."""
    row = tl.program_id(0).to(tl.int64)
    ds = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = ds < D
    q_re = tl.load(q_ptr + row * stride_q + ds, mask=dmask, other=0.0).to(tl.float32)
    q_im = tl.load(q_ptr + row * stride_q + D + ds, mask=dmask, other=0.0).to(tl.float32)
    acc_re = tl.zeros((BLOCK_D,), dtype=tl.float32)
    acc_im = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        kmask = ks < K
        mask = kmask[:, None] & dmask[None, :]
        cand = tl.load(idx_ptr + row * stride_idx + ks, mask=kmask, other=0).to(tl.int64)
        g = tl.load(grad_ptr + row * stride_grad + ks, mask=kmask, other=0.0).to(tl.float32)
        rows = ent_ptr + cand[:, None] * stride_e + ds[None, :]
        re = q_re[None, :] - tl.load(rows, mask=mask, other=0.0).to(tl.float32)
        im = q_im[None, :] - tl.load(rows + D, mask=mask, other=0.0).to(tl.float32)
        coef = tl.where(mask, g[:, None] / tl.sqrt(re * re + im * im + eps), 0.0)  # d dist / d re = re / modulus
        acc_re += tl.sum(coef * re, axis=0)
        acc_im += tl.sum(coef * im, axis=0)
    tl.store(gq_ptr + row * 2 * D + ds, acc_re, mask=dmask)
    tl.store(gq_ptr + row * 2 * D + D + ds, acc_im, mask=dmask)


@triton.jit
def _entity_grad(grad_ptr, q_ptr, ent_ptr, order_ptr, offsets_ptr, gent_ptr, K, D, stride_q, stride_e, eps,
                 BLOCK_O: tl.constexpr, BLOCK_D: tl.constexpr):
    """gent[e, dims] = -sum over the (b, k) scoring entity e of g[b, k] (q[b] - ent[e]) / modulus: one program per
    (entity, block of dims), walking e's occurrences in the sorted candidate list, so that each row is written
    once and no atomics are needed (atomic adds per (b, k, dim) took 9 ms of an 11 ms RotatE d500 step)."""
    ent_id = tl.program_id(0).to(tl.int64)
    ds = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = ds < D
    first = tl.load(offsets_ptr + ent_id)
    last = tl.load(offsets_ptr + ent_id + 1)
    e_re = tl.load(ent_ptr + ent_id * stride_e + ds, mask=dmask, other=0.0).to(tl.float32)
    e_im = tl.load(ent_ptr + ent_id * stride_e + D + ds, mask=dmask, other=0.0).to(tl.float32)
    acc_re = tl.zeros((BLOCK_D,), dtype=tl.float32)
    acc_im = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for j0 in range(first, last, BLOCK_O):
        js = j0 + tl.arange(0, BLOCK_O)
        jmask = js < last
        mask = jmask[:, None] & dmask[None, :]
        flat = tl.load(order_ptr + js, mask=jmask, other=0).to(tl.int64)  # b * K + k (grad is contiguous)
        g = tl.load(grad_ptr + flat, mask=jmask, other=0.0).to(tl.float32)
        rows = q_ptr + (flat // K)[:, None] * stride_q + ds[None, :]
        re = tl.load(rows, mask=mask, other=0.0).to(tl.float32) - e_re[None, :]
        im = tl.load(rows + D, mask=mask, other=0.0).to(tl.float32) - e_im[None, :]
        coef = tl.where(mask, g[:, None] / tl.sqrt(re * re + im * im + eps), 0.0)
        acc_re -= tl.sum(coef * re, axis=0)
        acc_im -= tl.sum(coef * im, axis=0)
    tl.store(gent_ptr + ent_id * 2 * D + ds, acc_re, mask=dmask)
    tl.store(gent_ptr + ent_id * 2 * D + D + ds, acc_im, mask=dmask)


def _launch_fwd(q: torch.Tensor, ent: torch.Tensor, idx: torch.Tensor | None, eps: float) -> torch.Tensor:
    rows, k = q.shape[0], ent.shape[0] if idx is None else idx.shape[1]
    out = torch.empty(rows, k, device=q.device, dtype=torch.float32)
    if rows and k:
        d = q.shape[1] // 2
        grid = (rows, triton.cdiv(k, BLOCK_K))
        _distance_fwd[grid](q, ent, ent if idx is None else idx, out, k, d, q.stride(0), ent.stride(0),
                            0 if idx is None else idx.stride(0), out.stride(0), eps, ALL=idx is None,
                            BLOCK_K=BLOCK_K, BLOCK_D=BLOCK_D)
    return out


class _Distance(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, ent: torch.Tensor, idx: torch.Tensor, eps: float) -> torch.Tensor:
        q, ent, idx = q.contiguous(), ent.contiguous(), idx.contiguous()
        ctx.save_for_backward(q, ent, idx)
        ctx.eps = eps
        return _launch_fwd(q, ent, idx, eps).to(q.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        q, ent, idx = ctx.saved_tensors
        grad = grad.contiguous().float()
        gq = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
        gent = torch.zeros(ent.shape, device=ent.device, dtype=torch.float32)
        if grad.numel():
            d, k = q.shape[1] // 2, idx.shape[1]
            blocks = triton.cdiv(d, BLOCK_D)
            _query_grad[(q.shape[0], blocks)](grad, q, ent, idx, gq, k, d, grad.stride(0), q.stride(0),
                                              ent.stride(0), idx.stride(0), ctx.eps, BLOCK_K=BLOCK_K, BLOCK_D=BLOCK_D)
            # The candidates sorted by entity, and where each entity's run starts: no host sync, no atomics.
            ids, order = torch.sort(idx.reshape(-1))
            offsets = torch.searchsorted(ids, torch.arange(ent.shape[0] + 1, device=ids.device, dtype=ids.dtype))
            _entity_grad[(ent.shape[0], blocks)](grad, q, ent, order, offsets, gent, k, d, q.stride(0), ent.stride(0),
                                                 ctx.eps, BLOCK_O=BLOCK_O, BLOCK_D=BLOCK_D)
        return gq.to(q.dtype), gent.to(ent.dtype), None, None


def rotate_distance(q: torch.Tensor, ent: torch.Tensor, idx: torch.Tensor, eps: float) -> torch.Tensor:
    """(B, 2d) queries, (N, 2d) entities, (B, K) candidate ids -> (B, K) distances, differentiable in q and ent."""
    return _Distance.apply(q, ent, idx, eps)


@torch.no_grad()
def rotate_distance_all(q: torch.Tensor, ent: torch.Tensor, eps: float) -> torch.Tensor:
    """(B, 2d) queries against every one of the (N, 2d) entities -> (B, N), without gradients."""
    return _launch_fwd(q.contiguous(), ent.contiguous(), None, eps).to(q.dtype)
