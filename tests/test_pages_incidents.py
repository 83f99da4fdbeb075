"""Incidents in real Chromium: one card per problem on the run page (expandable, with its story and cause),
the buttons that acknowledge and resolve it, the inbox across runs, and the counts in the runs list."""

from __future__ import annotations

from conftest import wait_runs
from test_incidents import lr_jump_run, spirals_run

import gradwatch


def test_run_page_shows_one_incident_card_with_its_story(server, page, api):
    spirals_run(gradwatch.init(project="inc", name="lr3", server=server.url), 3.0)
    page.goto(server.url + "/runs/1")
    page.click("#incident-bar:not([hidden]) > #incident-line")  # one line at the top, opening to the cards
    page.wait_for_selector(".incident[data-incident] .incident-story")
    # One incident for the divergence (a loaded machine may add a throughput drop of its own)
    cards = page.locator("#alerts .incident:not([data-root='throughput_drop'])")
    assert cards.count() == 1
    story = cards.first.locator(".incident-story").inner_text()
    assert story.startswith(("diverged at 1", "gradients exploded at 1")) and "gradients zero" in story
    assert "learning rate" in cards.first.locator(".incident-cause").inner_text()
    # Every alert is inside, by kind; the saturation after the blow-up says so.
    inside = cards.first.locator(".incident-alerts .alert[data-kind='zero_gradients']")
    assert "saturated after diverging" in inside.inner_text()
    cards.first.locator(".incident-alerts > summary").click()  # expandable: it collapses
    assert not inside.is_visible()
    cards.first.locator("button.incident-acknowledged").click()
    page.wait_for_selector(".incident[data-status='acknowledged']")
    assert api.get("/api/runs/1/incidents")[0]["status"] == "acknowledged"
    page.click(".incident-run-actions button.run-snoozed")  # mute the whole run
    page.wait_for_selector(".incident[data-status='snoozed']")
    muted = api.get("/api/runs/1/incidents")[0]
    assert muted["status"] == "snoozed" and muted["snoozed_until"] is None
    assert not page.js_errors


def test_inbox_lists_open_incidents_first_and_the_runs_list_counts_them(server, page, api):
    spirals_run(gradwatch.init(project="inc", name="a", server=server.url), 3.0)
    lr_jump_run(gradwatch.init(project="inc", name="b", server=server.url))
    wait_runs(api, 2)
    page.goto(server.url + "/")
    page.wait_for_selector("#runs .incident-count")
    assert page.locator("#runs .incident-count").count() == 2
    page.goto(server.url + "/inbox")
    page.wait_for_selector("#inbox .incident")
    assert page.locator("#inbox .incident").count() == 2
    page.locator("#inbox .incident[data-run='2'] button.incident-resolved").click()
    page.wait_for_selector("#inbox .incident[data-run='2'][data-status='resolved']")
    order = page.locator("#inbox .incident").evaluate_all("cs => cs.map(c => [c.dataset.run, c.dataset.status])")
    assert order == [["1", "open"], ["2", "resolved"]]
    assert "1 open" in page.locator("#count").inner_text()
    page.select_option("#f-status", "resolved")
    page.wait_for_function("document.querySelectorAll('#inbox .incident').length === 1")
    page.goto(server.url + "/")
    page.wait_for_selector("#runs .incident-count")
    assert page.locator("#runs .incident-count").count() == 1
    assert not page.js_errors


def test_rules_editor_replays_before_saving(server, page, api):
    run = gradwatch.init(project="ed", name="diverges", server=server.url)
    for step in range(200):
        run.log({"loss": 1.0 if step < 150 else 500.0, "acc": 0.9 if step < 100 else 0.2}, step=step)
    run.finish()
    page.goto(server.url + "/rules?project=ed")
    page.wait_for_selector("#builtin tr[data-kind='loss_divergence']")
    # A preview at once: what the rules as they are caught on the recent runs; nothing to save yet.
    page.wait_for_selector("#replay-table tr[data-run='1'] .current:has-text('Loss diverged @ 150')")
    assert page.locator("#save").is_disabled()
    # Every threshold says what it means and in what unit, from the rule's spec.
    window = page.locator("#builtin label.threshold[title^='loss_spike.window']")
    assert window.locator(".threshold-unit").inner_text() == "steps" and window.locator(".threshold-doc").inner_text()
    assert page.locator("#builtin tr[data-kind='loss_spike'] .rule-name b").inner_text() == "Loss spike"
    nav = page.locator("header .site-nav a", has_text="Rules")
    assert nav.count() == 1
    page.locator("#builtin tr[data-kind='loss_divergence'] .rule-on").uncheck()
    page.click("#add-custom")
    row = page.locator(".custom-rule").last
    row.locator("[data-field='name']").fill("acc low")
    row.locator("[data-field='key']").fill("acc")
    row.locator("[data-field='op']").select_option("<")
    row.locator("[data-field='main']").fill("0.5")
    assert page.locator("#save").is_disabled()  # not replayed yet
    page.click("#replay")
    page.wait_for_selector("#replay-table tr[data-run='1']")
    page.wait_for_function("() => document.querySelector('#replay-table .proposed')?.textContent.includes('acc low')")
    assert "Loss diverged @ 150" in page.locator("#replay-table tr[data-run='1'] .current").inner_text()
    proposed = page.locator("#replay-table tr[data-run='1'] .proposed").inner_text()
    assert "acc low @ 100" in proposed and "Loss diverged" not in proposed
    assert page.locator("#by").count() == 0  # who saves comes from the token, not a typed name
    assert page.locator("#save").is_enabled()
    page.click("#save")
    page.wait_for_selector("#history li")
    assert "anonymous" in page.locator("#history li").first.inner_text()  # the token's name, never the typed one
    stored = api.get("/api/projects/ed/rules")
    assert stored["disabled"] == ["loss_divergence"] and stored["custom"][0]["key"] == "acc"
    assert stored["updated_by"] == "anonymous"
    assert not page.js_errors
