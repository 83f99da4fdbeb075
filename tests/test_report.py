"""gradwatch report: one self-contained HTML file (Plotly inlined), opened offline in real Chromium."""

from __future__ import annotations

import pytest

import gradwatch
from gradwatch_server import cli


def seed(server, name, lr, nan_at=None):
    run = gradwatch.init(project="rep", name=name, config={"lr": lr, "layers": 2}, server=server.url)
    for step in range(40):
        run.log({"loss": float("nan") if step == nan_at else 1.0 / (step + 1) + lr, "val/acc": step / 40}, step=step)
    run.finish()
    return run.id


def test_report_is_self_contained_with_charts_alerts_and_config_diff(server, api, tmp_path, capsys, browser):
    a, b = seed(server, "calm", 0.01), seed(server, "<b>nan</b>", 0.5, nan_at=30)
    out = tmp_path / "report.html"
    with pytest.raises(SystemExit) as exit_:
        cli.main(["report", str(a), str(b), "-o", str(out), "--server", server.url])
    assert exit_.value.code == 0 and "2 run(s)" in capsys.readouterr().err
    text = out.read_text()
    assert len(text) > 1_000_000  # Plotly.js inlined
    assert "&lt;b&gt;nan&lt;/b&gt;" in text and "<b>nan</b>" not in text  # user text escaped
    assert "Loss is NaN" in text  # kinds as words, as on the run page
    context = browser.new_context(offline=True)  # nothing may come from the network
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    fetched = []
    page.on("request", lambda req: fetched.append(req.url))
    page.goto(out.as_uri())
    page.wait_for_function("() => document.querySelectorAll('.chart .main-svg').length >= 2", timeout=15000)
    charts = page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('.chart')].map(
        (d) => [d.dataset.key, d.data.map((t) => [t.name, t.x.length])]))""")
    assert list(charts)[0] == "loss"
    assert charts["loss"][:2] == [[f"calm (#{a})", 40], [f"&lt;b&gt;nan&lt;/b&gt; (#{b})", 40]]
    assert charts["loss"][2] == ["NaN / inf", 1]  # the NaN is a marker, not a gap
    assert "val/acc" in charts
    differs = page.locator("tr.differs td").all_inner_texts()
    assert differs == ["lr", "0.01", "0.5"]  # only the key that differs is highlighted
    alert_row = page.locator("table").nth(1).locator("tbody tr").first.locator("td").all_inner_texts()
    assert alert_row[:4] == [str(b), "Loss is NaN", "critical", "30"]
    assert "Config (1 key differs, highlighted)" in page.locator("h2").all_inner_texts()
    assert page.evaluate("() => document.querySelectorAll('script[src], link[href]').length") == 0
    assert fetched == [out.as_uri()]  # the file itself and nothing else
    assert not errors
    context.close()


def test_report_of_a_diverged_run_reads_like_its_run_page(server, tmp_path, browser):
    """The run page's axis (log for a loss spanning decades), the incident's story and cause, a legend
    clear of the axis, and config wording that fits one run."""
    from gradwatch_server.cli import demo

    demo.train(server.url, "ramp", "SGD", 0.05, "ramp", steps=360, delay=0.0, model=demo.make_model())
    out = tmp_path / "diverged.html"
    with pytest.raises(SystemExit):
        cli.main(["report", "1", "-o", str(out), "--server", server.url])
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    try:
        page.goto(out.as_uri())
        page.wait_for_function("() => document.querySelectorAll('.chart .main-svg').length >= 2", timeout=15000)
        assert page.evaluate("() => document.querySelector('.chart[data-key=loss]').layout.yaxis.type") == "log"
        keys = page.evaluate("() => [...document.querySelectorAll('.chart')].map((d) => d.dataset.key)")
        assert keys[0] == "loss" and keys.index("val/accuracy") < min(
            i for i, k in enumerate(keys) if "/" in k and k.startswith(("perf/", "system/", "signals/"))
        )
        story = page.locator("ul.incidents li").first.inner_text()
        assert " at step " in story and "Cause: learning rate" in story and "_" not in story.split(" at step ")[0]
        clear = page.evaluate("""() => [...document.querySelectorAll('.chart')].every((d) => {
            const legend = d.querySelector('.legend')?.getBoundingClientRect();
            const axis = [...d.querySelectorAll('.xtick, .xtitle')].map((t) => t.getBoundingClientRect());
            return legend && axis.length && axis.every((t) => legend.bottom <= t.top || legend.top >= t.bottom); })""")
        assert clear  # the legend sits above the plot, never over the x axis and its title
        assert "Config" in page.locator("h2").all_inner_texts() and "key(s)" not in page.content()
    finally:
        page.close()
