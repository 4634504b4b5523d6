"""`earl keys create|list|revoke` on a service home: the key is printed once, works against an API sharing the
home, and stops working once revoked."""

import json
import time

from fastapi.testclient import TestClient

from api.main import create_app
from api.settings import Settings
from earl_service.cli.main import main


def run(capsys, *argv: str):
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_a_key_made_on_the_command_line_works_until_revoked(tmp_path, capsys):
    home = ["--home", str(tmp_path)]
    made = run(capsys, "keys", "create", "ci", "--tenant", "acme", "--scope", "write", *home)
    assert made["key"].startswith(f"earl_{made['id']}_") and made["scopes"] == ["write"]
    listed = run(capsys, "keys", "list", *home)
    assert [k["id"] for k in listed] == [made["id"]] and made["key"] not in json.dumps(listed)
    with TestClient(create_app(Settings(home=tmp_path))) as client:
        headers = {"Authorization": f"Bearer {made['key']}"}
        assert client.get("/models", headers=headers).status_code == 200
        assert client.get("/models").status_code == 401  # a key exists: reads need one
        assert run(capsys, "keys", "revoke", made["id"], *home)["revoked"] is not None
        deadline = time.monotonic() + 30  # a revoke from elsewhere is seen within KEY_RING_SECONDS
        while client.get("/models", headers=headers).status_code != 401:
            assert time.monotonic() < deadline, "the revoked key still works"
            time.sleep(0.2)


def test_bad_input_is_an_error_message(tmp_path, capsys):
    assert main(["keys", "create", "a b", "--tenant", "acme", "--home", str(tmp_path)]) == 2
    assert "is not a name" in capsys.readouterr().err
    assert main(["keys", "revoke", "0" * 12, "--home", str(tmp_path)]) == 2
    assert "not found" in capsys.readouterr().err
