"""The schema of gradwatch 0.1 (row-per-point ``points`` and ``vectors``): the baseline.

A database written by 0.1 has no Alembic version; ``migrate.upgrade`` stamps it here and upgrades
it from here. A new database is created at the newest revision directly.

Revision ID: 0001
Revises:
"""

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass  # 0.1 created its tables itself; nothing to do for a database that has them


def downgrade() -> None:
    pass
