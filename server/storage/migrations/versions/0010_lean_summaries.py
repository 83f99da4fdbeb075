"""gradwatch 0.5: a vector key's rollup summary may be stored lean (storage/rollup.py ``LEAN_ROWS``): without
its finite maxima, which its heat row holds, and without its wall times, which the run clock holds at its steps.

Nothing in the schema changes and nothing is rewritten at upgrade: full summaries keep their meaning and read
as they are, beside lean ones (storage/blocks/rollup_rows.py makes those whole). The revision makes an older
release refuse this database: its reader would take a lean summary for a damaged one, and its writer would
rebuild such a block from the points of one batch only.

Revision ID: 0010
Revises: 0009
"""

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Nothing to change: the revision number is the whole point."""


def downgrade() -> None:
    raise NotImplementedError("gradwatch does not downgrade: restore the backup taken before upgrading")
