"""One real local Ray per test session, with the four agents deployed in it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from stratagem.runtime import Deployment, Settings, load_settings, setup_telemetry


@pytest.fixture(scope="session")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stratagem-state")


@pytest.fixture(scope="session", autouse=True)
def cluster_secret_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One cluster secret for every deployment of the session (token authentication is on)."""
    path = tmp_path_factory.mktemp("secret") / "cluster.secret"
    previous = os.environ.get("STRATAGEM_SECRET_FILE")
    os.environ["STRATAGEM_SECRET_FILE"] = str(path)
    yield path
    if previous is None:
        del os.environ["STRATAGEM_SECRET_FILE"]
    else:
        os.environ["STRATAGEM_SECRET_FILE"] = previous


@pytest.fixture(scope="session")
def settings(state_dir: Path, cluster_secret_file: Path) -> Settings:
    return load_settings(
        state_dir=state_dir,
        trace_file=state_dir / "spans.jsonl",
        default_deadline_s=20.0,
        request_timeout_s=30.0,
    )


@pytest.fixture(scope="session", autouse=True)
def telemetry(settings: Settings) -> None:
    """This process's tracer provider, made before any test can make another: OpenTelemetry's
    provider is set once per process, and a test running the CLI in-process would otherwise make
    it (service stratagem-cli, its own span file) for every later test."""
    setup_telemetry("stratagem-tests", trace_file=settings.trace_file)


@pytest.fixture(scope="session")
def deployment(settings: Settings) -> Iterator[Deployment]:
    """The four agents on an embedded Ray, torn down (and Ray shut down) at the session's end."""
    setup_telemetry("stratagem-tests", trace_file=settings.trace_file)
    with Deployment(settings).embedded() as dep:
        yield dep


@pytest.fixture(scope="session")
def endpoints(deployment: Deployment) -> dict[str, str]:
    return {info.role: info.endpoint for info in deployment.status()}
