"""gradwatch 0.3: named tokens with roles, the audit log, sessions bound to their token, a run's creating token.

New tables and nullable columns only: ``migrate.ensure_schema`` adds them from the schema itself.

Revision ID: 0004
Revises: 0003
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from gradwatch_server.storage import migrate

    migrate.ensure_schema(op.get_bind())


def downgrade() -> None:
    raise NotImplementedError("gradwatch does not downgrade: restore the backup taken before upgrading")
