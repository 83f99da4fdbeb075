"""gradwatch 0.3: one clock per run (``run_clock``): a chunk whose wall times are the run clock's stores none.

A new table only: ``migrate.ensure_schema`` adds it from the schema itself. The revision exists so
that an older release, which cannot read a chunk without wall times, refuses this database.

Revision ID: 0005
Revises: 0004
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from gradwatch_server.storage import migrate

    migrate.ensure_schema(op.get_bind())


def downgrade() -> None:
    raise NotImplementedError("gradwatch does not downgrade: restore the backup taken before upgrading")
