"""Settings: one table drives env vars, flags and docs."""

import dataclasses
import re
from pathlib import Path

import pytest

from gradwatch_server.cli import build_parser
from gradwatch_server.settings import SETTINGS, Settings, from_env, markdown_table

DOCS = Path(__file__).resolve().parent.parent / "docs" / "settings.md"


def test_env_vars_and_overrides():
    s = from_env({"GRADWATCH_PORT": "9000", "GRADWATCH_WEBHOOK": "http://x/hook"}, host="0.0.0.0")
    assert (s.port, s.webhook, s.host) == (9000, "http://x/hook", "0.0.0.0")
    assert from_env({}, port=1234).port == 1234


@pytest.mark.parametrize("env, message", [({"GRADWATCH_PORT": "abc"}, "GRADWATCH_PORT"),
                                          ({"GRADWATCH_ALERTS": "[1]"}, "JSON object"),
                                          ({"GRADWATCH_WEBHOOK": "ftp://x"}, "http")])
def test_bad_values_give_clear_errors(env, message):
    with pytest.raises(ValueError, match=message):
        from_env(env)


def test_table_defaults_match_the_dataclass():
    defaults = {f.name: f.default for f in dataclasses.fields(Settings)}
    assert {s.name: s.default for s in SETTINGS} == {k: v for k, v in defaults.items() if k != "extra"}


@pytest.mark.parametrize("doc", [DOCS, DOCS.parent.parent / "README.md"])
def test_docs_table_is_in_step_with_code(doc):
    text = doc.read_text()
    table = re.search(r"<!-- settings-table:start -->\n(.*)\n<!-- settings-table:end -->", text, re.S).group(1)
    assert table == markdown_table()


def test_help_lists_every_setting_with_its_env_var():
    help_text = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()
    for s in SETTINGS:
        assert s.flag in help_text and s.env in help_text
