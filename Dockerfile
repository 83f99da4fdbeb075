# The gradwatch server (no torch: training machines install the client, `pip install gradwatch`).
# Build: docker build -t gradwatch-server .   Run: see docker-compose.yml and docs/deploy.md.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# Only what the package needs, so editing tests or docs does not rebuild this layer.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY client_hook client_hook
COPY server server
COPY frontend frontend
RUN pip install ".[server,postgres]"

COPY docker/entrypoint.sh /usr/local/bin/gradwatch-entrypoint
RUN chmod 0755 /usr/local/bin/gradwatch-entrypoint \
    && useradd --system --uid 10001 --user-group --create-home --home-dir /home/gradwatch gradwatch \
    && mkdir -p /data && chown gradwatch:gradwatch /data

USER gradwatch
WORKDIR /home/gradwatch
# Defaults for a container: listen on every interface; without GRADWATCH_DB, a SQLite file in the
# /data volume. docker-compose.yml points GRADWATCH_DB at PostgreSQL and sets the token.
ENV GRADWATCH_HOST=0.0.0.0 GRADWATCH_PORT=8765 GRADWATCH_DB=sqlite:////data/gradwatch.db
VOLUME ["/data"]
EXPOSE 8765

# /healthz needs no token and checks the database too. python, not curl: the slim image has no curl.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('GRADWATCH_PORT', '8765'), timeout=4)"

ENTRYPOINT ["/usr/local/bin/gradwatch-entrypoint"]
