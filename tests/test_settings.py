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


@pytest.mark.parametrize(
    "env, message",
    [
        ({"GRADWATCH_PORT": "abc"}, "GRADWATCH_PORT"),
        ({"GRADWATCH_ALERTS": "[1]"}, "JSON object"),
        ({"GRADWATCH_WEBHOOK": "ftp://x"}, "http"),
        ({"GRADWATCH_MAX_CONNECTIONS": "0"}, "max_connections"),
        ({"GRADWATCH_MAX_FRAME_BYTES": "-1"}, "max_frame_bytes"),
        ({"GRADWATCH_TOKEN": " padded "}, "whitespace"),
    ],
)
def test_bad_values_give_clear_errors(env, message):
    with pytest.raises(ValueError, match=message):
        from_env(env)


def test_the_dataclass_is_the_table():
    assert [(f.name, f.default) for f in dataclasses.fields(Settings)] == [(s.name, s.default) for s in SETTINGS]
    text = repr(Settings(token="s3cret", smtp_url="smtp://u:pw@h"))
    assert "s3cret" not in text and "pw@h" not in text and "port=8765" in text


@pytest.mark.parametrize("doc", [DOCS, DOCS.parent.parent / "README.md"])
def test_docs_table_is_in_step_with_code(doc):
    text = doc.read_text()
    table = re.search(r"<!-- settings-table:start -->\n(.*)\n<!-- settings-table:end -->", text, re.S).group(1)
    assert table == markdown_table()


def test_help_lists_every_setting_with_its_env_var():
    help_text = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()
    for s in SETTINGS:
        assert s.flag in help_text and s.env in help_text


def test_limits_have_the_names_the_ingest_code_reads():
    s = from_env(
        {
            "GRADWATCH_MAX_KEYS_PER_RUN": "7",
            "GRADWATCH_MAX_LAYERS": "9",
            "GRADWATCH_MAX_BUFFERED_BYTES": "11",
            "GRADWATCH_MAX_FRAME_BYTES": "13",
            "GRADWATCH_MAX_CONNECTIONS": "5",
        }
    )
    assert (s.max_keys_per_run, s.max_layers, s.max_buffered_bytes, s.max_frame_bytes, s.max_connections) == (
        7,
        9,
        11,
        13,
        5,
    )
    assert Settings().max_frame_bytes == 16 << 20 and Settings().max_buffered_bytes == 64 << 20


def test_token_is_never_in_a_repr_or_the_help(monkeypatch):
    monkeypatch.setenv("GRADWATCH_TOKEN", "tok-in-env-1234")
    s = from_env(token="tok-from-flag-5678")
    assert s.token == "tok-from-flag-5678"
    assert "tok-" not in repr(s) and "tok-" not in str(s)
    help_text = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()
    assert "GRADWATCH_TOKEN" in help_text and "tok-" not in help_text


@pytest.mark.parametrize(
    "host, loopback",
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("gpu-box", False),
    ],
)
def test_loopback_binding_is_recognised(host, loopback):
    assert Settings(host=host).on_loopback is loopback


def test_allowed_hosts_are_parsed_without_ports():
    s = Settings(allowed_hosts=" Box.Lan:8765, [fe80::1]:80 ,,*")
    assert s.allowed_host_names == {"box.lan", "fe80::1", "*"}
