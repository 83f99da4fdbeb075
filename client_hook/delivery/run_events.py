"""Run events (W&B's ``run.summary``, config updates, ``define_metric``) held back from a server that does not
announce ``run_events`` (an older release refuses them with a ``data_refused`` alert).

They are folded as they come (one summary, one config change, one metadata change: memory stays bounded)
and go out with the first batch encoded for a server that announces the feature. Until a welcome says
which server it is, they wait too; at ``close`` with still no welcome (offline, never reached) they go
into the last batch, which the spool keeps for ``gradwatch sync``.
"""

from __future__ import annotations

import sys

from gradwatch import protocol

OLD_SERVER = (
    "gradwatch: the server is an older release that does not store run.summary, config changes after init or "
    "define_metric; they are held in memory and sent if a newer server takes this run over (upgrade the server)"
)


class HeldRunEvents:
    """The run events not sent yet, folded; ``route`` decides per batch what goes out."""

    def __init__(self, say=None):
        self.say = say or (lambda text: print(text, file=sys.stderr, flush=True))
        self.summary: dict = {}
        self.removed: set = set()
        self.docs: dict[str, dict] = {"config": {}, "meta": {}}
        self.told = False
        self.flush_unknown = False  # set at close: with no welcome ever, the spool keeps them

    def __bool__(self) -> bool:
        return bool(self.summary or self.removed or any(self.docs.values()))

    def ready(self, features) -> bool:
        """Whether held events would go out with a batch encoded now."""
        return bool(self) and self._takes(features)

    def _takes(self, features) -> bool:
        return protocol.RUN_EVENTS in features if features else self.flush_unknown

    def route(self, events: list, features) -> list:
        """The events to send with a batch for a server announcing ``features``; the rest are held."""
        if self._takes(features):
            return self.take() + events if self else events
        out = []
        for ev in events:
            if isinstance(ev, dict) and ev.get("type") in protocol.RUN_EVENT_TYPES:
                self.add(ev)
            else:
                out.append(ev)
        if features and self and not self.told:  # a welcome without the feature: an older server
            self.told = True
            self.say(OLD_SERVER)
        return out

    def add(self, ev: dict) -> None:
        """Fold one run event into what is held (later values win, as on the server)."""
        kind = ev["type"]
        if kind == "summary":
            for key in ev.get("remove") or []:
                self.summary.pop(key, None)
                self.removed.add(key)
            for key, value in (ev.get("set") or {}).items():
                self.removed.discard(key)
                self.summary[key] = value
        elif isinstance(ev.get(kind), dict):
            self.docs[kind].update(ev[kind])

    def take(self) -> list:
        """What is held, as events (one of each kind), and forget it."""
        out = [{"type": kind, kind: doc} for kind, doc in self.docs.items() if doc]
        if self.summary or self.removed:
            out.append({"type": "summary", "set": self.summary, "remove": sorted(self.removed)})
        self.summary, self.removed, self.docs = {}, set(), {"config": {}, "meta": {}}
        return out
