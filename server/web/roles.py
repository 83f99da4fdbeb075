"""Who may do what: the roles a token carries and, for every route, the ability it needs (one table, here).

``ingest`` streams runs over the ingest websocket (and nothing else); ``viewer`` reads; ``editor`` also edits
runs, acknowledges / snoozes incidents and replays proposed rules; ``admin`` does everything (rules, channels,
tokens, the audit log, deletes). A token may be limited to some projects: it then reaches only those.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ROLES = ("ingest", "viewer", "editor", "admin")
ABILITIES = {
    "ingest": frozenset({"ingest"}),
    "viewer": frozenset({"read"}),
    "editor": frozenset({"read", "edit"}),
    "admin": frozenset({"read", "edit", "admin", "ingest"}),
}

# (method or "*", path pattern, ability); the first match decides. Reads need "read"; an unknown write "admin".
ROUTES = (
    ("GET", r"/api/me", "any"),  # every token may ask what it is (`gradwatch init` says which role it has)
    ("WS", r"/ws/ingest", "ingest"),
    ("*", r"/api/tokens(/.*)?", "admin"),
    ("*", r"/api/audit", "admin"),
    ("PUT", r"/api/projects/[^/]+/(rules|channels)", "admin"),
    ("POST", r"/api/projects/[^/]+/channels/test", "admin"),
    ("POST", r"/api/projects/[^/]+/rules/backtest", "edit"),
    ("DELETE", r"/api/runs/\d+", "admin"),
    ("PATCH", r"/api/runs/\d+", "edit"),
    ("POST", r"/api/(runs/\d+/)?incidents(/\d+)?/status", "edit"),
)
READS = frozenset({"GET", "HEAD", "WS"})


@dataclass(frozen=True)
class Identity:
    """Who a request comes from: the token's name and role, its projects (None: all), its digest (None: none)."""

    name: str
    role: str
    projects: frozenset | None = None
    digest: str | None = None

    def can(self, ability: str) -> bool:
        return ability == "any" or ability in ABILITIES[self.role]

    def sees(self, project: str | None) -> bool:
        """May this identity reach ``project`` (None: a request across projects)?"""
        return self.projects is None or project in self.projects

    def me(self) -> dict:
        """What /api/me says: the name, role, projects and what the role may do (pages show only that)."""
        return {
            "name": self.name,
            "role": self.role,
            "projects": None if self.projects is None else sorted(self.projects),
            "can": sorted(ABILITIES[self.role]),
        }


OPEN = Identity("anonymous", "admin")  # a server without any token: everything open (loopback by default)


def ability(method: str, path: str) -> str:
    """The ability a request needs (``method`` is ``WS`` for a websocket)."""
    for want, pattern, needed in ROUTES:
        if want in ("*", method) and re.fullmatch(pattern, path):
            return needed
    return "read" if method in READS else "admin"


PROJECT_PATH = re.compile(r"/api/projects/([^/]+)(/.*)?")
RUN_PATH = re.compile(r"/(?:api|ws)/runs/(\d+)(/.*)?")


def identity_of(request) -> Identity:
    """The identity the middleware put on a request (or websocket); OPEN where no middleware ran (unit tests)."""
    return request.scope.get("state", {}).get("identity", OPEN)
