"""One router per concern; ``ALL`` is what the app serves (and what the docs test checks)."""

from gradwatch_server.web.routes import (
    access,
    api,
    auth,
    channels,
    compare_api,
    incidents,
    ingest_ws,
    live_ws,
    media_api,
    metrics,
    pages,
    ranks,
    rules,
    runs_api,
)

JSON_API = (
    runs_api,
    compare_api,
    api,
    ranks,
    incidents,
    rules,
    channels,
    media_api,
    access,
)  # the JSON API (its OpenAPI schema is what the fuzzer reads)
ALL = (*JSON_API, metrics, auth, ingest_ws, live_ws, pages)
