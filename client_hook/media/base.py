"""What every media value shares: a kind, a refusal reason kept instead of raised, and its encoding on the sender thread."""

from __future__ import annotations

from gradwatch.media.limits import MediaRefused


class MediaValue:
    """A value logged under a key that is not a number. Constructors never raise: a bad value is kept
    refused (``refused`` says why) and counted as a gap when logged."""

    kind = "media"
    refused: str | None = None
    count = 1  # the values it stands for in the counts of what was handed over and refused (a group: its rows)

    def _refuse(self, why: str) -> None:
        self.refused = why

    def guarded_init(self, fn, *args) -> None:
        """Run the capture; any failure becomes the refusal reason (never an exception into training)."""
        try:
            fn(*args)
        except MediaRefused as exc:
            self.refused = str(exc)
        except Exception as exc:  # an odd input type, a tensor that will not convert
            self.refused = f"{type(exc).__name__}: {exc}"[:300]

    def to_wire(self) -> dict:
        """The value as a JSON-able dict (sender thread); raises MediaRefused when it cannot be sent."""
        raise NotImplementedError

    def estimated_bytes(self) -> int:
        """A cheap guess of the encoded size (training thread, for the step budget)."""
        return 256
