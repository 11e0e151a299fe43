"""``veena-tts download`` / ``VeenaPlugin.download_files()`` against a local fake hub (an
HTTP server in this process speaking the few hub routes ``snapshot_download`` uses), never
the network: the model and its codec land in the cache, offline mode then serves them from
the cache, and an unreachable hub is one clear error."""

import hashlib
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from livekit.plugins.veena.models.download import DownloadError, download_model

SHA = "0" * 40


def _repo_files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


class FakeHub:
    """Serves repositories from dicts of {path: bytes}; records what was asked."""

    def __init__(self, repos: dict[str, dict[str, bytes]]) -> None:
        self.repos = repos
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _route(self, head: bool) -> None:
                hub.requests.append(self.path)
                path = self.path.split("?")[0]
                for repo, files in hub.repos.items():
                    if path.startswith(f"/api/models/{repo}/tree/"):
                        body = json.dumps([{"type": "file", "path": name, "size": len(data),
                                            "oid": hashlib.sha1(data).hexdigest()}
                                           for name, data in files.items()]).encode()
                        return self._send(200, body, "application/json", head)
                    if path.startswith(f"/api/models/{repo}/revision/"):
                        body = json.dumps({"id": repo, "sha": SHA, "siblings": [
                            {"rfilename": name} for name in files]}).encode()
                        return self._send(200, body, "application/json", head)
                    prefix = f"/{repo}/resolve/"
                    if path.startswith(prefix):
                        name = path[len(prefix):].split("/", 1)[1]
                        if name in files:
                            return self._send(200, files[name], "application/octet-stream", head,
                                              etag=hashlib.sha256(files[name]).hexdigest())
                self._send(404, b'{"error": "not found"}', "application/json", head,
                           extra={"X-Error-Code": "RepoNotFound"})

            def _send(self, status, body, ctype, head, etag=None, extra=None):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("X-Repo-Commit", SHA)
                if etag:
                    self.send_header("ETag", f'"{etag}"')
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def do_GET(self):
                self._route(False)

            def do_HEAD(self):
                self._route(True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def hub(tiny_model_dir):
    model = {k: v for k, v in _repo_files(Path(tiny_model_dir)).items()
             if not k.startswith("snac/") and k != "veena_tts.json"}
    codec = _repo_files(Path(tiny_model_dir) / "snac")
    fake = FakeHub({"test/tiny-veena": model, "hubertsiuzdak/snac_24khz": codec})
    yield fake
    fake.close()


def test_model_and_codec_land_in_the_cache(hub, tmp_path, monkeypatch):
    monkeypatch.delenv("VEENA_CODEC_MODEL", raising=False)
    cache = str(tmp_path / "cache")
    model_dir, codec_dir = download_model("test/tiny-veena", profile="veena",
                                          endpoint=hub.url, cache_dir=cache)
    assert (model_dir / "config.json").is_file() and (model_dir / "tokenizer.json").is_file()
    assert (codec_dir / "config.json").is_file() and (codec_dir / "pytorch_model.bin").is_file()
    assert str(model_dir).startswith(cache) and str(codec_dir).startswith(cache)
    # offline, the cache serves both; the hub is not asked again
    import huggingface_hub.constants as hf

    asked = len(hub.requests)
    monkeypatch.setattr(hf, "HF_HUB_OFFLINE", True)
    again = download_model("test/tiny-veena", profile="veena", endpoint=hub.url, cache_dir=cache)
    assert again == [model_dir, codec_dir] and len(hub.requests) == asked
    with pytest.raises(DownloadError, match="'test/absent' is not in the Hugging Face cache "
                                            "and HF_HUB_OFFLINE is set"):
        download_model("test/absent", profile="veena", endpoint=hub.url, cache_dir=cache)
    assert len(hub.requests) == asked


def test_a_missing_repository_is_one_clear_error(hub, tmp_path):
    with pytest.raises(DownloadError, match="cannot download 'nobody/nothing'"):
        download_model("nobody/nothing", endpoint=hub.url, cache_dir=str(tmp_path))
    with pytest.raises(DownloadError, match="VEENA_MODEL"):
        download_model(None)


def test_cli_and_plugin_entry_points(tmp_path, tiny_model_dir, monkeypatch):
    env = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path), "PATH": "/usr/bin",
           "VEENA_TEXT_NORMALIZATION": "off"}  # (the grammars: test_grammars_are_prepared)
    done = subprocess.run([sys.executable, "-m", "livekit.plugins.veena.cli", "download",
                           "nobody/nothing"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "cannot download 'nobody/nothing'" in done.stderr
    assert "Traceback" not in done.stderr
    local = subprocess.run([sys.executable, "-m", "livekit.plugins.veena.cli", "download",
                            tiny_model_dir], env=env, capture_output=True, text=True, timeout=120)
    assert local.returncode == 0 and local.stdout.split() == [tiny_model_dir]
    flag = subprocess.run([sys.executable, "-m", "livekit.plugins.veena.cli", "download",
                           "--model", tiny_model_dir, "-v"], env=env, capture_output=True,
                          text=True, timeout=120)  # spelled as say and serve take it; -v last
    assert flag.returncode == 0 and flag.stdout.split() == [tiny_model_dir], flag.stderr
    both = subprocess.run([sys.executable, "-m", "livekit.plugins.veena.cli", "download",
                           tiny_model_dir, "--model", "nobody/nothing"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert both.returncode == 2 and "two models given" in both.stderr
    from livekit.agents import Plugin

    plugin = next(p for p in Plugin.registered_plugins if p.title == "livekit.plugins.veena")
    monkeypatch.setenv("VEENA_MODEL", tiny_model_dir)
    plugin.download_files()  # a local model with its codec inside: nothing to fetch, no error


@pytest.fixture(scope="module")
def spark_hub(tmp_path_factory):
    """A repository in Spark-TTS-0.5B's layout (LLM/, BiCodec/, config.yaml) and no manifest."""
    from livekit.plugins.veena.models.tiny_model import make_tiny_model

    root = make_tiny_model(tmp_path_factory.mktemp("tiny-spark"), "spark")
    files = {k: v for k, v in _repo_files(root).items() if k != "veena_tts.json"}
    fake = FakeHub({"SparkAudio/Spark-TTS-0.5B": files,
                    "test/not-spark": {k: v for k, v in files.items() if k.startswith("LLM/")}})
    yield fake
    fake.close()


def test_a_spark_checkpoint_is_found_by_its_layout(spark_hub, tmp_path, monkeypatch):
    """``veena-tts download SparkAudio/Spark-TTS-0.5B``: the snapshot, its LLM folder and its
    BiCodec folder; the profile follows from the layout (no manifest in a real checkpoint)."""
    monkeypatch.delenv("VEENA_CODEC_MODEL", raising=False)
    monkeypatch.delenv("VEENA_PROFILE", raising=False)
    root, llm, codec = download_model("SparkAudio/Spark-TTS-0.5B", endpoint=spark_hub.url,
                                      cache_dir=str(tmp_path))
    assert llm == root / "LLM" and (llm / "config.json").is_file() and (llm / "tokenizer.json").is_file()
    assert codec == root / "BiCodec" and (codec / "model.safetensors").is_file()
    assert (root / "config.yaml").is_file()
    with pytest.raises(DownloadError, match="no LLM/ and BiCodec/ folders"):
        download_model("test/not-spark", profile="spark", endpoint=spark_hub.url,
                       cache_dir=str(tmp_path))


def test_lora_adapters_are_fetched_ahead_of_time(tiny_model_dir, tmp_path, monkeypatch):
    """``veena-tts download --lora acme=OWNER/REPO`` and ``download-files`` with
    ``VEENA_LORA``: only the adapter's config and weights land in the cache, and they pass
    the check against the model; a missing repository is one clear error."""
    from livekit.plugins.veena.models.adapters import (AdapterError, check_adapter,
                                                       download_adapters)
    from livekit.plugins.veena.models.tiny_model import make_random_adapter

    adapter = make_random_adapter(tmp_path / "acme", tiny_model_dir, rank=8, seed=1)
    (adapter / "README.md").write_text("not fetched")
    fake = FakeHub({"test/acme-lora": _repo_files(adapter)})
    try:
        (folder,) = download_adapters({"acme": "test/acme-lora"}, endpoint=fake.url,
                                      cache_dir=str(tmp_path / "cache"))
        assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json",
                                                            "adapter_model.safetensors"]
        assert check_adapter("acme", str(folder), tiny_model_dir).rank == 8
        with pytest.raises(AdapterError, match="cannot download adapter 'test/absent'"):
            download_adapters({"x": "test/absent"}, endpoint=fake.url,
                              cache_dir=str(tmp_path / "cache"))
    finally:
        fake.close()
    # a local adapter is its own folder: printed by the command, nothing fetched
    env = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path), "PATH": "/usr/bin",
           "VEENA_TEXT_NORMALIZATION": "off"}  # (the grammars: test_grammars_are_prepared)
    done = subprocess.run([sys.executable, "-m", "livekit.plugins.veena.cli", "download",
                           tiny_model_dir, "--lora", f"acme={adapter}"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.split() == [tiny_model_dir, str(adapter)]
    bad = subprocess.run([sys.executable, "-m", "livekit.plugins.veena.cli", "download",
                          tiny_model_dir, "--lora", "acme"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "NAME=PATH_OR_HUB_ID" in bad.stderr
