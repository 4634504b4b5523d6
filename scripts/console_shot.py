"""`make console-shot`: docs/console.png, the console's query view over a trained model whose answers carry labels.

Trains a model for a few minutes of CPU (skipped when RUN/bundle.safetensors exists; --retrain forces it), starts
the API with uvicorn on 127.0.0.1 with a throwaway EARL_HOME, registers the bundle, asks the query view in Debian's
Chromium (Playwright; `apt-get install chromium`) for the top-10 answers and saves the page. The default graph is
FB15k-237 from the shared datasets, whose entities.tsv / relations.tsv label every entity and relation: the bundled
CoDEx-S has relation labels only, so its answers would show ids alone.

    python scripts/console_shot.py                  # FB15k-237, 6 minutes on 2 threads, Mozart's professions
    python scripts/console_shot.py --data earl_service/demo_data/codex-s --entity Q7604 --relation P1412
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from earl_client import Client

REPO = Path(__file__).resolve().parents[1]
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "datasets" / "fb15k-237",
                        help="dataset folder with labels beside the triples (default: ../shared/datasets/fb15k-237)")
    parser.add_argument("--run", type=Path, default=REPO / "runs" / "console-shot", help="the training run folder")
    parser.add_argument("--retrain", action="store_true", help="train even when RUN already holds a bundle")
    parser.add_argument("--minutes", type=float, default=6.0, help="training budget (earl train --time-limit)")
    parser.add_argument("--threads", type=int, default=2, help="training threads")
    parser.add_argument("--dim", type=int, default=100, help="EARL's complex dimensions")
    parser.add_argument("--entity", default="Wolfgang Amadeus Mozart", help="the head, typed into the query view")
    parser.add_argument("--relation", default="/people/person/profession", help="the relation's id")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "console.png", help="where the screenshot goes")
    return parser.parse_args(argv)


def train(args: argparse.Namespace) -> Path:
    """`earl train` with the default recipe under a time limit; no validation during training, test MRR at the end."""
    bundle = args.run / "bundle.safetensors"
    if bundle.exists() and not args.retrain:
        print(f"reusing {bundle} (--retrain to train again)")
        return bundle
    if args.run.exists():
        shutil.rmtree(args.run)
    command = [sys.executable, "-m", "earl_service.cli.main", "train", str(args.data), "--out", str(args.run),
               "--dim", str(args.dim), "--time-limit", str(args.minutes), "--threads", str(args.threads),
               "--eval-every", "0", "--no-progress"]
    print("training:", " ".join(command[2:]), flush=True)
    subprocess.run(command, check=True)
    return bundle


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def api(home: Path) -> Iterator[str]:
    """uvicorn api.main:app on a free 127.0.0.1 port (no worker: the model is registered, not trained); its base URL."""
    port = free_port()
    env = {**os.environ, "EARL_HOME": str(home), "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get(
        "PYTHONPATH", "")])}
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "api.main:app", "--host", "127.0.0.1", "--port",
                               str(port), "--log-level", "warning"], cwd=REPO, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        with Client(base) as client:
            client.wait_ready(120, alive=lambda: server.poll() is None)
        yield base
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def shoot(base: str, model_id: str, args: argparse.Namespace) -> list[str]:
    """The query view at 1280x800: type the entity, pick the first suggestion, choose the relation, predict 10 tails,
    save the page; returns the answers' rows as the page shows them."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("no system Chromium: apt-get install chromium")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(f"{base}/#/query?model={model_id}")
        page.wait_for_selector(f"#relation option[value='{args.relation}']", state="attached")
        page.select_option("#relation", args.relation)
        page.fill("#entity", args.entity)
        page.wait_for_selector("#entity-options li[data-id]")  # the entity search answered: pick its best match
        page.keyboard.press("ArrowDown")
        page.keyboard.press("Enter")
        page.click("#run-query")
        page.wait_for_function("document.querySelectorAll('#predictions tbody tr').length === 10")
        page.locator("#entity").blur()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=args.out, full_page=True)
        rows = page.eval_on_selector_all("#predictions tbody tr", "rows => rows.map((r) => r.innerText)")
        browser.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bundle = train(args)
    metrics = json.loads((args.run / "metrics.json").read_text())
    print("test metrics:", json.dumps(metrics.get("test", {})))
    with tempfile.TemporaryDirectory(prefix="earl-console-shot-") as home, api(Path(home)) as base:
        with Client(base) as client:
            model_id = client.register(bundle)["id"]
        rows = shoot(base, model_id, args)
    print(f"wrote {args.out}: top-10 tails of ({args.entity}, {args.relation}, ?)")
    for row in rows:
        print("  " + " | ".join(row.split("\t")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
