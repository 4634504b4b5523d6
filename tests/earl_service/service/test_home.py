"""The service home's install secret: made once, 0600, the same for every process sharing the home."""

import stat
import threading

import pytest

from earl_service.errors import ConfigError
from earl_service.service.home import SECRET_FILE, ServiceHome


def test_the_secret_is_made_once_readable_by_its_owner_only(tmp_path):
    home = ServiceHome(tmp_path).create()
    first = home.secret()
    assert len(first) == 32 and ServiceHome(tmp_path).secret() == first  # read back, not made again
    assert stat.S_IMODE((tmp_path / SECRET_FILE).stat().st_mode) == 0o600
    assert ServiceHome(tmp_path / "other").create().secret() != first
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left


def test_processes_making_it_at_once_share_one(tmp_path):
    home = ServiceHome(tmp_path).create()
    got, start = [], threading.Barrier(8)

    def make():
        start.wait()
        got.append(home.secret())

    threads = [threading.Thread(target=make) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(got) == 8 and len(set(got)) == 1


@pytest.mark.parametrize(("content", "mode", "message"), [(b"short", 0o600, "not the 32"),
                                                          (b"x" * 32, 0o644, "chmod 600")])
def test_a_damaged_or_readable_secret_is_refused(tmp_path, content, mode, message):
    path = tmp_path / SECRET_FILE
    path.write_bytes(content)
    path.chmod(mode)
    with pytest.raises(ConfigError, match=message):
        ServiceHome(tmp_path).secret()
