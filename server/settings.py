"""Every server setting in one table: it drives the env vars, ``gradwatch serve --help`` and docs."""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
from dataclasses import dataclass, field, fields, make_dataclass
from pathlib import Path

from gradwatch.contract import MAX_KEYS_PER_RUN, MAX_LAYERS
from gradwatch.media.limits import MAX_BINS as MEDIA_BINS
from gradwatch.media.limits import MAX_TABLE_ROWS as MEDIA_TABLE_ROWS
from gradwatch.protocol import SERVER_FEATURES


def default_db_url() -> str:
    """A SQLite file in the per-user data directory ($XDG_DATA_HOME or ~/.local/share)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return f"sqlite:///{Path(base) / 'gradwatch' / 'gradwatch.db'}"


def boolean(value) -> bool:
    """true/false, yes/no, on/off, 1/0 (any case) from an env var or a flag."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{value!r} is not a boolean (true or false)")


@dataclass
class Setting:
    """One setting: its name, default, help line and parser; ``secret`` keeps it out of reprs."""

    name: str
    default: object
    help: str
    type: type = str
    secret: bool = False

    @property
    def annotation(self) -> type:
        """The type of its ``Settings`` field (``boolean`` parses into a bool)."""
        return bool if self.type is boolean else self.type

    @property
    def env(self) -> str:
        return "GRADWATCH_" + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


SETTINGS: list[Setting] = [
    Setting("host", "127.0.0.1", "Interface to listen on (0.0.0.0 to accept other machines)."),
    Setting("port", 8765, "TCP port for the dashboard, the API and the ingest websocket (0 picks a free one).", int),
    Setting(
        "db",
        "",
        "SQLAlchemy database URL: sqlite:///path/file.db or postgresql://user:pw@host/db. "
        "Empty means a SQLite file in ~/.local/share/gradwatch/.",
    ),
    Setting("webhook", "", "URL that gets each incident once as a Slack-format JSON POST ('text')."),
    Setting(
        "smtp_url",
        "",
        "Mail server for alert emails: smtp://user:pass@host:587 (STARTTLS when offered) or smtps://host:465.",
        secret=True,  # may hold a password
    ),
    Setting(
        "alert_email", "", "Comma-separated addresses that get an email for every critical incident (needs smtp_url)."
    ),
    Setting(
        "base_url", "", "This server's address as people reach it (https://gw.example.com): notifications link to runs."
    ),
    Setting("crash_timeout", 120.0, "Seconds a running run may stay disconnected before it is marked crashed.", float),
    Setting(
        "alerts",
        "",
        "Server-wide health-rule thresholds as JSON, e.g. "
        "'{\"exploding_gradients.ceiling\": 1000}'; a run's own init(alerts=...) wins.",
    ),
    Setting("log_level", "warning", "Server log level (debug, info, warning, error)."),
    Setting(
        "workers",
        1,
        "Server processes sharing the port (PostgreSQL only): ingest, pages and alerts work "
        "across them (see docs/deploy.md).",
        int,
    ),
    Setting(
        "sqlite_synchronous",
        "full",
        "SQLite durability of an ack: full (on disk before the ack; survives a "
        "power loss) or normal (faster; survives a server crash, not a power loss).",
    ),
    Setting(
        "sqlite_group_fsync_ms",
        5.0,
        "With sqlite_synchronous=full: SQLite commits without syncing and the writer fsyncs the WAL "
        "once for every commit of up to this many milliseconds; acks wait for that fsync, pages do "
        "not (docs/storage.md). 0: SQLite syncs at every commit.",
        float,
    ),
    Setting(
        "token",
        "",
        "Shared secret every route, websocket and page requires (Authorization: Bearer <token>, "
        "or the login page's cookie); /healthz stays open. Empty: no token. It is the admin token "
        "'server-token'; prefer --token-file or the env var (a flag shows in ps).",
        secret=True,  # never in a repr, a log line or --help
    ),
    Setting(
        "token_file",
        "",
        "File whose first line is the token (kept out of ps and shell history); used when --token is empty.",
    ),
    Setting(
        "allowed_hosts",
        "",
        "Comma-separated extra Host names the server answers to ('*': any). While bound "
        "to loopback only localhost, 127.0.0.1 and [::1] are accepted (DNS-rebinding "
        "protection).",
    ),
    Setting("max_connections", 1000, "Most concurrent requests and open websockets; more are refused (503).", int),
    Setting("max_frame_bytes", 16 << 20, "Largest websocket message or request body accepted, in bytes.", int),
    Setting("max_keys_per_run", MAX_KEYS_PER_RUN, "Most distinct metric keys one run may create.", int),
    Setting("max_layers", MAX_LAYERS, "Most slots (layers) in one per-layer vector key.", int),
    Setting("media_max_run_bytes", 1 << 30, "Most bytes of histograms, images and tables one run may store.", int),
    Setting(
        "media_max_item_bytes",
        4 << 20,
        "Largest single image (PNG bytes) or table (JSON bytes) stored; a bigger one is refused.",
        int,
    ),
    Setting("media_max_table_rows", MEDIA_TABLE_ROWS, "Most rows in one logged table.", int),
    Setting("media_max_bins", MEDIA_BINS, "Most bins in one logged histogram.", int),
    Setting(
        "wire_features",
        "",
        "Optional wire-protocol features announced to clients, comma-separated (empty: all this server has: "
        + ", ".join(SERVER_FEATURES)
        + "). Naming fewer makes the server take only what a release with just those took (to try a client "
        "against an older server).",
    ),
    Setting(
        "max_buffered_bytes", 64 << 20, "Most bytes of not-yet-committed batches held for one ingest connection.", int
    ),
    Setting(
        "max_connections_per_client",
        100,
        "Most concurrent requests and open websockets from one client address; more are refused (429). "
        "/healthz is exempt from both connection limits.",
        int,
    ),
    Setting(
        "header_timeout",
        10.0,
        "Seconds a connection has to send a request's headers (from its start, or its previous answer); "
        "slower ones (slowloris) are closed.",
        float,
    ),
    Setting(
        "max_page_bytes",
        8 << 20,
        "Most bytes of live pushes waiting for one open page; a page further behind gets one 'resync' instead.",
        int,
    ),
    Setting("webhook_per_run", 10, "Most notifications per run per minute per channel; the rest are recorded.", int),
    Setting(
        "session_days",
        30.0,
        "Days a login (session cookie) stays valid; POST /logout ends it sooner.",
        float,
    ),
    Setting(
        "trusted_proxy",
        "",
        "Comma-separated addresses of the TLS proxy in front ('*': any), whose X-Forwarded-Proto and "
        "X-Forwarded-For are believed: https there gives Secure cookies, and connection limits count the "
        "real client. Empty: no proxy (X-Forwarded-* headers are ignored, from 127.0.0.1 too).",
    ),
    Setting(
        "notify_allow_hosts",
        "",
        "Comma-separated hosts, addresses or networks (CIDR) project channels may post to although they "
        "are loopback, private, link-local or metadata addresses ('*': any). Empty: public addresses only.",
    ),
    Setting(
        "api_docs",
        False,
        "Serve the interactive API docs at /docs and /redoc (their scripts load from a CDN into this "
        "origin, so off by default; /openapi.json is always there).",
        boolean,
    ),
    Setting(
        "retention_days",
        0.0,
        "Delete runs not updated for this many days, checked at start and hourly "
        "(never running or stalled ones; see docs/deploy.md). 0: keep everything.",
        float,
    ),
    Setting(
        "retention_keep_tagged",
        True,
        "With retention_days: keep runs that have a tag (true) or delete them too (false).",
        boolean,
    ),
]

LIMITS = (
    "max_connections",
    "max_frame_bytes",
    "max_keys_per_run",
    "max_layers",
    "media_max_run_bytes",
    "media_max_item_bytes",
    "media_max_table_rows",
    "media_max_bins",
    "max_buffered_bytes",
    "max_connections_per_client",
    "max_page_bytes",
    "webhook_per_run",
)
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


class _Settings:
    """What every ``Settings`` can say and check; its fields (names, defaults) come from ``SETTINGS``."""

    @property
    def db_url(self) -> str:
        return self.db or default_db_url()

    @property
    def alert_overrides(self) -> dict:
        """The parsed ``alerts`` setting (validated in ``validate``)."""
        return json.loads(self.alerts) if self.alerts else {}

    @property
    def announced_features(self) -> list[str]:
        """The ``wire_features`` setting as a list (validated in ``validate``); every feature when empty."""
        named = [f.strip() for f in self.wire_features.split(",") if f.strip()]
        return [f for f in SERVER_FEATURES if f in named] if named else list(SERVER_FEATURES)

    @property
    def allowed_host_names(self) -> frozenset[str]:
        """The ``allowed_hosts`` names, lower-cased, ports dropped."""
        return frozenset(strip_port(h.strip()).lower() for h in self.allowed_hosts.split(",") if h.strip())

    @property
    def trusted_proxies(self) -> frozenset[str]:
        """The ``trusted_proxy`` addresses."""
        return frozenset(h.strip() for h in self.trusted_proxy.split(",") if h.strip())

    @property
    def on_loopback(self) -> bool:
        """True while bound to a loopback interface (only this machine can connect)."""
        return is_loopback(self.host)

    def validate(self) -> Settings:
        """Raise ValueError with a readable message for a bad value."""
        if not (0 <= self.port <= 65535):
            raise ValueError(f"port must be 0-65535, got {self.port}")
        if self.crash_timeout <= 0:
            raise ValueError("crash_timeout must be > 0")
        if self.alerts:
            try:
                parsed = json.loads(self.alerts)
            except ValueError as exc:
                raise ValueError(f"alerts must be a JSON object: {exc}") from None
            if not isinstance(parsed, dict):
                raise ValueError("alerts must be a JSON object")
        if self.webhook and not self.webhook.startswith(("http://", "https://")):
            raise ValueError("webhook must be an http(s) URL")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        unknown = {f.strip() for f in self.wire_features.split(",") if f.strip()} - set(SERVER_FEATURES)
        if unknown:
            raise ValueError(
                f"wire_features: unknown {', '.join(sorted(unknown))} (known: {', '.join(SERVER_FEATURES)})"
            )
        for name in LIMITS:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.token_file and not self.token:
            try:
                self.token = (Path(self.token_file).expanduser().read_text().splitlines() or [""])[0].strip()
            except OSError as exc:
                raise ValueError(f"token_file {self.token_file!r} cannot be read: {exc.strerror or exc}") from None
            if not self.token:
                raise ValueError(f"token_file {self.token_file!r} is empty")
        if self.token != self.token.strip():
            raise ValueError("token must not start or end with whitespace")
        if self.header_timeout <= 0 or self.session_days <= 0:
            raise ValueError("header_timeout and session_days must be > 0")
        if self.retention_days < 0:
            raise ValueError(f"retention_days must be >= 0 (0 keeps everything), got {self.retention_days}")
        if not 0 <= self.sqlite_group_fsync_ms <= 1000:
            raise ValueError(f"sqlite_group_fsync_ms must be between 0 and 1000, got {self.sqlite_group_fsync_ms}")
        if self.sqlite_synchronous not in ("full", "normal"):
            raise ValueError(f"sqlite_synchronous must be full or normal, got {self.sqlite_synchronous!r}")
        return self


Settings = make_dataclass(
    "Settings",
    [(st.name, st.annotation, field(default=st.default, repr=not st.secret)) for st in SETTINGS],
    bases=(_Settings,),
)
Settings.__doc__ = "The server's settings: one field per entry of ``SETTINGS``, with its default."
Settings.__module__ = __name__


def strip_port(host: str) -> str:
    """'name:8765' -> 'name', '[::1]:8765' -> '::1', a bare IPv6 address unchanged."""
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def is_loopback(host: str) -> bool:
    """localhost, 127.0.0.0/8 or ::1."""
    host = strip_port(host).lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def to_env(settings: Settings) -> dict:
    """The GRADWATCH_* variables that ``from_env`` turns back into these settings (for worker processes)."""
    return {s.env: str(getattr(settings, s.name)) for s in SETTINGS}


def from_env(environ=None, **overrides) -> Settings:
    """Settings from GRADWATCH_* variables, then keyword overrides."""
    environ = os.environ if environ is None else environ
    values = {}
    for s in SETTINGS:
        if s.env in environ:
            try:
                values[s.name] = s.type(environ[s.env])
            except ValueError:
                raise ValueError(f"{s.env}={environ[s.env]!r} is not a valid {s.type.__name__}") from None
    values.update({k: v for k, v in overrides.items() if v is not None})
    known = {f.name for f in fields(Settings)}
    return Settings(**{k: v for k, v in values.items() if k in known}).validate()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per setting; defaults stay None so env vars can fill in."""
    for s in SETTINGS:
        parser.add_argument(
            s.flag, dest=s.name, type=s.type, default=None, help=f"{s.help} [env {s.env}; default {s.default!r}]"
        )


def markdown_table() -> str:
    """The settings table as Markdown (used by docs/settings.md; a test keeps them equal)."""
    rows = ["| Setting | Flag | Env var | Default | What it does |", "|---|---|---|---|---|"]
    for s in SETTINGS:
        rows.append(f"| `{s.name}` | `{s.flag}` | `{s.env}` | `{s.default!r}` | {s.help} |")
    return "\n".join(rows)
