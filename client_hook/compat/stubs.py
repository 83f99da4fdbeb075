"""W&B calls with no gradwatch meaning yet (files and artifacts): accepted, one warning line each, never an exception."""

from __future__ import annotations

import sys

_told: set[str] = set()


def say_once(name: str, what: str = "is accepted and ignored") -> None:
    """One stderr line the first time a W&B-only call is made in this process."""
    if name not in _told:
        _told.add(name)
        print(f"gradwatch: {name}() {what} (see docs/wandb.md)", file=sys.stderr)


def save(*_args, **_kwargs) -> list:
    """W&B's ``wandb.save(glob)``: nothing is uploaded."""
    say_once("save")
    return []


def restore(*_args, **_kwargs) -> None:
    say_once("restore")


def log_code(*_args, **_kwargs) -> None:
    say_once("log_code")


def use_artifact(artifact=None, *_args, **_kwargs) -> Artifact:
    """W&B's ``use_artifact``: an empty ``Artifact`` whose downloads give the current directory."""
    say_once("use_artifact")
    return artifact if isinstance(artifact, Artifact) else Artifact(str(artifact or "artifact"), "unknown")


def log_artifact(artifact=None, *_args, **_kwargs):
    say_once("log_artifact")
    return artifact


class Artifact:
    """W&B's ``Artifact``: files you add are not stored; every method answers without failing."""

    def __init__(
        self, name: str = "artifact", type: str = "dataset", description: str | None = None, metadata=None, **_kw
    ):  # noqa: A002
        say_once("Artifact")
        self.name, self.type, self.description = name, type, description
        self.metadata = dict(metadata or {})

    def add_file(self, *_args, **_kwargs) -> None:
        return None

    def add_dir(self, *_args, **_kwargs) -> None:
        return None

    def add_reference(self, *_args, **_kwargs) -> None:
        return None

    def add(self, *_args, **_kwargs) -> None:
        return None

    def new_file(self, name: str, mode: str = "w", **_kwargs):
        import io

        return io.BytesIO() if "b" in mode else io.StringIO()

    def download(self, root: str | None = None, **_kwargs) -> str:
        return root or "."

    def wait(self, *_args, **_kwargs) -> Artifact:
        return self

    def save(self, *_args, **_kwargs) -> None:
        return None
