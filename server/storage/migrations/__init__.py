"""Alembic migrations of the gradwatch schema (run by ``migrate.upgrade`` at start and by ``gradwatch db upgrade``)."""
