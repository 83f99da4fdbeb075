"""The Docker image and docker-compose.yml, checked without a Docker daemon.

- docker-compose.yml: `docker compose config` where docker compose works, and always a schema
  check of the parsed YAML (services, build, healthchecks, volume, env file, start order, no secret
  written in the file).
- Dockerfile: the base, the install, a non-root user, the healthcheck and the entrypoint.
- The entrypoint: the very script the image runs, run here with the environment the image sets,
  against SQLite and against a real PostgreSQL (started as tests/test_postgres.py does); the
  Dockerfile's own HEALTHCHECK command is run against it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
DOCKERFILE = (ROOT / "Dockerfile").read_text()
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"
SECRET_NAME = re.compile(r"PASSWORD|TOKEN|SECRET|_KEY$", re.I)
TOKEN = "test-token-0123456789abcdef"


def instructions(text: str) -> list[tuple[str, str]]:
    """Dockerfile instructions as (KEYWORD, arguments), continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", text)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


STEPS = instructions(DOCKERFILE)


def last(keyword: str) -> str:
    return [rest for kw, rest in STEPS if kw == keyword][-1]


# -- docker-compose.yml ------------------------------------------------------------------------------
def test_compose_services_build_healthchecks_and_volume():
    services = COMPOSE["services"]
    assert set(services) == {"db", "gradwatch"}
    db, server = services["db"], services["gradwatch"]
    assert db["image"].startswith("postgres:")
    assert any(v.split(":")[0] == "pgdata" and v.split(":")[1] == "/var/lib/postgresql/data" for v in db["volumes"])
    assert "pgdata" in COMPOSE["volumes"]
    assert "pg_isready" in " ".join(db["healthcheck"]["test"])
    assert server["build"]["context"] == "." and (ROOT / server["build"]["dockerfile"]).is_file()
    assert "image" not in server or "python" not in server["image"]  # built here, not pip-installed at start
    assert "/healthz" in " ".join(server["healthcheck"]["test"])
    assert server["depends_on"] == {"db": {"condition": "service_healthy"}}
    assert ".env" in server["env_file"] and server["ports"] == ["${GRADWATCH_BIND:-127.0.0.1}:8765:8765"]
    assert server["environment"]["GRADWATCH_DB"].startswith("postgresql://gradwatch:${POSTGRES_PASSWORD")
    assert server["environment"]["GRADWATCH_DB"].endswith("@db:5432/gradwatch")


def test_compose_holds_no_secret_and_refuses_to_start_without_one():
    for name, service in COMPOSE["services"].items():
        for key, value in (service.get("environment") or {}).items():
            if SECRET_NAME.search(key):  # must come from .env, required (:?), never a literal
                assert re.fullmatch(r"\$\{\w+:\?[^}]+\}", str(value)), (name, key, value)
        url = str((service.get("environment") or {}).get("GRADWATCH_DB", ""))
        if "@" in url:
            password = url.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]
            assert re.fullmatch(r"\$\{\w+:\?[^}]+\}", password), password
    example = dict(
        line.split("=", 1)
        for line in (ROOT / ".env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert set(example) >= {"GRADWATCH_TOKEN", "POSTGRES_PASSWORD"}
    assert all(v.startswith("change-me") for k, v in example.items() if SECRET_NAME.search(k))
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert ".env" in ignored and ".env" in (ROOT / ".dockerignore").read_text().splitlines()


def _compose_cli() -> list[str] | None:
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) and subprocess.run(cmd + ["version"], capture_output=True).returncode == 0:
            return cmd
    return None


@pytest.mark.skipif(_compose_cli() is None, reason="docker compose is not installed (the schema checks above ran)")
def test_docker_compose_config_accepts_the_file(tmp_path):
    shutil.copy(ROOT / "docker-compose.yml", tmp_path)
    shutil.copy(ROOT / ".env.example", tmp_path / ".env")
    out = subprocess.run(
        _compose_cli() + ["config", "--format", "json"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    server = json.loads(out.stdout)["services"]["gradwatch"]
    assert server["environment"]["GRADWATCH_TOKEN"] == "change-me-to-a-long-random-token"
    (tmp_path / ".env").write_text("POSTGRES_PASSWORD=x\n")  # no token: compose itself refuses
    out = subprocess.run(_compose_cli() + ["config"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "GRADWATCH_TOKEN" in out.stderr


# -- Dockerfile ----------------------------------------------------------------------------------------
def test_dockerfile_builds_a_slim_non_root_server_image():
    assert STEPS[0] == ("FROM", "python:3.11-slim")
    installs = [rest for kw, rest in STEPS if kw == "RUN" and "pip install" in rest]
    assert installs == ['pip install ".[server,postgres]"']
    assert "torch" not in DOCKERFILE.replace("no torch", "")
    user = last("USER")
    assert user not in ("root", "0") and STEPS.index(("USER", user)) > max(
        i for i, (kw, _) in enumerate(STEPS) if kw == "RUN"
    )  # nothing runs as root after it
    assert "/healthz" in last("HEALTHCHECK") and json.loads(last("ENTRYPOINT")) == [
        "/usr/local/bin/gradwatch-entrypoint"
    ]
    assert ("COPY", "docker/entrypoint.sh /usr/local/bin/gradwatch-entrypoint") in STEPS
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    for kw, rest in STEPS:  # everything copied exists and is not excluded from the build context
        if kw == "COPY":
            for source in rest.split()[:-1]:
                assert (ROOT / source).exists() and source not in ignored, source


def healthcheck_command() -> list[str]:
    """The Dockerfile's HEALTHCHECK CMD (shell form), as argv."""
    return shlex.split(last("HEALTHCHECK").split(" CMD ", 1)[1])


# -- the entrypoint, run as the image runs it ------------------------------------------------------
def image_env(tmp_path, **extra) -> dict:
    """The environment the image sets (Dockerfile ENV), this venv's gradwatch first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADWATCH_")}
    for kw, rest in STEPS:
        if kw == "ENV":
            env.update(dict(pair.split("=", 1) for pair in shlex.split(rest)))
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
        HOME=str(tmp_path),
        GRADWATCH_PORT="0",
        GRADWATCH_TOKEN=TOKEN,
    )
    env.update(extra)
    return env


def start_entrypoint(env: dict) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        ["sh", str(ENTRYPOINT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        match = re.search(r"dashboard at (http://\S+)", line)
        if match:
            return proc, match.group(1)
    proc.wait()
    pytest.fail(f"the entrypoint exited ({proc.returncode}) without serving:\n{''.join(lines)}")


def status_of(url: str, headers: dict | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def wait_healthy(url: str, proc: subprocess.Popen) -> None:
    """The URL is printed once the port is bound; it answers once the app has started."""

    def healthy():
        assert proc.poll() is None, "the server exited"
        try:
            return status_of(url + "/healthz") == 200
        except urllib.error.URLError:
            return False

    wait_until(healthy, timeout=30, interval=0.1, message="the server never answered /healthz")


def check_serving_then_stop(proc: subprocess.Popen, url: str, env: dict) -> None:
    try:
        wait_healthy(url, proc)
        assert status_of(url + "/api/runs") == 401  # the token is on
        assert status_of(url + "/api/runs", {"Authorization": f"Bearer {TOKEN}"}) == 200
        port = url.rsplit(":", 1)[1]
        probe = subprocess.run(
            healthcheck_command(), env={**env, "GRADWATCH_PORT": port}, capture_output=True, text=True, timeout=30
        )
        assert probe.returncode == 0, probe.stderr  # the image's own HEALTHCHECK passes
    finally:
        proc.terminate()  # what `docker stop` sends: it reaches the server itself (exec), which stops
    assert proc.wait(timeout=30) in (0, -15)  # uvicorn shuts down, then re-raises the signal it caught
    probe = subprocess.run(
        healthcheck_command(), env={**env, "GRADWATCH_PORT": url.rsplit(":", 1)[1]}, capture_output=True, timeout=30
    )
    assert probe.returncode != 0  # and the HEALTHCHECK notices a dead server


def test_entrypoint_serves_sqlite_by_default(tmp_path):
    env = image_env(tmp_path, GRADWATCH_DB=f"sqlite:///{tmp_path / 'data' / 'gradwatch.db'}")
    proc, url = start_entrypoint(env)
    check_serving_then_stop(proc, url, env)
    assert (tmp_path / "data" / "gradwatch.db").is_file()


@pytest.mark.slow
def test_entrypoint_serves_postgres(tmp_path, postgres_url):
    env = image_env(tmp_path, GRADWATCH_DB=postgres_url)
    proc, url = start_entrypoint(env)
    check_serving_then_stop(proc, url, env)
    status = subprocess.run(["gradwatch", "db", "status"], env=env, capture_output=True, text=True, timeout=60)
    assert status.returncode == 0 and "is current" in status.stdout


def test_entrypoint_gives_up_on_a_database_that_never_answers(tmp_path):
    env = image_env(
        tmp_path, GRADWATCH_DB="postgresql://gradwatch:pw-in-url@127.0.0.1:9/gradwatch", GRADWATCH_DB_WAIT="2"
    )
    out = subprocess.run(["sh", str(ENTRYPOINT)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "dashboard at" not in out.stdout
    assert "waiting up to 2 s for the database" in out.stderr and "did not answer within 2 s" in out.stderr
    assert "pw-in-url" not in out.stderr + out.stdout


def test_entrypoint_refuses_the_example_token(tmp_path):
    env = image_env(
        tmp_path, GRADWATCH_TOKEN="change-me-to-a-long-random-token", GRADWATCH_DB=f"sqlite:///{tmp_path / 'x.db'}"
    )
    out = subprocess.run(["sh", str(ENTRYPOINT)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "placeholder from .env.example" in out.stderr
    assert not (tmp_path / "x.db").exists()


@pytest.mark.parametrize(
    "extra",
    [
        {"POSTGRES_PASSWORD": "change-me-to-another-long-random-value"},
        {"GRADWATCH_DB": "postgresql://gradwatch:change-me-to-another-long-random-value@127.0.0.1:9/gradwatch"},
    ],
)
def test_entrypoint_refuses_the_example_database_password(tmp_path, extra):
    env = image_env(tmp_path, **{"GRADWATCH_DB": f"sqlite:///{tmp_path / 'x.db'}", **extra})
    out = subprocess.run(["sh", str(ENTRYPOINT)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "PostgreSQL password is still the placeholder" in out.stderr
    assert "change-me-to-another" not in out.stderr and not (tmp_path / "x.db").exists()
