"""The C++ CPU kernels (fused RotatE distances, CSR products) against the plain tensor maths (values, gradients)."""

from pathlib import Path

import pytest
import torch

from earl_service.model import kernels as kernels


@pytest.fixture(params=["cpp", "torch"])
def path(request, monkeypatch):
    if request.param == "cpp" and not kernels.extension_available():
        pytest.skip("C++ extension not built on this machine")
    if request.param == "torch":
        monkeypatch.setattr(kernels, "_load_extension", lambda: None)
    return request.param


def test_fused_distance_gradcheck(path):
    torch.manual_seed(0)
    q = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
    ent = torch.randn(20, 8, dtype=torch.float64, requires_grad=True)
    idx = torch.randint(0, 20, (5, 7))
    idx[0, :3] = 4  # repeated candidates accumulate gradient
    assert torch.autograd.gradcheck(lambda a, b: kernels.rotate_distance(a, b, idx), (q, ent))


def test_fused_distance_matches_reference(path):
    torch.manual_seed(1)
    q, ent = torch.randn(33, 40), torch.randn(100, 40)
    idx = torch.randint(0, 100, (33, 50))
    d = 20
    ref = (q[:, None, :d] - ent[idx][..., :d]).pow(2) + (q[:, None, d:] - ent[idx][..., d:]).pow(2)
    torch.testing.assert_close(kernels.rotate_distance(q, ent, idx), ref.add(1e-12).sqrt().sum(-1), rtol=1e-5, atol=1e-4)


def test_fused_distance_gradients_are_the_same_on_any_number_of_threads():
    """The backward splits entities over threads, each with its own copy of the query gradients: the sums must not
    depend on the split (3 entities and 5 threads: more threads than entities)."""
    if not kernels.extension_available():
        pytest.skip("C++ extension not built on this machine")
    gen = torch.Generator().manual_seed(3)
    threads = torch.get_num_threads()
    for n_ent in (3, 50):
        q, ent = torch.randn(17, 24, dtype=torch.float64, generator=gen), torch.randn(n_ent, 24, dtype=torch.float64,
                                                                                      generator=gen)
        idx = torch.randint(0, n_ent, (17, 11), generator=gen)
        grad = torch.randn(17, 11, dtype=torch.float64, generator=gen)
        ref = torch.autograd.grad(kernels.rotate_distance_torch(q.requires_grad_(), ent.requires_grad_(), idx), (q, ent),
                                  grad)
        try:
            for n in (1, 2, 3, 5):
                torch.set_num_threads(n)
                got = torch.autograd.grad(kernels.rotate_distance(q, ent, idx), (q, ent), grad)
                torch.testing.assert_close(got, ref)
        finally:
            torch.set_num_threads(threads)


def test_all_pairs_matches_reference(path):
    torch.manual_seed(2)
    q, ent = torch.randn(9, 12), torch.randn(70, 12)
    ref = kernels.rotate_distance(q, ent, torch.arange(70).repeat(9, 1))
    torch.testing.assert_close(kernels.rotate_distance_all(q, ent), ref.detach(), rtol=1e-5, atol=1e-4)


def test_another_checkout_of_the_same_source_reuses_the_build(tmp_path, monkeypatch):
    """The build compiles a copy of the source kept beside it: a second checkout (another path, same code)
    loads the library already built instead of rebuilding it, which cost a timed training budget its build time."""
    if not kernels.extension_available():
        pytest.skip("C++ extension not built on this machine")
    library = kernels._extension.__file__
    built_at = Path(library).stat().st_mtime_ns
    checkout = tmp_path / "other_checkout" / "cpu_kernels.cpp"
    checkout.parent.mkdir()
    checkout.write_bytes(kernels._SOURCE.read_bytes())
    monkeypatch.setattr(kernels, "_SOURCE", checkout)
    monkeypatch.setattr(kernels, "_extension", None)
    assert kernels._load_extension() is not None
    assert kernels._extension.__file__ == library and Path(library).stat().st_mtime_ns == built_at


@pytest.mark.timeout(300)
def test_a_build_lock_left_by_a_killed_process_does_not_hang_the_next_load(monkeypatch):
    """torch's build lock is a file: a worker killed mid-build left it, and every later load waited on it forever
    (a CI run hung until its time ran out). The flock every loader takes first marks such a file as a leftover."""
    if not kernels.extension_available():
        pytest.skip("C++ extension not built on this machine")
    stale = kernels.build_dir() / "lock"
    stale.touch()
    monkeypatch.setattr(kernels, "_extension", None)
    assert kernels._load_extension() is not None
    assert not stale.exists()


_HOLD_LOCK = """
import sys, time
from pathlib import Path
from earl_service.model import kernels as kernels
with kernels._build_lock(Path(sys.argv[1]), timeout=10):
    print("held", flush=True)
    time.sleep(120)
"""


@pytest.mark.skipif(kernels.fcntl is None, reason="flock is POSIX only")
def test_the_build_lock_waits_a_bounded_time_and_dies_with_its_holder(tmp_path):
    import signal
    import subprocess
    import sys

    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(TimeoutError, match="over 1 s"), kernels._build_lock(tmp_path, timeout=1.0):
            pass
        holder.send_signal(signal.SIGKILL)  # no cleanup runs: the kernel drops the flock
        holder.wait(timeout=10)
        (tmp_path / "lock").touch()  # what a killed torch build leaves
        with kernels._build_lock(tmp_path, timeout=10.0):
            assert not (tmp_path / "lock").exists()
    finally:
        holder.kill()
        holder.wait()


def test_configure_turns_the_kernel_off_and_on(monkeypatch):
    """Settings enter as arguments: configure(enabled=False) keeps the pure-torch path, whatever was loaded."""
    monkeypatch.setattr(kernels, "_enabled", kernels._enabled)  # restored after the test
    monkeypatch.setattr(kernels, "_build_wait_s", kernels._build_wait_s)
    was_available = kernels.extension_available()
    kernels.configure(enabled=False, build_wait_s=5)
    assert not kernels.extension_available() and kernels._build_wait_s == 5.0
    q, ent, idx = torch.randn(3, 8), torch.randn(10, 8), torch.randint(0, 10, (3, 4))
    torch.testing.assert_close(kernels.rotate_distance(q, ent, idx), kernels.rotate_distance_torch(q, ent, idx))
    kernels.configure()
    assert kernels.extension_available() is was_available


def test_the_earl_command_reads_the_kernel_settings_from_the_environment(monkeypatch):
    from earl_service.cli.main import _configure_kernels

    monkeypatch.setattr(kernels, "_enabled", kernels._enabled)
    monkeypatch.setattr(kernels, "_build_wait_s", kernels._build_wait_s)
    _configure_kernels({})  # nothing set: the library's defaults stay
    assert kernels._enabled and kernels._build_wait_s == 600.0
    _configure_kernels({"EARL_NO_EXTENSION": "1", "EARL_EXTENSION_WAIT_S": "7"})
    assert not kernels.extension_available() and kernels._build_wait_s == 7.0


def test_kernel_march_is_a_setting_with_its_own_build_folder(monkeypatch):
    """An image names an older -march than `native` (docker/worker.Dockerfile); each target builds apart."""
    from earl_service.cli.main import _configure_kernels

    monkeypatch.setattr(kernels, "_march", kernels._march)
    native = kernels.build_dir()
    assert "-march=native" in kernels._cflags()
    _configure_kernels({"EARL_KERNEL_MARCH": "x86-64-v3"})
    assert "-march=x86-64-v3" in kernels._cflags() and "-march=native" not in kernels._cflags()
    assert kernels.build_dir() != native and kernels.build_dir().parent == native.parent


def test_each_torch_install_builds_in_its_own_folder(monkeypatch):
    """The build command names torch's include and library folders: two virtual environments sharing the cache
    (a checkout's, a worktree's or CI's clone) must not rebuild one folder in turn."""
    from torch.utils import cpp_extension

    here = kernels.build_dir()
    assert kernels.build_dir() == here  # the same install: the same folder, built once
    other = [p.replace("site-packages", "other-env") for p in cpp_extension.include_paths()]
    monkeypatch.setattr(cpp_extension, "include_paths", lambda *a, **k: other)
    assert kernels.build_dir() != here and kernels.build_dir().parent == here.parent


def test_importing_the_kernels_reads_no_environment():
    import subprocess
    import sys

    code = ("import os; os.environ['EARL_NO_EXTENSION'] = '1'; os.environ['EARL_EXTENSION_WAIT_S'] = 'x'; "
            "from earl_service.model import kernels; assert kernels._enabled and kernels._build_wait_s == 600.0")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_build_announces_itself_and_a_built_kernel_loads_quietly(tmp_path, monkeypatch, caplog):
    """A first build takes a while (a minute on a small CPU): a log line says so before it starts, and the `earl`
    command shows that line without -v. A kernel already built loads without a word."""
    from torch.utils import cpp_extension

    from earl_service.cli.main import NOTICES

    def fake_build(name, build_directory, **_):
        (Path(build_directory) / f"{name}.so").write_bytes(b"")  # what torch leaves: the library, named so
        return object()

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(cpp_extension, "load", fake_build)
    for attribute in ("_extension", "_extension_failed", "_enabled"):
        monkeypatch.setattr(kernels, attribute, {"_enabled": True}.get(attribute))
    with caplog.at_level("INFO", logger="earl_service.model.kernels"):
        assert kernels._load_extension() is not None
    assert "compiling the C++ CPU kernels" in caplog.messages[0] and "compiled in" in caplog.messages[1]
    caplog.clear()
    monkeypatch.setattr(kernels, "_extension", None)
    with caplog.at_level("INFO", logger="earl_service.model.kernels"):
        assert kernels._load_extension() is not None
    assert caplog.messages == []
    assert "earl_service.model.kernels" in NOTICES


def _random_csr(n: int, m: int, nnz: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    from earl_service.model.graph import _csr

    gen = torch.Generator().manual_seed(seed)
    rows, cols = torch.randint(0, n, (nnz,), generator=gen), torch.randint(0, m, (nnz,), generator=gen)
    return _csr(rows, cols, torch.rand(nnz, generator=gen, dtype=torch.float64).to(dtype), (n, m))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_csr_kernel_equals_torch_sparse_mm(dtype):
    mat = _random_csr(50, 70, 300, dtype)  # some rows empty, some columns repeated
    dense = torch.randn(70, 33, dtype=dtype)
    out = kernels.csr_mm(mat, dense)
    assert out is not None and out.dtype == dtype
    torch.testing.assert_close(out, torch.sparse.mm(mat, dense))


def test_csr_kernel_reads_bfloat16_rows_and_accumulates_in_float32():
    mat = _random_csr(40, 60, 400, torch.float32)
    dense = torch.randn(60, 16).bfloat16()
    out = kernels.csr_mm(mat, dense)
    assert out is not None and out.dtype == torch.float32
    torch.testing.assert_close(out, torch.sparse.mm(mat, dense.float()), rtol=1e-5, atol=1e-5)  # same inputs


def test_csr_kernel_refuses_a_column_beyond_the_dense_rows_and_bad_row_pointers():
    mat = _random_csr(5, 10, 20, torch.float32)
    ext = kernels._load_extension()  # the C++ checks themselves, below the Python shape check
    crow, col, val = mat.crow_indices(), mat.col_indices(), mat.values()
    with pytest.raises(RuntimeError, match="out of x's rows"):
        ext.csr_mm(crow, col, val, torch.randn(4, 3), False)
    bad = crow.clone()
    bad[2] = bad[3] + 1  # decreasing
    with pytest.raises(RuntimeError, match="malformed CSR row pointers"):
        ext.csr_mm(bad, col, val, torch.randn(10, 3), False)


def test_sparse_products_backpropagate_through_the_kernel_as_through_torch(monkeypatch):
    from earl_service.model.graph import SparsePair

    mat = _random_csr(30, 45, 200, torch.float64)
    pair = SparsePair(mat, mat.t().to_sparse_csr())
    dense = torch.randn(45, 8, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(30, 8, dtype=torch.float64)
    (grad_kernel,) = torch.autograd.grad(((pair @ dense) * weights).sum(), dense)
    monkeypatch.setattr("earl_service.model.graph.csr_mm", lambda mat, dense, out_dtype: None)  # torch.sparse.mm instead
    (grad_torch,) = torch.autograd.grad(((pair @ dense) * weights).sum(), dense)
    torch.testing.assert_close(grad_kernel, grad_torch)
    torch.testing.assert_close(grad_kernel, mat.to_dense().T @ weights)


def test_csr_kernel_writes_bfloat16_from_float32_sums():
    mat = _random_csr(40, 60, 400, torch.float32)
    dense = torch.randn(60, 16)
    out = kernels.csr_mm(mat, dense, out_dtype=torch.bfloat16)
    assert out is not None and out.dtype == torch.bfloat16
    torch.testing.assert_close(out, torch.sparse.mm(mat, dense).bfloat16())  # one rounding, at the end


@pytest.mark.parametrize("low", [False, True])
def test_one_pass_aggregation_equals_two_products_and_a_bias(low):
    a, b = _random_csr(50, 90, 400, torch.float32), _random_csr(50, 6, 80, torch.float32, seed=1)
    x, y, bias = torch.randn(90, 12), torch.randn(6, 12), torch.randn(12)
    if low:  # autocast's bf16 transforms, read as they are
        x, y = x.bfloat16(), y.bfloat16()
    out = kernels.csr_mm_sum(a, x, b, y, bias)
    assert out is not None and out.dtype == torch.float32
    torch.testing.assert_close(out, torch.sparse.mm(a, x.float()) + torch.sparse.mm(b, y.float()) + bias)


def test_aggregation_backpropagates_through_the_kernel_as_through_torch(monkeypatch):
    from earl_service.model.graph import SparsePair, aggregate

    mats = [_random_csr(30, m, 150, torch.float64, seed=m) for m in (45, 4)]
    a, b = (SparsePair(m, m.t().to_sparse_csr()) for m in mats)
    x, y, bias = (torch.randn(*shape, dtype=torch.float64, requires_grad=True) for shape in ((45, 8), (4, 8), (8,)))
    weights = torch.randn(30, 8, dtype=torch.float64)
    kernel = torch.autograd.grad((aggregate(a, x, b, y, bias) * weights).sum(), (x, y, bias))
    monkeypatch.setattr("earl_service.model.graph.csr_mm_sum", lambda *args: None)
    monkeypatch.setattr("earl_service.model.graph.csr_mm", lambda mat, dense, out_dtype: None)
    plain = torch.autograd.grad((aggregate(a, x, b, y, bias) * weights).sum(), (x, y, bias))
    for got, want in zip(kernel, plain, strict=True):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(kernel[2], weights.sum(0))


def test_csr_kernel_splits_skewed_rows_over_threads_with_the_same_result():
    from earl_service.model.graph import _csr

    rows = torch.cat([torch.zeros(500, dtype=torch.long), torch.arange(1, 40)])  # row 0 holds most entries
    cols = torch.randint(0, 30, (rows.numel(),), generator=torch.Generator().manual_seed(0))
    mat = _csr(rows, cols, torch.rand(rows.numel(), dtype=torch.float64), (40, 30))
    dense = torch.randn(30, 7, dtype=torch.float64)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            torch.testing.assert_close(kernels.csr_mm(mat, dense), torch.sparse.mm(mat, dense))
    finally:
        torch.set_num_threads(threads)


def test_csr_kernel_refuses_a_dense_side_of_the_wrong_height_as_torch_does():
    mat = _random_csr(5, 10, 20, torch.float32)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        torch.sparse.mm(mat, torch.randn(12, 3))
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        kernels.csr_mm(mat, torch.randn(12, 3))


def test_csr_kernel_leaves_int32_indices_to_torch():
    mat = _random_csr(5, 10, 20, torch.float32)
    narrow = torch.sparse_csr_tensor(mat.crow_indices().int(), mat.col_indices().int(), mat.values(), mat.shape,
                                     check_invariants=True)
    assert kernels.csr_mm(narrow, torch.randn(10, 3)) is None
