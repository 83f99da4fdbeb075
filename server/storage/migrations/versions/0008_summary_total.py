"""``summaries.total``: the sum of a key's values, so a metric's mean (W&B's ``define_metric(summary="mean")``)
is read, not computed from its points.

A new column only: ``migrate.ensure_schema`` adds it from the schema itself. Rows written before it
have none (NULL); their mean is read from the points (``storage/media/defined.py``).

Revision ID: 0008
Revises: 0007
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from gradwatch_server.storage import migrate

    migrate.ensure_schema(op.get_bind())


def downgrade() -> None:
    raise NotImplementedError("gradwatch does not downgrade: restore the backup taken before upgrading")
