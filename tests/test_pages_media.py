"""The run page's media panel in real Chromium: the histogram view with its step slider and NaN counts,
the image at a chosen step, the sortable table and run.summary, from a W&B-style script's run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gradwatch

pytestmark = pytest.mark.browser
SCRIPT = Path(__file__).resolve().parent / "wandb_style.py"


def test_run_page_shows_histograms_images_tables_and_summary(server, page, tmp_path):
    env = {**os.environ, "GRADWATCH_SERVER": server.url, "GRADWATCH_SPOOL_DIR": str(tmp_path / "spool")}
    done = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    page.goto(server.url + "/runs/1")
    page.wait_for_selector("#run-summary dt", timeout=20000)
    summary = dict(
        zip(page.locator("#run-summary dt").all_inner_texts(), page.locator("#run-summary dd").all_inner_texts())
    )
    assert summary["best_val"] == "0.25" and float(summary["final_loss"]) > 0

    hist = page.locator(".media-card[data-key='gradients/0.weight']")
    hist.locator(".histogram-heatmap .main-svg").first.wait_for(timeout=20000)
    steps = page.evaluate(
        "() => document.querySelector(\".media-card[data-key='gradients/0.weight'] .histogram-heatmap\").data[0].x"
    )
    assert len(steps) == 4 and steps[:2] == [0, 3]  # every 3rd backward pass (epoch logs take steps of their own)
    slider = hist.locator(".media-slider input")
    slider.fill("1")
    slider.dispatch_event("input")
    assert hist.locator(".nonfinite").inner_text().startswith("step 3: NaN 0")

    images = page.locator(".media-card[data-key='samples']")
    images.locator("img").first.wait_for(timeout=20000)
    assert images.locator("figcaption").first.inner_text() == "epoch 2"  # the last step first
    images.locator(".media-slider input").fill("0")
    images.locator(".media-slider input").dispatch_event("input")
    page.wait_for_function(
        "() => document.querySelector(\".media-card[data-key='samples'] figcaption\")?.textContent === 'epoch 0'",
        timeout=20000,
    )
    widths = page.wait_for_function(
        """() => { const imgs = [...document.querySelectorAll(".media-card[data-key='samples'] img")];
          return imgs.every(i => i.complete && i.naturalWidth) && imgs.map(i => i.naturalWidth); }""",
        timeout=20000,
    ).json_value()
    assert widths == [12, 6]  # the PNGs themselves, served through the run

    tab = page.locator(".media-card[data-key='predictions'] table")
    tab.wait_for(timeout=20000)
    assert tab.locator("th").all_inner_texts() == ["step", "prediction", "label"]
    first_col = lambda: [int(t) for t in tab.locator("tbody tr td:first-child").all_inner_texts()]  # noqa: E731
    assert first_col() == list(range(12))
    tab.locator("th").first.click()
    tab.locator("th").first.click()  # again: descending
    assert first_col() == list(range(11, -1, -1))
    text = page.locator(".media-card[data-key='note'] .media-text")
    assert text.inner_text() == "epoch 2 done"
    assert not page.js_errors


def test_a_slower_answer_for_an_earlier_step_does_not_replace_the_step_chosen_since(server, page):
    """Dragging the slider asks for each step it passes; an answer that comes late (here step 1's, held
    back until step 0 is shown) must not replace the step chosen since."""
    run = gradwatch.init(project="media-race", name="r", server=server.url)
    rng = np.random.default_rng(0)
    for step in range(3):
        run.log({"samples": gradwatch.Image(rng.random((8, 8, 3)), caption=f"s{step}")}, step=step)
    run.finish(timeout=60)
    held, released = [], []

    def hold(route):
        route.continue_() if released else held.append(route)

    page.route(lambda url: "/images?" in url and "step=1" in url, hold)
    page.goto(f"{server.url}/runs/{run.id}")
    card = page.locator(".media-card[data-key='samples']")
    card.locator("figcaption").first.wait_for(timeout=20000)
    assert card.locator("figcaption").first.inner_text() == "s2"  # the last step first
    slider = card.locator(".media-slider input")
    slider.fill("1")
    slider.dispatch_event("input")
    for _ in range(400):  # until step 1's request is held
        if held:
            break
        page.wait_for_timeout(50)
    assert held
    slider.fill("0")
    slider.dispatch_event("input")
    page.wait_for_function(
        "() => document.querySelector(\".media-card[data-key='samples'] figcaption\")?.textContent === 's0'",
        timeout=20000,
    )
    released.append(True)
    for route in held:
        route.continue_()
    page.wait_for_load_state("networkidle")
    page.evaluate("() => new Promise(r => setTimeout(r, 300))")  # step 1's answer, had it been drawn
    assert card.locator("figcaption").first.inner_text() == "s0"
    assert card.locator(".media-body").get_attribute("data-step") == "0"
    assert not page.js_errors
