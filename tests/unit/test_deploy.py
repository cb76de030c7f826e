"""deploy/: every manifest parses, and what it names exists.

The Dockerfile, the KubeRay manifests, the cluster-launcher YAML, the compose file, the settings
example and deploy/README.md name CLI commands and options, settings, ports, files and image tags.
Nothing here builds an image or talks to Kubernetes: these tests catch a manifest that drifts from
the code (a renamed command, a setting that does not exist, ports that disagree, a missing file).
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import typer.main
import yaml

from stratagem.runtime import Settings
from stratagem.runtime._cli import app

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

GCS_PORT = 6379
DASHBOARD_PORT = 8265
CLIENT_PORT = 10001
OTLP_GRPC_PORT = 4317

# Where the image keeps the example goals (the Dockerfile's WORKDIR, checked below).
IMAGE_HOME = "/home/stratagem"


def _yaml_docs(path: Path) -> list[dict[str, Any]]:
    docs = [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]
    assert docs, f"{path} holds no YAML document"
    for doc in docs:
        assert isinstance(doc, dict), f"{path}: a document is not a mapping"
    return docs


def _yaml(path: Path) -> dict[str, Any]:
    (doc,) = _yaml_docs(path)
    return doc


def _kuberay(kind: str) -> list[dict[str, Any]]:
    return [
        doc
        for path in sorted((DEPLOY / "kuberay").glob("*.yaml"))
        for doc in _yaml_docs(path)
        if doc["kind"] == kind
    ]


def _dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (INSTRUCTION, arguments), continuation lines joined."""
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    joined = re.sub(r"\\\n", " ", text)
    instructions = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            instructions.append((word.upper(), rest.strip()))
    return instructions


def _instruction(name: str) -> list[str]:
    return [args for word, args in _dockerfile() if word == name]


def _pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    for cluster in _kuberay("RayCluster"):
        spec = cluster["spec"]
        yield "head", spec["headGroupSpec"]["template"]["spec"]
        for group in spec["workerGroupSpecs"]:
            yield group["groupName"], group["template"]["spec"]


def _containers() -> Iterator[dict[str, Any]]:
    for _, pod in _pod_specs():
        yield from pod.get("initContainers", [])
        yield from pod["containers"]


def _compose() -> dict[str, Any]:
    return _yaml(DEPLOY / "compose.yaml")


def _stratagem_services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = _compose()["services"]
    return {name: svc for name, svc in services.items() if svc["image"].startswith("stratagem:")}


def _cluster_launcher() -> dict[str, Any]:
    return _yaml(DEPLOY / "cluster.yaml")


# -- every `stratagem ...` command line in deploy/ -----------------------------------------------


def _shell_texts() -> Iterator[tuple[str, str]]:
    """(where, shell text) for every command line the deployment runs or documents."""
    for word, args in _dockerfile():
        if word == "RUN":
            yield "Dockerfile RUN", args
        elif word in ("ENTRYPOINT", "CMD"):
            yield f"Dockerfile {word}", shlex.join(json.loads(args))
    entrypoint = json.loads(_instruction("ENTRYPOINT")[-1])
    cmd = json.loads(_instruction("CMD")[-1])
    yield "Dockerfile ENTRYPOINT + CMD", shlex.join([*entrypoint, *cmd])
    for job in _kuberay("RayJob"):
        yield f"RayJob {job['metadata']['name']}", job["spec"]["entrypoint"]
    for container in _containers():
        argv = [*container.get("command", []), *container.get("args", [])]
        if argv:
            yield f"container {container['name']}", shlex.join(argv)
    launcher = _cluster_launcher()
    for key, value in launcher.items():
        if key.endswith("_commands"):
            for command in value:
                yield f"cluster.yaml {key}", command
    for name, svc in _compose()["services"].items():
        if "command" not in svc:
            continue
        command = svc["command"]
        argv = command if isinstance(command, list) else shlex.split(command)
        if svc.get("image", "").startswith("stratagem:") and "entrypoint" not in svc:
            # The image's entrypoint runs the command: tini -- stratagem <command>.
            argv = [*entrypoint, *argv]
        yield f"compose service {name}", shlex.join(argv)
    readme = (DEPLOY / "README.md").read_text(encoding="utf-8")
    for block in re.findall(r"```(?:bash|sh|console)?\n(.*?)```", readme, flags=re.DOTALL):
        yield "deploy/README.md", block


def _segments(text: str) -> Iterator[list[str]]:
    """Simple commands in ``text``: continuation lines joined, split at ; && || | and newlines."""
    text = re.sub(r"\\\n", " ", text)
    for line in text.splitlines():
        line = re.sub(r"(?<!\S)#.*$", "", line)  # comments
        for part in re.split(r"&&|\|\||;|\|", line):
            try:
                tokens = shlex.split(part)
            except ValueError:
                continue
            if tokens:
                yield tokens


def _invocations() -> list[tuple[str, list[str]]]:
    """(where, argv after `stratagem`) for each time a command line runs the stratagem CLI.

    `stratagem` starts a command (after VAR=value words), follows `--` (`ray job submit --`,
    `tini --`), or follows a container in `docker compose exec SERVICE stratagem ...`. A quoted
    command (`ray exec cluster.yaml 'stratagem status'`) is looked into as well.
    """
    found: list[tuple[str, list[str]]] = []

    def scan(where: str, tokens: list[str]) -> None:
        for i, token in enumerate(tokens):
            if " " in token:
                for inner in _segments(token):
                    scan(where, inner)
                continue
            if token != "stratagem":
                continue
            before = [t for t in tokens[:i] if not re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", t)]
            rest = tokens[i + 1 :]
            starts = not before or before[-1] in ("--", "exec") or before[-2:-1] == ["exec"]
            if starts and rest:
                found.append((where, rest))

    for where, text in _shell_texts():
        for tokens in _segments(text):
            scan(where, tokens)
    return found


def _cli_command(argv: list[str]) -> tuple[Any, list[str]]:
    """The CLI command ``argv`` selects (a Typer/Click command object) and the words after it."""
    # Typer builds Click-style commands (its own copy of Click in recent versions): a group has
    # ``commands``, every command ``params`` with their ``opts``.
    command: Any = typer.main.get_command(app)
    words = list(argv)
    while hasattr(command, "commands") and words and not words[0].startswith("-"):
        sub = command.commands.get(words[0])
        assert sub is not None, f"`stratagem {' '.join(argv)}`: no command {words[0]!r}"
        command, words = sub, words[1:]
    return command, words


def test_every_stratagem_command_line_names_real_commands_and_options() -> None:
    invocations = _invocations()
    # Each path runs the CLI: the image, KubeRay, the cluster launcher, compose, the README.
    wheres = {where.split()[0] for where, _ in invocations}
    assert {"Dockerfile", "RayJob", "cluster.yaml", "compose", "deploy/README.md"} <= wheres
    for where, argv in invocations:
        command, words = _cli_command(argv)
        options = {opt for param in command.params for opt in param.opts}
        options.add("--help")
        for word in words:
            if word.startswith("--"):
                assert word.split("=")[0] in options, (
                    f"{where}: `stratagem {' '.join(argv)}`: {command.name} has no option {word}"
                )
        if hasattr(command, "commands"):
            assert "--help" in words, f"{where}: `stratagem {' '.join(argv)}` names no command"


def test_agents_are_deployed_with_up_on_every_path() -> None:
    ups = {where.split()[0] for where, argv in _invocations() if argv[0] == "up"}
    assert {"RayJob", "cluster.yaml", "compose"} <= ups


# -- settings ------------------------------------------------------------------------------------


def _deploy_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.is_file() and p.name != "requirements.lock")


def test_every_stratagem_variable_is_a_setting() -> None:
    known = {f"STRATAGEM_{name.upper()}" for name in Settings.model_fields}
    # Read outside Settings, by the CLI's entry point (logging is set up before settings load).
    known |= {"STRATAGEM_LOG_LEVEL"}
    named: dict[str, set[str]] = {}
    for path in _deploy_files():
        for var in re.findall(r"\bSTRATAGEM_[A-Z0-9_]+", path.read_text(encoding="utf-8")):
            named.setdefault(var, set()).add(path.relative_to(ROOT).as_posix())
    unknown = {var: sorted(paths) for var, paths in named.items() if var not in known}
    assert not unknown, f"not settings of runtime.Settings: {unknown}"
    # The settings the cluster paths depend on are actually wired somewhere.
    for var in ("STRATAGEM_STORE_URL", "STRATAGEM_AUTH", "STRATAGEM_STATE_DIR"):
        assert var in named, var


def _values_are_valid(env: dict[str, str], where: str) -> None:
    """The STRATAGEM_* values parse as settings (placeholders like $HOME aside)."""
    fields = {
        name[len("STRATAGEM_") :].lower(): value
        for name, value in env.items()
        if name.startswith("STRATAGEM_") and "$" not in value
    }
    try:
        Settings.model_validate(fields)
    except ValueError as exc:  # pydantic.ValidationError is a ValueError
        pytest.fail(f"{where}: invalid settings {fields}: {exc}")


def test_setting_values_are_valid() -> None:
    for name, svc in _stratagem_services().items():
        _values_are_valid(svc["environment"], f"compose service {name}")
    for config_map in _kuberay("ConfigMap"):
        _values_are_valid(config_map["data"], f"ConfigMap {config_map['metadata']['name']}")
    for secret in _kuberay("Secret"):
        _values_are_valid(
            {"STRATAGEM_STORE_URL": secret["stringData"]["store-url"]}, "Secret store-url"
        )
    example = (DEPLOY / "stratagem.env.example").read_text(encoding="utf-8")
    env = dict(re.findall(r"^([A-Z_][A-Z0-9_]*)=\"?([^\"\n]*)\"?$", example, flags=re.MULTILINE))
    assert "STRATAGEM_STORE_URL" in env
    _values_are_valid(env, "stratagem.env.example")


# -- ports ---------------------------------------------------------------------------------------


def test_dockerfile_exposes_the_ray_ports() -> None:
    exposed = {int(port) for args in _instruction("EXPOSE") for port in args.split()}
    assert {GCS_PORT, DASHBOARD_PORT, CLIENT_PORT} <= exposed


def test_kuberay_head_ports_match() -> None:
    (cluster,) = _kuberay("RayCluster")
    (head,) = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
    ports = {port["name"]: port["containerPort"] for port in head["ports"]}
    assert ports["gcs-server"] == GCS_PORT
    assert ports["dashboard"] == DASHBOARD_PORT
    assert ports["client"] == CLIENT_PORT


def _flags(command: str) -> dict[str, str]:
    return dict(re.findall(r"--([\w-]+)=(\S+)", command))


def test_cluster_launcher_ports_match() -> None:
    launcher = _cluster_launcher()
    (head,) = [c for c in launcher["head_start_ray_commands"] if "ray start" in c]
    flags = _flags(head)
    assert flags["port"] == str(GCS_PORT)
    assert flags["dashboard-port"] == str(DASHBOARD_PORT)
    assert flags["ray-client-server-port"] == str(CLIENT_PORT)
    (worker,) = [c for c in launcher["worker_start_ray_commands"] if "ray start" in c]
    assert _flags(worker)["address"].endswith(f":{GCS_PORT}")


def test_compose_ports_and_addresses_match() -> None:
    services = _compose()["services"]
    head = shlex.join(services["ray-head"]["command"])
    flags = _flags(head)
    assert flags["port"] == str(GCS_PORT)
    assert flags["dashboard-port"] == str(DASHBOARD_PORT)
    assert flags["ray-client-server-port"] == str(CLIENT_PORT)
    published = {str(mapping).rsplit(":", 1)[-1] for mapping in services["ray-head"]["ports"]}
    assert {str(DASHBOARD_PORT), str(CLIENT_PORT)} <= published
    worker = shlex.join(services["ray-worker"]["command"])
    assert _flags(worker)["address"] == f"ray-head:{GCS_PORT}"
    up = services["stratagem-up"]["command"]
    assert up[up.index("--address") + 1] == f"ray://ray-head:{CLIENT_PORT}"


def _port(url: str) -> int:
    match = re.search(r":(\d+)/?$", url)
    assert match, f"no port in {url!r}"
    return int(match.group(1))


def test_otlp_endpoints_use_the_collectors_grpc_port() -> None:
    compose = _compose()
    collector = yaml.safe_load(compose["configs"]["otel-collector"]["content"])
    grpc = collector["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
    assert _port(grpc) == OTLP_GRPC_PORT
    endpoints = [
        svc["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] for svc in _stratagem_services().values()
    ]
    endpoints += [cm["data"]["OTEL_EXPORTER_OTLP_ENDPOINT"] for cm in _kuberay("ConfigMap")]
    example = (DEPLOY / "stratagem.env.example").read_text(encoding="utf-8")
    endpoints += re.findall(r"^OTEL_EXPORTER_OTLP_ENDPOINT=(\S+)$", example, flags=re.MULTILINE)
    assert len(endpoints) >= 3
    for endpoint in endpoints:
        assert _port(endpoint) == OTLP_GRPC_PORT, endpoint
    host = compose["services"]["stratagem-up"]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"]
    assert host == f"http://otel-collector:{OTLP_GRPC_PORT}"


# -- files and images ----------------------------------------------------------------------------


def test_named_example_goals_exist() -> None:
    named = set()
    for path in _deploy_files():
        for match in re.findall(r"(?:[\w/.~-]*/)?examples/[\w/.<>-]+\.ya?ml", path.read_text()):
            if "<" not in match:  # examples/<goal>.yaml is a placeholder
                named.add(match.removeprefix(f"{IMAGE_HOME}/"))
    assert "examples/crown.yaml" in named
    for name in named:
        assert (ROOT / name).is_file(), f"deploy/ names {name}, which does not exist"


def test_dockerfile_runs_as_a_non_root_user_from_a_pinned_base() -> None:
    args = dict(arg.split("=", 1) for arg in _instruction("ARG") if "=" in arg)
    (base,) = _instruction("FROM")
    base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base).split()[0]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?", base), base
    user = _instruction("USER")[-1].split(":")[0]
    assert user not in ("0", "root"), user
    # Numeric, so Kubernetes' runAsNonRoot can check it, and the UID the manifests run as.
    assert user.isdigit()
    for _, pod in _pod_specs():
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == int(user)
    entrypoint = json.loads(_instruction("ENTRYPOINT")[-1])
    assert entrypoint[-1] == "stratagem"
    assert _instruction("WORKDIR")[-1] == IMAGE_HOME


def test_dockerfile_copies_files_that_exist_and_installs_the_lock() -> None:
    for args in _instruction("COPY"):
        sources = [word for word in args.split() if not word.startswith("--")][:-1]
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"
    assert any(
        "--require-hashes" in run and "requirements.lock" in run for run in _instruction("RUN")
    )


def _pins() -> dict[str, str]:
    lock = (DEPLOY / "requirements.lock").read_text(encoding="utf-8")
    return {
        name.lower().replace("_", "-"): version
        for name, version in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", lock, flags=re.MULTILINE)
    }


def test_the_lock_pins_every_runtime_dependency_with_hashes() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    pins = _pins()
    for requirement in pyproject["project"]["dependencies"]:
        name = re.split(r"[\[<>=!~;\s]", requirement, maxsplit=1)[0].lower().replace("_", "-")
        assert name in pins, f"{name} (pyproject.toml) is not pinned in deploy/requirements.lock"
    lock = (DEPLOY / "requirements.lock").read_text(encoding="utf-8")
    entries = re.split(r"\n(?=[A-Za-z0-9])", lock.split("\n", 3)[-1])
    for entry in entries:
        if "==" in entry:
            assert "--hash=sha256:" in entry, entry.splitlines()[0]


def test_one_image_and_one_ray_version_everywhere() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "version"
    ]
    images = {container["image"] for container in _containers()}
    images |= {svc["image"] for svc in _stratagem_services().values()}
    assert images == {f"stratagem:{version}"}
    (cluster,) = _kuberay("RayCluster")
    assert cluster["spec"]["rayVersion"] == _pins()["ray"]


# -- manifests are well-formed for their tool ----------------------------------------------------


def test_cluster_launcher_yaml_satisfies_rays_schema() -> None:
    spec = find_spec("ray")
    assert spec is not None
    assert spec.submodule_search_locations
    schema_path = Path(next(iter(spec.submodule_search_locations))) / "autoscaler/ray-schema.json"
    schema = json.loads(schema_path.read_text(encoding="utf-8"))
    launcher = _cluster_launcher()
    jsonschema.validate(launcher, schema)
    provider = launcher["provider"]
    assert provider["type"] == "local"
    assert launcher["max_workers"] == len(provider["worker_ips"])
    for local in launcher["file_mounts"].values():
        path = ROOT / local
        assert path.exists() or path.with_name(path.name + ".example").exists(), local


def test_kuberay_resources_fit_together() -> None:
    (cluster,) = _kuberay("RayCluster")
    assert cluster["apiVersion"] == "ray.io/v1"
    spec = cluster["spec"]
    assert {"rayStartParams", "template"} <= set(spec["headGroupSpec"])
    for group in spec["workerGroupSpecs"]:
        assert {"groupName", "rayStartParams", "template"} <= set(group)
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    jobs = _kuberay("RayJob")
    assert jobs
    for job in jobs:
        assert job["apiVersion"] == "ray.io/v1"
        # A job either selects the running cluster or brings its own; these select ours.
        assert "rayClusterSpec" not in job["spec"]
        assert job["spec"]["clusterSelector"] == {"ray.io/cluster": cluster["metadata"]["name"]}
    secrets = {s["metadata"]["name"]: set(s["stringData"]) for s in _kuberay("Secret")}
    config_maps = {c["metadata"]["name"] for c in _kuberay("ConfigMap")}
    for where, pod in _pod_specs():
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        for volume in volumes.values():
            if "secret" in volume:
                keys = {item["key"] for item in volume["secret"]["items"]}
                assert keys <= secrets[volume["secret"]["secretName"]], where
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes, f"{where}: no volume {mount['name']}"
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in secrets[ref["name"]], f"{where}: {env['name']}"
            for source in container.get("envFrom", []):
                assert source["configMapRef"]["name"] in config_maps, where


def test_compose_references_resolve() -> None:
    compose = _compose()
    services = compose["services"]
    for name, svc in services.items():
        for dependency in svc.get("depends_on", []):
            assert dependency in services, f"{name} depends on unknown {dependency}"
        for config in svc.get("configs", []):
            assert config["source"] in compose["configs"], name
        for volume in svc.get("volumes", []):
            source = volume.split(":", 1)[0]
            assert source in compose["volumes"], f"{name}: volume {source}"
    for name, svc in _stratagem_services().items():
        build = svc["build"]
        context = (DEPLOY / build["context"]).resolve()
        assert (context / build["dockerfile"]) == DEPLOY / "Dockerfile", name


# -- Ray's token authentication ------------------------------------------------------------------


def _token_env(env: list[dict[str, Any]], where: str) -> None:
    """``env`` (a container's) turns Ray's token auth on with the token from the Secret."""
    by_name = {item["name"]: item for item in env}
    assert by_name.get("RAY_AUTH_MODE", {}).get("value") == "token", where
    ref = by_name.get("RAY_AUTH_TOKEN", {}).get("valueFrom", {}).get("secretKeyRef", {})
    (secret,) = _kuberay("Secret")
    assert ref.get("name") == secret["metadata"]["name"], where
    assert ref.get("key") in secret["stringData"], where


def test_every_kuberay_ray_container_and_job_submitter_uses_the_ray_token() -> None:
    containers = [c for _, pod in _pod_specs() for c in pod["containers"]]
    assert containers
    for container in containers:
        _token_env(container.get("env", []), f"container {container['name']}")
    jobs = _kuberay("RayJob")
    assert jobs
    for job in jobs:
        (submitter,) = job["spec"]["submitterPodTemplate"]["spec"]["containers"]
        _token_env(submitter["env"], f"RayJob {job['metadata']['name']} submitter")


def test_every_compose_ray_process_uses_the_ray_token() -> None:
    for name, svc in _stratagem_services().items():
        env = svc["environment"]
        assert env["RAY_AUTH_MODE"] == "token", name
        # Required from the shell (compose fails without it), never a token written in the file.
        assert re.fullmatch(r"\$\{RAY_AUTH_TOKEN:\?[^}]+\}", env["RAY_AUTH_TOKEN"]), name
    probe = " ".join(_compose()["services"]["ray-head"]["healthcheck"]["test"])
    assert "Authorization: Bearer $$RAY_AUTH_TOKEN" in probe


def test_the_cluster_launcher_gives_every_machine_the_ray_token() -> None:
    launcher = _cluster_launcher()
    assert launcher["file_mounts"]["~/ray.token"] == "deploy/ray.token"
    assert "deploy/ray.token" in launcher["rsync_exclude"]
    setup = "\n".join(launcher["setup_commands"])
    assert "chmod 600 ~/ray.token && ! grep -q REPLACE ~/ray.token" in setup  # not the example
    assert 'export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$HOME/ray.token"' in setup
    ignored = (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    assert "deploy/ray.token" in ignored
