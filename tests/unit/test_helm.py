"""deploy/helm/stratagem: the chart renders to the manifests deploy/kuberay/ holds.

No ``helm`` binary can be installed here (it is on none of the package registries this machine
reaches), so the chart keeps to plain substitutions (``{{ .Values.a.b }}``, ``{{ .Release.Name }}``)
which this test renders itself; ``helm template``/``helm lint`` render them the same way.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "stratagem"
KUBERAY = ROOT / "deploy" / "kuberay"
ACTION = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}")
RELEASE = "stratagem"


def _lookup(values: dict[str, Any], path: str) -> Any:
    item: Any = values
    for part in path.split("."):
        assert isinstance(item, dict), f".Values.{path}: {part!r} is under a value, not a table"
        assert part in item, f".Values.{path} is not in values.yaml"
        item = item[part]
    return item


def _render(text: str, values: dict[str, Any]) -> str:
    def substitute(match: re.Match[str]) -> str:
        action = match.group(1)
        if action == ".Release.Name":
            return RELEASE
        if action.startswith(".Values."):
            return str(_lookup(values, action.removeprefix(".Values.")))
        pytest.fail(f"the chart uses {{{{ {action} }}}}, more than plain substitution")

    return ACTION.sub(substitute, text)


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict[str, Any]]:
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    docs: dict[str, dict[str, Any]] = {}
    for template in sorted((CHART / "templates").glob("*.yaml")):
        text = _render(template.read_text(encoding="utf-8"), values)
        assert "{{" not in text
        for doc in yaml.safe_load_all(text):
            if doc is not None:
                docs[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    _render((CHART / "templates" / "NOTES.txt").read_text(encoding="utf-8"), values)
    return docs


def test_the_chart_is_described() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "stratagem"
    assert re.fullmatch(r"\d+\.\d+\.\d+", chart["version"])
    lock = (ROOT / "deploy" / "requirements.lock").read_text(encoding="utf-8")
    ray = re.search(r"^ray==(\S+)", lock, flags=re.MULTILINE)
    assert ray is not None
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    assert values["rayVersion"] == ray.group(1)


def test_the_chart_renders_a_cluster_its_config_and_the_job_that_deploys(
    rendered: dict[str, dict[str, Any]],
) -> None:
    assert set(rendered) == {
        f"ConfigMap/{RELEASE}",
        f"RayCluster/{RELEASE}",
        f"RayJob/{RELEASE}-up",
    }
    job = rendered[f"RayJob/{RELEASE}-up"]
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": RELEASE}
    assert job["spec"]["entrypoint"] == "stratagem up --address auto"
    assert isinstance(job["spec"]["activeDeadlineSeconds"], int)


def test_the_rendered_cluster_is_the_reference_manifest(
    rendered: dict[str, dict[str, Any]],
) -> None:
    (reference,) = [
        doc
        for doc in yaml.safe_load_all((KUBERAY / "raycluster.yaml").read_text(encoding="utf-8"))
        if doc
    ]
    cluster = rendered[f"RayCluster/{RELEASE}"]
    # With the default values the chart's cluster is deploy/kuberay's, labels aside.
    for doc in (cluster, reference):
        doc["metadata"]["labels"].pop("app.kubernetes.io/instance", None)
    assert cluster == reference


def test_the_config_names_only_real_settings(rendered: dict[str, dict[str, Any]]) -> None:
    from stratagem.runtime import Settings

    data = rendered[f"ConfigMap/{RELEASE}"]["data"]
    for key in data:
        if key.startswith("STRATAGEM_"):
            assert key.removeprefix("STRATAGEM_").lower() in Settings.model_fields
