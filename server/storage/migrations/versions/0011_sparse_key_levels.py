"""A key logged every few steps keeps only the rollup levels whose blocks hold at least
``rollup.MIN_POINTS`` points (storage/rollup.py ``levels_for``): a vector logged every 10th step has no
16-step blocks. A key keeps its levels for life; readers and a rebuilt writer cache know them from the finest
level the key has rows of.

Nothing in the schema changes and nothing is rewritten at upgrade: keys stored before keep every level. The
revision makes an older release refuse this database: its reader would take a sparse key's missing fine blocks
for steps without points (a chart would lose them), and its writer would start those levels mid-run.

Revision ID: 0011
Revises: 0010
"""

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Nothing to change: the revision number is the whole point."""


def downgrade() -> None:
    raise NotImplementedError("gradwatch does not downgrade: restore the backup taken before upgrading")
