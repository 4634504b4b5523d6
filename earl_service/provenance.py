"""Where a run came from: library version, git commit, torch and python versions, each split's sha256, command."""

from __future__ import annotations

import hashlib
import platform
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from earl_service.version import __version__

# Bounds that keep metrics.json's copy in a bundle far inside bundle_format.METADATA_LIMITS["metrics"] (64 KiB).
MAX_COMMAND_CHARS = 2000
MAX_PATH_CHARS = 300
_PACKAGE = Path(__file__).resolve().parent


def provenance(splits: dict[str, dict[str, Any]], *, command: Sequence[str] | None = None) -> dict[str, Any]:
    """The run's origin for metrics.json (and so for its bundle): ``splits`` is Dataset.stats (file, sha256);
    ``command`` defaults to this process's command line."""
    return {
        "library_version": __version__,
        "git_commit": git_commit(),
        "torch": _version("torch"),
        "python": platform.python_version(),
        "data": {split: {"file": _clipped(str(stats.get("file", "")), MAX_PATH_CHARS), "sha256": stats.get("sha256")}
                 for split, stats in splits.items() if "sha256" in stats},  # splits, not stats["labels"]
        "command": _clipped(" ".join(sys.argv if command is None else command), MAX_COMMAND_CHARS),
    }


def git_commit(package: Path = _PACKAGE) -> str | None:
    """HEAD of the git checkout this package is a tracked part of (``-dirty`` with uncommitted changes to tracked
    files); None when it is installed from a wheel, git is missing, or anything else goes wrong."""
    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(package), *args], capture_output=True, text=True, timeout=10)

    try:
        # A site-packages copy may sit inside someone else's repository: the package's own file must be tracked.
        if git("ls-files", "--error-unmatch", "__init__.py").returncode != 0:
            return None
        head = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def file_sha256(path: str | Path) -> str:
    """The hex sha256 of a file's bytes (as `sha256sum` prints it), read a MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        module = sys.modules.get(package)
        return getattr(module, "__version__", None)


def _clipped(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


__all__ = ["file_sha256", "git_commit", "provenance"]
