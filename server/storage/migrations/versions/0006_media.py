"""Histograms, images, tables and text per run (``media``) and ``run.summary`` values (``run_summary``).

Revision ID: 0006
Revises: 0005
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from gradwatch_server.storage import db

    bind = op.get_bind()
    db.media.create(bind, checkfirst=True)
    db.run_summary.create(bind, checkfirst=True)


def downgrade() -> None:
    raise NotImplementedError("gradwatch does not downgrade: restore the backup taken before upgrading")
