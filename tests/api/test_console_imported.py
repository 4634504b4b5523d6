"""The console with an imported model, in a real headless Chromium against a live uvicorn and worker on
127.0.0.1: the model view says where it was imported from and offers a compress job over it (not extend), a budget
below its smallest size shows the API's reason, a good one runs to a new model with its report, and the query
view answers from it as GET /predict does. The tests run in file order and share one service and one tab."""

import shutil

import httpx
import pytest
from conftest import api_and_worker
from test_compress_model_jobs import imported_model

from earl_service.bundle.model_io import load_bundle

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed (pip install -e '.[dev]')")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no system Chromium (apt-get install chromium)")

TOKEN = "console-imported-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WAIT_MS = 300_000  # a search of three sizes: seconds on an idle core, minutes on a shared one


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """The API and one worker, with an imported DistMult model registered; (base URL, model, its bundle file)."""
    path = imported_model(tmp_path_factory.mktemp("imported"))
    with api_and_worker(tmp_path_factory.mktemp("home"), {"EARL_API_TOKEN": TOKEN}) as base:
        r = httpx.post(f"{base}/models", files={"bundle": ("m.safetensors", path.read_bytes())}, headers=AUTH)
        assert r.status_code == 201, r.text
        yield base, r.json(), path


@pytest.fixture(scope="module")
def page(service):
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        context = browser.new_context(viewport={"width": 1280, "height": 800}, base_url=service[0])
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        yield page
        browser.close()
        assert not errors, errors


def test_the_model_view_shows_the_import_and_offers_compress(page, service):
    _, model, _ = service
    page.goto(f"/#/models/{model['id']}")
    page.wait_for_selector("#model-sha256")
    assert "arrays (scorer distmult)" in page.inner_text("dl.figures")
    assert page.get_by_text("None: this model was imported").is_visible()
    assert page.locator("#compress-form").is_visible() and page.locator("#extend-file").count() == 0


def test_a_budget_below_the_smallest_size_shows_the_reason(page, service):
    page.fill("#compress-max_bytes", "100")
    page.click("#compress-form button[type=submit]")
    page.wait_for_selector("#token-dialog[open]")  # a write without the token: 401, the prompt
    page.keyboard.type(TOKEN)
    page.keyboard.press("Enter")
    page.wait_for_selector("#compress-error:not(:empty)")
    assert "below the smallest size" in page.inner_text("#compress-error")


def test_a_compress_job_runs_to_a_new_model_with_its_report(page, service):
    base, model, path = service
    budget = load_bundle(path).num_bytes // 3  # int8 fits, fp16 does not
    page.fill("#compress-max_bytes", str(budget))
    page.fill("#compress-time_limit", "0.5")
    page.click("#compress-form button[type=submit]")
    page.wait_for_selector("#job-model", timeout=WAIT_MS)
    assert "size 3 / 3" in page.inner_text("#job-facts")
    page.click("#job-model")
    page.wait_for_selector("#model-sha256")
    made = httpx.get(f"{base}/models/{page.url.rsplit('/', 1)[1]}", headers=AUTH).json()
    assert made["precision"] == "int8" and made["bytes"] <= budget
    page.click("text=Report (markdown)")
    assert f"model {model['id']} version 1" in page.inner_text("pre.report")
    page.wait_for_selector("text=No frontier plot.")
    page.goto(f"/#/query?model={made['id']}")
    page.wait_for_selector("#relation option[value=r1]", state="attached")
    page.select_option("#relation", "r1")
    page.fill("#entity", "e0")
    page.keyboard.press("Enter")
    page.wait_for_selector("#predictions tbody tr")
    shown = page.eval_on_selector_all("#predictions tbody tr", "rows => rows.map((r) => r.dataset.entity)")
    want = httpx.get(f"{base}/predict", params={"model": made["id"], "head": "e0", "relation": "r1"}, headers=AUTH)
    assert shown == [p["entity"] for p in want.json()["predictions"]]


def test_a_compress_job_with_train_and_valid_files_scores_each_size(page, service):
    """The same form with the model's graph attached: each size is scored on valid, and the report has its plot."""
    base, model, path = service
    page.goto(f"/#/models/{model['id']}")
    page.wait_for_selector("#compress-form")
    page.fill("#compress-max_bytes", str(load_bundle(path).num_bytes // 3))
    page.fill("#compress-time_limit", "0.5")
    for split in ("train", "valid"):
        page.set_input_files(f"#compress-{split}", str(path.parent / "data" / f"{split}.txt"))
    page.click("#compress-form button[type=submit]")
    page.wait_for_selector("#job-model", timeout=WAIT_MS)
    page.click("#job-model")
    page.wait_for_selector("#model-sha256")
    report = httpx.get(f"{base}/models/{page.url.rsplit('/', 1)[1]}/report", headers=AUTH).json()
    assert report["graph"] == "the job's uploads" and report["original"]["mrr"] > 0.5
    page.wait_for_selector("#frontier[src^='blob:']")

