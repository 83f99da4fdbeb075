"""gradwatch 0.3: chunks and rollups written as compressed, checksummed blobs (storage/codec.py).

No table changes and nothing rewritten at upgrade: readers take both formats (an encoded blob's
length is 5 modulo 8, a raw one's a multiple of 8), new blocks are written compressed, and
``gradwatch db compact`` rewrites the old ones online. The revision exists so that an older
release, which cannot read the new blobs, refuses this database instead of misreading it.

Revision ID: 0003
Revises: 0002
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from gradwatch_server.storage import migrate

    migrate.ensure_schema(op.get_bind())


def downgrade() -> None:
    raise NotImplementedError("gradwatch does not downgrade: restore the backup taken before upgrading")
