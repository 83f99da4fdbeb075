"""One router per concern; ``ALL`` is what the app serves (and what the docs test checks)."""

from gradwatch_server.web.routes import api, auth, ingest_ws, live_ws, metrics, pages, ranks

JSON_API = (api, ranks)  # the JSON API (its OpenAPI schema is what the fuzzer reads)
ALL = (*JSON_API, metrics, auth, ingest_ws, live_ws, pages)
