"""gradwatch 0.5: ``chunks.small`` marks the small rows still to be merged, so a wide vector's full chunk
may hold 64 steps (storage/chunks.py ``capacity``) while the 16-step full chunks of older files stay full.

A new column only: ``migrate.ensure_schema`` adds it from the schema itself; rows written before it have
none (NULL) and are told as before, by their number of steps (``chunks.small_rows``). Nothing is rewritten
at upgrade (``gradwatch db compact`` merges old 16-step chunks into 64-step ones, online). The revision
also makes an older release, whose codec does not know the blocks written since, refuse this database.

Revision ID: 0009
Revises: 0008
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from gradwatch_server.storage import migrate

    migrate.ensure_schema(op.get_bind())


def downgrade() -> None:
    raise NotImplementedError("gradwatch does not downgrade: restore the backup taken before upgrading")
