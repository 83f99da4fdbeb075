"""Alembic environment: migrations run on the connection (and in the transaction) the caller hands over."""

from alembic import context

from gradwatch_server.storage import db

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=db.metadata)
with context.begin_transaction():
    context.run_migrations()
