#!/bin/sh
# The gradwatch image's entrypoint: wait for the database, then serve (flags pass through).
# With a postgresql:// GRADWATCH_DB it retries until PostgreSQL answers, for at most
# GRADWATCH_DB_WAIT seconds (default 60), then fails with one line saying what did not answer.
# tests/test_docker.py runs this very script against a real PostgreSQL and against SQLite.
set -eu

case "${GRADWATCH_TOKEN:-}" in
  change-me*)
    echo "gradwatch: GRADWATCH_TOKEN is still the placeholder from .env.example: put a long random token in .env" \
         "(python3 -c \"import secrets; print(secrets.token_urlsafe(32))\")" >&2
    exit 2 ;;
esac
# The example PostgreSQL password, whether .env passes it as POSTGRES_PASSWORD or compose splices it
# into the database URL: a database anyone who read .env.example can log into is refused too.
case "${POSTGRES_PASSWORD:-}|${GRADWATCH_DB:-}" in
  change-me*|*:change-me*@*)
    echo "gradwatch: the PostgreSQL password is still the placeholder from .env.example: put a long random" \
         "value in .env as POSTGRES_PASSWORD (before the database's first start: it keeps its first password)" >&2
    exit 2 ;;
esac
gradwatch db wait --timeout "${GRADWATCH_DB_WAIT:-60}"
exec gradwatch serve --host "${GRADWATCH_HOST:-0.0.0.0}" "$@"
