"""The compiled kernels, with pure-torch fallbacks: C++ on the CPU (fused RotatE distances, CSR x dense products),
Triton on CUDA (fused RotatE distances, kernels/gpu.py)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

from earl_service.atomic import write_bytes

log = logging.getLogger(__name__)

EPS = 1e-12  # keeps the modulus differentiable at 0; far below any distance that matters
_SOURCE = Path(__file__).with_name("cpu_kernels.cpp")
_extension = None
_extension_failed = False
_gpu_kernels: Any = None  # the module kernels/gpu.py once imported; False where Triton is missing or fails to import
DEFAULT_BUILD_WAIT_S = 600.0  # wait for another process's build: well past a first build (docs/training.md)
# Settings, from configure(): whether to use the C++ kernel at all, and how long a process waits for another one's
# build before it gives up on the kernel for its lifetime.
_enabled = True
_build_wait_s = DEFAULT_BUILD_WAIT_S
# `native` for this machine's CPU; an image that runs on other CPUs than the one that built it names an older
# target (docker/worker.Dockerfile: x86-64-v3), or its code may use instructions that CPU lacks.
_march = "native"

# A platform check rather than try/except ImportError, so that mypy knows which branch holds on this platform.
if sys.platform == "win32":  # not POSIX: torch's own lock file only
    fcntl = None
else:
    import fcntl


@contextlib.contextmanager
def _build_lock(build_dir: Path, timeout: float):
    """Hold the build directory for one process at a time, with a lock the kernel drops if its holder dies.

    torch's own lock is a file that exists while a build runs (FileBaton): a process killed mid-build (a worker
    stopped by SIGKILL) leaves it behind, and every later load then waits on it forever. Every loader of this
    extension takes this flock first, so while it is held a torch lock file can only be such a leftover: it is
    removed. Raises TimeoutError if another process holds the lock for longer than `timeout` seconds.
    """
    if fcntl is None:
        yield
        return
    with open(build_dir / "earl.flock", "a") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    msg = f"another process has been building {build_dir} for over {timeout:.0f} s"
                    raise TimeoutError(msg) from None  # the BlockingIOError is only the lock being busy
                time.sleep(0.2)
        try:
            stale = build_dir / "lock"
            if stale.exists():
                log.warning("removing %s, left by a build that was killed", stale)
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def configure(*, enabled: bool = True, build_wait_s: float = DEFAULT_BUILD_WAIT_S, march: str = "native") -> None:
    """How the compiled kernels load: `enabled` False keeps the pure-torch paths on CPU and CUDA (at once, even
    after a load);
    `build_wait_s` bounds the wait for a build another process holds; `march` is the compiler's -march (each value
    builds in its own folder). Settings enter here from the edge: the `earl` command reads EARL_NO_EXTENSION,
    EARL_EXTENSION_WAIT_S and EARL_KERNEL_MARCH."""
    global _enabled, _build_wait_s, _march
    _enabled, _build_wait_s, _march = enabled, float(build_wait_s), march


def _cflags() -> list[str]:
    # -fopenmp: at::parallel_for is OpenMP in these headers and runs on one thread without it. The GOMP symbols
    # resolve to the libgomp torch loads (libtorch_cpu needs it), so there is one OpenMP runtime.
    return ["-O3", f"-march={_march}", "-fopenmp", "-ffast-math"]


def build_dir() -> Path:
    """Where this source is built: one directory per CPU architecture, torch version and install, source and flags.

    -march=native code must not be reused by another kind of machine sharing the cache directory. The build
    compiles a copy of the source kept in this directory: the build files name the source's path, so compiling
    each checkout's file in place would rebuild it whenever another checkout of the same code had used the
    cache last. They also name the torch and Python installs they include and link (install_paths), so each
    environment builds in its own folder: keyed on the source and flags alone, two virtual environments sharing
    the cache (a checkout's and a benchmark worktree's, or CI's clone) rebuilt it in turn, 27-44 s on one core
    each time, and those seconds landed inside compress searches' planning (35 of the 40 s a CoDEx-S 0.5 MB
    search planned).
    """
    from torch.utils import cpp_extension

    tag = (f"{platform.machine()}_py{sys.version_info.major}{sys.version_info.minor}_"
           f"{torch.__version__.replace('.', '_').replace('+', '_')}")
    key = " ".join([*_cflags(), *install_paths()]).encode()
    digest = hashlib.sha256(_SOURCE.read_bytes() + key).hexdigest()[:12]
    # torch's own variable, read as torch's builds read it (torch's default root ignores it).
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    return Path(root) / f"earl_kernels_{tag}_{digest}"


def install_paths() -> list[str]:
    """The folders a build's command names (its -isystem and -L paths), spelt as torch spells them there: a
    worktree that links a checkout's virtual environment names it by the link's path."""
    import sysconfig

    from torch.utils import cpp_extension

    return [*cpp_extension.include_paths(), *cpp_extension.library_paths(), sysconfig.get_paths()["include"]]


def _is_built(folder: Path) -> bool:
    """Whether torch's build of this source already sits in ``folder`` (loading it then takes well under a second)."""
    return any(folder.glob(f"{folder.name}*.so")) or any(folder.glob(f"{folder.name}*.pyd"))


def _load_extension():
    """Compile (once per machine, cached by torch) and return the C++ kernel, or None if impossible."""
    global _extension, _extension_failed
    if not _enabled:
        return None
    if _extension is not None or _extension_failed:
        return _extension
    try:
        from torch.utils import cpp_extension

        folder = build_dir()
        copy = folder / _SOURCE.name
        if not copy.exists():
            write_bytes(copy, _SOURCE.read_bytes())  # atomic: a concurrent loader never compiles a partial file
        with _build_lock(folder, _build_wait_s):
            started = time.perf_counter()
            built = _is_built(folder)
            if not built:  # the first use on this machine: say why nothing seems to happen for a while
                log.info("compiling the C++ CPU kernels (once per machine, typically under a minute; cached in "
                         "%s; EARL_NO_EXTENSION=1 skips it)", folder)
            _extension = cpp_extension.load(name=folder.name, sources=[str(copy)], extra_cflags=_cflags(),
                                            build_directory=str(folder), verbose=False)
            if not built:
                log.info("C++ CPU kernels compiled in %.0f s", time.perf_counter() - started)
    except Exception as exc:  # no compiler, no headers, no ninja, a build that never ends: fall back, say so once
        log.warning("C++ CPU kernels unavailable (%s); using the slower pure-torch paths", exc)
        _extension_failed = True
    return _extension


def extension_available() -> bool:
    return _load_extension() is not None


def load_timed() -> tuple[bool, float]:
    """Build or load the kernel now, before a caller's clock starts (a first build on a machine takes 27-44 s on
    one core), so that a time budget is spent on steps: (whether it is available, seconds taken)."""
    started = time.perf_counter()
    available = extension_available()
    return available, time.perf_counter() - started


class _FusedDistance(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, ent: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        ext = _load_extension()
        q, ent, idx = q.contiguous(), ent.contiguous(), idx.contiguous()
        out, order, offsets = ext.forward(q, ent, idx, EPS)
        ctx.save_for_backward(q, ent, order, offsets)
        ctx.k = idx.shape[1]
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        q, ent, order, offsets = ctx.saved_tensors
        gq, gent = _load_extension().backward(grad, q, ent, order, offsets, ctx.k, EPS)
        return gq, gent, None


def _distance_chunk(q: torch.Tensor, ent: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    d = q.shape[1] // 2
    t = ent[idx]  # (b, K, 2d)
    re = q[:, None, :d] - t[..., :d]
    im = q[:, None, d:] - t[..., d:]
    return torch.sqrt(re * re + im * im + EPS).sum(-1)  # (b, K)


def rotate_distance_torch(q: torch.Tensor, ent: torch.Tensor, idx: torch.Tensor, chunk: int = 128) -> torch.Tensor:
    """Reference path: the same maths with plain tensor ops, chunked over the batch to bound memory."""
    parts = [_distance_chunk(q[i : i + chunk], ent, idx[i : i + chunk]) for i in range(0, q.shape[0], chunk)]
    return torch.cat(parts) if parts else q.new_zeros(idx.shape)


def _triton_kernels(q: torch.Tensor, ent: torch.Tensor):
    """kernels/gpu.py where it applies (float32 CUDA tensors, kernels enabled, Triton importable), else None."""
    global _gpu_kernels
    if not (_enabled and q.is_cuda and ent.is_cuda and q.dtype == ent.dtype == torch.float32):
        return None
    if _gpu_kernels is None:
        try:
            from earl_service.model.kernels import gpu

            _gpu_kernels = gpu
        except Exception as exc:  # no Triton on this machine: the torch path, said once
            log.warning("Triton GPU kernels unavailable (%s); using the slower pure-torch paths", exc)
            _gpu_kernels = False
    return _gpu_kernels or None


def rotate_distance(q: torch.Tensor, ent: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """dist[b, k] = sum_i |q[b, i] - ent[idx[b, k], i]| over complex dims (re in [:d], im in [d:]).

    q: (B, 2d) the rotated query (h o r for tail corruption, conj(r) o t for head corruption);
    ent: (N, 2d) entity table; idx: (B, K) candidate ids. Returns (B, K).
    """
    if q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64) and _load_extension() is not None:
        return _FusedDistance.apply(q, ent, idx)
    if (gpu := _triton_kernels(q, ent)) is not None:
        return gpu.rotate_distance(q, ent, idx, EPS)
    return rotate_distance_torch(q, ent, idx.to(torch.long))


def _kernel_reads(mat: torch.Tensor, dense: torch.Tensor) -> bool:
    """Whether the C++ kernels read mat @ dense: a 2-D CPU CSR matrix (int64 indices, float32/64 scalar values) and
    a CPU dense side in its dtype, or bfloat16 for float32. Raises torch.sparse.mm's error for mismatched shapes."""
    if mat.device.type != "cpu" or dense.device.type != "cpu" or mat.layout != torch.sparse_csr or mat.dim() != 2:
        return False
    if mat.crow_indices().dtype != torch.int64 or mat.values().dim() != 1:
        return False
    if mat.dtype not in (torch.float32, torch.float64):
        return False
    if dense.dtype != mat.dtype and not (mat.dtype == torch.float32 and dense.dtype == torch.bfloat16):
        return False
    if dense.dim() != 2 or dense.shape[0] != mat.shape[1]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({mat.shape[0]}x{mat.shape[1]} and "
                           f"{'x'.join(map(str, dense.shape))})")
    return True


def csr_mm(mat: torch.Tensor, dense: torch.Tensor, *, out_dtype: torch.dtype | None = None) -> torch.Tensor | None:
    """mat (n, m) CSR @ dense (m, w), summed in mat's dtype by the C++ kernel, written as `out_dtype` (default: mat's;
    bfloat16 for a float32 mat); None where the kernel does not apply (then use torch.sparse.mm). A bfloat16 `dense`
    (autocast) is read as is: no float32 copy of it is made."""
    bf16_out = out_dtype == torch.bfloat16 and mat.dtype == torch.float32
    if out_dtype not in (None, mat.dtype) and not bf16_out:
        return None
    ext = _load_extension() if _kernel_reads(mat, dense) else None
    if ext is None:
        return None
    return ext.csr_mm(mat.crow_indices(), mat.col_indices(), mat.values(), dense, bf16_out)


def csr_mm_sum(a: torch.Tensor, x: torch.Tensor, b: torch.Tensor, y: torch.Tensor, bias: torch.Tensor,
               ) -> torch.Tensor | None:
    """a @ x + b @ y + bias by the C++ kernel in one pass (each output row written once), in the matrices' dtype;
    x and y may be bfloat16 for float32 matrices. None where the kernel does not apply."""
    if b.dtype != a.dtype or bias.dtype != a.dtype or bias.device.type != "cpu":
        return None
    ext = _load_extension() if _kernel_reads(a, x) and _kernel_reads(b, y) else None
    if ext is None:
        return None
    return ext.csr_mm_sum(a.crow_indices(), a.col_indices(), a.values(), x, b.crow_indices(), b.col_indices(),
                          b.values(), y, bias)


@torch.no_grad()
def rotate_distance_all(q: torch.Tensor, ent: torch.Tensor, chunk: int = 16) -> torch.Tensor:
    """dist[b, j] = sum_i |q[b, i] - ent[j, i]| for every query and entity: (B, 2d), (N, 2d) -> (B, N)."""
    if q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64) and _load_extension() is not None:
        return _load_extension().all_pairs(q, ent, EPS)
    if (gpu := _triton_kernels(q, ent)) is not None:
        return gpu.rotate_distance_all(q, ent, EPS)
    d = q.shape[1] // 2
    parts = []
    for i in range(0, q.shape[0], chunk):
        diff = q[i : i + chunk, None, :] - ent[None]  # (c, N, 2d)
        parts.append(torch.sqrt(diff[..., :d] ** 2 + diff[..., d:] ** 2 + EPS).sum(-1))
    return torch.cat(parts) if parts else q.new_zeros(0, ent.shape[0])
