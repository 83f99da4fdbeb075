"""gradwatch 0.2: points stored in chunks, rollups with wall times, 64-bit steps, alert counts, run secrets.

Creates the new tables, adds the new columns, widens step columns on PostgreSQL, packs 0.1's
``points``/``vectors`` rows into chunks, rebuilds the rollups and drops the old tables (see
``migrate.py`` for the steps; docs/storage.md for why).

Revision ID: 0002
Revises: 0001
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from gradwatch_server.storage import migrate

    migrate.to_chunks(op.get_bind())


def downgrade() -> None:
    raise NotImplementedError("gradwatch does not downgrade: restore the backup taken before upgrading")
