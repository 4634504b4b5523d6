"""atomic: a replaced file is the old one or the whole new one; fsync on request, before the rename."""

import os

import pytest

from earl_service import atomic


def test_write_bytes_replaces_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "sub" / "f.bin"
    atomic.write_bytes(path, b"old")
    assert atomic.write_bytes(path, b"new") == path
    assert path.read_bytes() == b"new" and os.listdir(path.parent) == ["f.bin"]


def test_a_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic.replacing(path) as tmp:
        tmp.write_bytes(b"partial")
        raise RuntimeError("killed mid-write")
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["f.bin"]


@pytest.mark.parametrize("fsync", [True, False])
def test_fsync_flushes_the_temporary_before_the_rename(tmp_path, monkeypatch, fsync):
    path, synced = tmp_path / "f.bin", []
    real_fsync = os.fsync

    def recording_fsync(fd):
        synced.append((os.fstat(fd).st_ino, path.exists()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    atomic.write_bytes(path, b"data", fsync=fsync)
    assert path.read_bytes() == b"data"
    if fsync:  # the file that became `path` (a rename keeps the inode), while `path` did not exist yet
        ((inode, existed),) = synced
        assert inode == path.stat().st_ino and not existed
    else:
        assert synced == []
