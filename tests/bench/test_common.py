"""bench/harness: what every results file records about the code that produced it."""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
from harness import machine as recorder
from harness import results


def _git(repo, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


def test_commit_is_dirty_for_code_changes_only(tmp_path, monkeypatch):
    """A table rewrites its own results file after every run; that must not mark the code as modified."""
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "table.md").write_text("old\n")
    (tmp_path / "model.py").write_text("x = 1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "init")
    head = _git(tmp_path, "rev-parse", "HEAD").strip()
    monkeypatch.setattr(recorder, "REPO", tmp_path)
    monkeypatch.delenv("EARL_BENCH_COMMIT", raising=False)

    assert recorder.environment()["commit"] == head
    (tmp_path / "bench" / "results" / "table.md").write_text("new\n")
    assert recorder.environment()["commit"] == head
    (tmp_path / "model.py").write_text("x = 2\n")
    assert recorder.environment()["commit"] == head + "-dirty"


def test_the_machine_line_tells_cpus_of_one_name_apart(tmp_path, monkeypatch):
    """Machines called "AMD EPYC" differed twofold in step time: the footer names their vector features and clock."""
    if not Path("/proc/cpuinfo").exists():
        pytest.skip("reads /proc/cpuinfo (Linux)")
    monkeypatch.setattr(results, "RESULTS", tmp_path)
    machine = recorder.environment()["machine"]
    assert set(machine["cpu_features"]) <= set(recorder.CPU_FEATURES)
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    assert machine["cpu_features"] == [f for f in recorder.CPU_FEATURES if f in flags]
    _, md = results.write_results("probe", {}, "# probe")
    footer = md.read_text().splitlines()[-2]
    assert footer.startswith(f"Machine: {machine['cpu']} (") and (machine["cpu_features"] or ["no AVX2"])[0] in footer


def test_widen_ylim_keeps_run_noise_small_on_the_plot():
    """Two MRRs 0.0004 apart must not fill the axis; a range already wider than the floor is left alone."""
    plt = results.pyplot()
    fig, (close, apart) = plt.subplots(1, 2)
    close.plot([1, 2], [0.3016, 0.3012])
    apart.plot([1, 2], [0.20, 0.35])
    before = apart.get_ylim()
    results.widen_ylim(close, 0.05)
    results.widen_ylim(apart, 0.05)
    lo, hi = close.get_ylim()
    assert hi - lo == pytest.approx(0.05)
    assert lo < 0.3012 < 0.3016 < hi
    assert apart.get_ylim() == before
    plt.close(fig)


def test_recorded_command_pastes_back_into_a_shell(monkeypatch):
    """A label with spaces (`--only "EARL dim 201"`) must come back as one argument, not three."""
    argv = ["bench/paper.py", "budget", "--only", "EARL dim 201"]
    monkeypatch.setattr(sys, "argv", argv)
    assert shlex.split(recorder.environment()["command"])[1:] == argv
