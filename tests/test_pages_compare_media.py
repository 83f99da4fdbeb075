"""Compare's media section in real Chromium: two runs that logged images and histograms through the
client, side by side at one shared step slider (each run at its last step at or before the chosen one)."""

from __future__ import annotations

import numpy as np
import pytest

import gradwatch

pytestmark = pytest.mark.browser


def _run(url, name, image_steps, histogram_steps):
    run = gradwatch.init(project="cmp-media", name=name, server=url)
    rng = np.random.default_rng(0)
    for step in sorted(set(image_steps) | set(histogram_steps)):
        data = {"loss": 1.0 / (step + 1)}
        if step in image_steps:
            data["samples"] = gradwatch.Image(rng.random((8, 8, 3)), caption=f"{name}@{step}")
        if step in histogram_steps:
            data["weights"] = gradwatch.Histogram(rng.normal(step, 1.0, 500))
        run.log(data, step=step)
    run.finish(timeout=60)
    return run.id


def _shown(page):
    """run id -> (the step it shows, its captions) in the media section."""
    return page.evaluate(
        """() => Object.fromEntries([...document.querySelectorAll('.compare-media-run')].map(c =>
             [c.dataset.run, [c.dataset.step, [...c.querySelectorAll('figcaption')].map(f => f.textContent)]]))"""
    )


def _slide(page, index):
    slider = page.locator(".compare-media .media-slider input")
    slider.fill(str(index))
    slider.dispatch_event("input")


def test_compare_shows_each_runs_images_and_histograms_at_one_step(server, page):
    a = _run(server.url, "a", image_steps=[0, 4], histogram_steps=[0, 2, 4])
    b = _run(server.url, "b", image_steps=[2], histogram_steps=[1, 3])
    page.goto(f"{server.url}/compare?ids={a},{b}")
    page.wait_for_selector(".compare-media .media-key", timeout=20000)
    page.select_option(".compare-media .media-key", "samples")
    page.wait_for_function(
        "() => [...document.querySelectorAll('.compare-media-run img')].filter(i => i.complete && i.naturalWidth).length === 2",
        timeout=20000,
    )
    # the slider runs over both runs' steps (0, 2, 4) and starts at the last
    assert _shown(page) == {str(a): ["4", ["a@4"]], str(b): ["2", ["b@2"]]}
    _slide(page, 1)  # step 2: run a's last image by then is step 0's
    page.wait_for_function(
        "() => document.querySelector('.compare-media-run figcaption')?.textContent === 'a@0'", timeout=20000
    )
    assert _shown(page) == {str(a): ["0", ["a@0"]], str(b): ["2", ["b@2"]]}
    _slide(page, 0)  # step 0: run b had logged no image yet
    page.wait_for_function(f"() => document.querySelector(\".compare-media-run[data-run='{b}']\").dataset.step === ''")
    assert "nothing at or before step 0" in page.inner_text(f".compare-media-run[data-run='{b}']")

    page.select_option(".compare-media .media-key", "weights")
    drawn = "(sel) => [...document.querySelectorAll(sel)].filter(d => d.querySelector('.main-svg')).length"
    page.wait_for_function(f"() => ({drawn})(\".compare-media-run[data-kind='histogram'] .histogram-heatmap\") === 2")
    heat_steps = page.evaluate(
        "() => [...document.querySelectorAll('.compare-media-run .histogram-heatmap')].map(d => d.data[0].x)"
    )
    assert heat_steps == [[0, 2, 4], [1, 3]]
    _slide(page, 1)  # steps 0..4 of both runs: step 1
    page.wait_for_function(
        f"() => document.querySelector(\".compare-media-run[data-run='{b}'] .nonfinite\").textContent.startsWith('step 1:')"
    )
    shown = _shown(page)
    assert shown[str(a)][0] == "0" and shown[str(b)][0] == "1"
    assert page.evaluate(f"() => ({drawn})('.compare-media-run .histogram-bars')") == 2
    assert not page.js_errors


def test_a_key_picked_while_the_first_still_loads_stays_shown(server, page):
    """The picker is there before the first key's data: a pick made meanwhile is not replaced when that slower,
    earlier key's data comes in (a race that once turned the images back into histograms mid-test)."""
    a = _run(server.url, "a", image_steps=[0], histogram_steps=[0])
    b = _run(server.url, "b", image_steps=[0], histogram_steps=[0])
    held, released = [], []

    def hold(route):
        route.continue_() if released else held.append(route)

    page.route("**/api/runs/*/histograms?*", hold)
    page.route("**/api/runs/*/images?*", hold)
    page.goto(f"{server.url}/compare?ids={a},{b}")
    page.wait_for_selector(".compare-media .media-key", timeout=20000)
    first = page.input_value(".compare-media .media-key")
    other, kind = ("samples", "image") if first == "weights" else ("weights", "histogram")
    released.append(True)  # the pick's own requests go through ...
    page.select_option(".compare-media .media-key", other)
    page.wait_for_selector(f".compare-media-run[data-kind='{kind}']", timeout=20000)
    assert held  # ... while the first key's were held until now
    for route in held:
        route.continue_()
    page.wait_for_load_state("networkidle")
    page.evaluate("() => new Promise(r => setTimeout(r, 300))")  # the first key's columns, had they been drawn
    kinds = page.evaluate("() => [...document.querySelectorAll('.compare-media-run')].map(c => c.dataset.kind)")
    assert kinds == [kind, kind]
    assert page.input_value(".compare-media .media-key") == other
    assert not page.js_errors
