"""gradwatch 0.4: new block encodings (decimal and per-slot offset transforms for chunks, palette rows
for rollup summaries: storage/blocks/codec.py, decimal.py).

No table changes and nothing rewritten at upgrade: old blocks keep their meaning and read as they
are, new blocks may use the new encodings. The revision exists so that an older release, whose codec
does not know the new transform numbers, refuses this database instead of misreading it.

Revision ID: 0007
Revises: 0006
"""

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Nothing to change: the revision number is the whole point."""


def downgrade() -> None:
    raise NotImplementedError("gradwatch does not downgrade: restore the backup taken before upgrading")
