"""The web console with API keys (issue 56) in a real headless Chromium against a live `earl serve`-style uvicorn
on 127.0.0.1: a read-only key browses its tenant's models and asks queries, and its writes (a job, a cancel, a
delete) show the 403's reason; a write key, set through the header's key button, starts and cancels a job.
The tests run in file order and share one server and one tab."""

from __future__ import annotations

import shutil

import httpx
import pytest
from conftest import codex_s_path
from live import live
from tenants import ADMIN, TOKEN, TRAIN

from api.main import create_app
from api.settings import Settings

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed (pip install -e '.[dev]')")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no system Chromium (apt-get install chromium)")

TENANT = "acme"
SCOPE_REFUSAL = "lacks the 'write' scope"


def new_key(base: str, name: str, scope: str, tenant: str = TENANT) -> str:
    r = httpx.post(f"{base}/keys", json={"name": name, "tenant": tenant, "scopes": [scope]}, headers=ADMIN)
    assert r.status_code == 201, r.text
    return r.json()["key"]


@pytest.fixture(scope="module")
def service(tmp_path_factory, codex_bundle):
    """The server (a token for the admin, no worker: jobs stay queued) with acme's read and write keys, a model
    and a queued job of acme's, and a model of another tenant."""
    settings = Settings(home=tmp_path_factory.mktemp("home"), api_token=TOKEN)
    with live(create_app(settings), settings=settings) as base:
        keys = {scope: new_key(base, f"{scope}-key", scope) for scope in ("read", "write")}
        writer = {"Authorization": f"Bearer {keys['write']}"}
        bundle = {"bundle": ("codex.safetensors", codex_bundle.read_bytes())}
        model = httpx.post(f"{base}/models", files=bundle, headers=writer, timeout=120)
        job = httpx.post(f"{base}/jobs", files=TRAIN, headers=writer)
        other = httpx.post(f"{base}/models", files=bundle, timeout=120,
                           headers={"Authorization": f"Bearer {new_key(base, 'other', 'write', 'globex')}"})
        assert (model.status_code, job.status_code, other.status_code) == (201, 202, 201)
        yield {"base": base, "keys": keys, "model": model.json()["id"], "job": job.json()["id"],
               "other": other.json()["id"], "writer": writer}


@pytest.fixture(scope="module")
def page(service):
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page(base_url=service["base"])
        page.errors = []
        page.on("pageerror", lambda error: page.errors.append(str(error)))
        yield page
        browser.close()
    assert not page.errors, page.errors


def view(page, hash: str) -> None:
    """Show a view as a link does (the tab, and the key in its memory, stay); returns once it has rendered."""
    page.evaluate("""(hash) => {
        if (location.hash === hash) window.dispatchEvent(new HashChangeEvent("hashchange"));
        else location.hash = hash;
    }""", hash)
    page.wait_for_function("(hash) => document.getElementById('main').dataset.rendered === hash", arg=hash)


def enter_key(page, key: str) -> None:
    page.wait_for_selector("#token-dialog[open]")
    page.fill("#token-input", key)
    page.keyboard.press("Enter")


def key_id(key: str) -> str:
    return "earl_" + key.split("_")[1]


def test_a_read_key_is_asked_for_and_lists_only_its_tenants_models(page, service):
    page.goto("/")
    enter_key(page, service["keys"]["read"])  # reads need a key once one exists: 401, the prompt
    page.wait_for_selector("#models-table")
    shown = page.eval_on_selector_all("#models-table tbody tr", "rows => rows.map((r) => r.dataset.model)")
    assert shown == [service["model"]]  # not globex's
    assert page.inner_text("#key-button") == f"API key: key {key_id(service['keys']['read'])}"
    assert service["keys"]["read"] not in page.content()  # the key's secret is never on the page
    assert page.evaluate("localStorage.length + sessionStorage.length") == 0


def test_a_read_key_asks_queries(page, service):
    view(page, f"#/query?model={service['model']}")
    page.wait_for_selector("#relation option[value=P1412]", state="attached")
    page.select_option("#relation", "P1412")
    page.fill("#entity", "Q7604")
    page.fill("#k", "5")
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.querySelectorAll('#predictions tbody tr').length === 5")
    assert 'Bearer $EARL_KEY' in page.inner_text("#curl-line")


def test_a_read_keys_job_is_refused_with_the_reason(page, service, tmp_path):
    view(page, "#/upload")
    page.wait_for_selector("#upload-form")
    train = tmp_path / "train.txt"
    train.write_bytes(TRAIN["train"][1])
    page.set_input_files("#file-train", train)
    page.click("#submit-job")
    page.wait_for_selector("#form-error .note.error")
    refusal = page.inner_text("#form-error")
    assert refusal.startswith("403: ") and SCOPE_REFUSAL in refusal and "API key" in refusal
    assert page.url.endswith("#/upload")  # stayed: no job was made
    assert len(httpx.get(f"{service['base']}/jobs", headers=service["writer"]).json()) == 1


def test_a_read_keys_cancel_and_delete_are_refused_with_the_reason(page, service):
    view(page, f"#/jobs/{service['job']}")
    page.click("#cancel-job")
    page.wait_for_selector("#cancel-error .note.error")
    assert SCOPE_REFUSAL in page.inner_text("#cancel-error")
    page.wait_for_selector("#cancel-job:not([disabled])")  # may be tried again, with another key
    view(page, f"#/models/{service['model']}")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("button:has-text('Delete model')")
    page.wait_for_selector("section[aria-labelledby=delete-title] .note.error")
    assert SCOPE_REFUSAL in page.inner_text("section[aria-labelledby=delete-title]")
    base, writer = service["base"], service["writer"]
    assert httpx.get(f"{base}/jobs/{service['job']}", headers=writer).json()["state"] == "queued"
    assert httpx.get(f"{base}/models/{service['model']}", headers=writer).status_code == 200


def test_a_write_key_from_the_key_button_starts_and_cancels_a_job(page, service):
    view(page, "#/upload")
    page.wait_for_selector("#upload-form")
    page.evaluate("delete document.getElementById('main').dataset.rendered")  # the view is shown again next
    page.click("#key-button")
    enter_key(page, service["keys"]["write"])
    page.wait_for_selector(f"#key-button:has-text('{key_id(service['keys']['write'])}')")
    page.wait_for_function("() => document.getElementById('main').dataset.rendered === '#/upload'")
    page.set_input_files("#file-train", codex_s_path() / "train.txt")
    page.fill("#opt-dim", "16")
    page.click("#submit-job")
    page.wait_for_url("**/#/jobs/*")
    job = page.url.rsplit("/", 1)[1]
    page.wait_for_selector("#job-state [data-state=queued]")
    page.click("#cancel-job")
    page.wait_for_selector("#job-state [data-state=cancelled]")
    shown = httpx.get(f"{service['base']}/jobs/{job}", headers=service["writer"]).json()
    assert shown["state"] == "cancelled" and shown["params"]["tenant"] == TENANT


def test_forgetting_the_key_asks_again(page, service):
    view(page, "#/")
    page.click("#key-button")
    page.wait_for_selector("#token-dialog[open]")
    page.click("#token-dialog button[value=forget]")
    page.wait_for_selector("#key-button:text-is('API key: none')")
    page.wait_for_selector("#token-dialog[open]")  # the models view again, without a key: 401, the prompt
    page.keyboard.press("Escape")
    page.wait_for_selector("main .note.error")
    assert "401" in page.inner_text("main")
