"""Every name the user documentation gives (docs/*.md, README.md, .env.example) exists in the
code: ``VEENA_*`` variables the code reads, ``veena-tts`` subcommands and their flags (the real
argparse parser), benchmark flags, HTTP routes (the app's router), Prometheus metrics (the
exported names), ``veena.TTS(...)`` / ``update_options(...)`` / ``FallbackAdapter`` keywords
(their signatures), and the defaults stated for variables (.env.example's); the plugin page's
parameter table matches ``TTS.__init__``, the operations page lists every metric, and the HTTP
page's OpenAI snippet runs against a server on the fake engine. No vLLM engine is started."""

from __future__ import annotations

import argparse
import ast
import asyncio
import inspect
import json
import re
import wave
from pathlib import Path

import openai
import pytest
from livekit.agents import tts
from livekit.agents.types import NOT_GIVEN

from livekit.plugins import veena
from livekit.plugins.veena import cli
from livekit.plugins.veena.pipeline.engine_options import SAMPLING_FIELDS
from livekit.plugins.veena.server.app import ServerOptions
from livekit.plugins.veena.server.metrics import ServerMetrics

from .fakes import fake_server
from .helpers import app_routes
from .servers import API_KEY

ROOT = Path(__file__).resolve().parents[1]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", ROOT / ".env.example"]
CODE_DIRS = ("plugin", "agent")
# flags of other tools' commands that the pages show (pip, mkdocs, docker, kubectl, uv)
OTHER_TOOLS = ("pip", "mkdocs", "docker", "kubectl", "uv", "curl", "livekit-server", "python",
               ".venv/bin/python", "hadolint", "pytest", ".venv/bin/mkdocs", "helm")
OTHER_FLAGS = {"--extra-index-url", "--no-deps", "--strict", "--env-file", "--gpus"}


def _pages() -> dict[str, str]:
    return {p.name if p.parent == ROOT else f"docs/{p.name}": p.read_text() for p in PAGES}


def _code_text() -> str:
    return "\n".join(p.read_text() for folder in CODE_DIRS
                     for p in sorted((ROOT / folder).rglob("*.py")))


# --- what the code has ------------------------------------------------------------------------

def _env_vars_read() -> set[str]:
    """VEENA_* names the code spells, plus those it composes (``f"{prefix}_FIRST"`` over a
    prefix such as ``"VEENA_SNAC_WINDOW"``), and those scripts/*.sh expand."""
    code = _code_text()
    literals = set(re.findall(r"\"(VEENA_[A-Z0-9_]+)\"", code))
    suffixes = set(re.findall(r"f\"\{prefix\}_([A-Z0-9_]+)\"", code))
    scripts = "\n".join(p.read_text() for p in sorted((ROOT / "scripts").glob("*.sh")))
    shell = set(re.findall(r"\$\{?(VEENA_[A-Z0-9_]+)", scripts))  # the test runner's own
    return literals | shell | {f"{p}_{s}" for p in literals for s in suffixes}


class _Parser(Exception):
    pass


def _cli_parser(monkeypatch) -> argparse.ArgumentParser:
    """The parser ``veena-tts`` really builds: caught at its ``parse_args``."""
    def caught(self, *args, **kwargs):
        raise _Parser(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", caught)
    with pytest.raises(_Parser) as info:
        cli.main([])
    monkeypatch.undo()
    return info.value.args[0]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def _metrics() -> set[str]:
    exported = ServerMetrics().render().decode()
    return {m for m in re.findall(r"^# TYPE (\S+) ", exported, re.M)
            if not m.endswith("_created")}


# --- what the pages say -----------------------------------------------------------------------

def _code_spans(text: str) -> list[str]:
    """Inline code spans and the lines of fenced code blocks."""
    spans, rest = [], []
    for i, block in enumerate(re.split(r"^```[^\n]*$", text, flags=re.M)):
        (spans.extend(block.splitlines()) if i % 2 else rest.append(block))
    for part in rest:
        spans += re.findall(r"`([^`]+)`", part.replace("\n", " "))
    return spans


def _commands(span: str, program: str) -> list[list[str]]:
    """The words after each ``program`` in ``span``, up to a shell separator."""
    out = []
    if span.split()[:1] and span.split()[0] in OTHER_TOOLS:
        return []  # `docker build -t veena-tts .`: another tool's command
    for m in re.finditer(rf"(?:^|[\s(]|bin/){re.escape(program)}(?=\s)", span):
        words = []
        for word in span[m.end():].split():
            if word in ("|", ";", "&&", "||", "#") or word.startswith("#"):
                break
            words.append(word.strip("[]()`,"))
        out.append(words)
    return out


def _options(words: list[str]) -> list[str]:
    return [w.split("=", 1)[0] for w in words if re.fullmatch(r"--?[a-z][a-z0-9-]*(=.*)?", w)]


def _calls(text: str, name: str) -> list[str]:
    """Keywords of every ``name(...)`` call on a page (across wrapped lines)."""
    flat, found = text.replace("\n", " "), []
    for m in re.finditer(re.escape(name) + r"\(", flat):
        depth, i = 1, m.end()
        while i < len(flat) and depth:
            depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(flat[i], 0)
            if depth == 1 and flat[i] == "=" and flat[i + 1:i + 2] != "=":
                word = re.search(r"(\w+)\s*$", flat[m.end():i])
                if word and flat[i - 1] not in "!<>=":
                    found.append(word.group(1))
            i += 1
    return found


# --- the claims ---------------------------------------------------------------------------------

def test_every_environment_variable_named_is_read_by_the_code():
    read = _env_vars_read()
    missing, checked = [], 0
    for page, text in _pages().items():
        for name, star in re.findall(r"\b(VEENA_[A-Z0-9_]*[A-Z0-9])(_?\*)?", text):
            if star:  # VEENA_GUARD_*: a family of variables
                ok = any(v.startswith(name + "_") for v in read)
            else:
                ok = name in read
            checked += 1
            if not ok:
                missing.append(f"{page}: {name}{star}")
    assert checked > 100 and not missing, sorted(set(missing))


def test_every_default_stated_for_a_variable_is_its_default_in_env_example():
    """`VEENA_X` (5 s) in prose and `| `VEENA_X` | 5 |` in a table: the number is the
    variable's value in .env.example (the documented default, read by the code)."""
    env = dict(line.split("=", 1) for line in (ROOT / ".env.example").read_text().splitlines()
               if "=" in line and not line.startswith("#"))
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    stated, wrong = 0, []
    for page, text in _pages().items():
        flat = " ".join(text.split())
        for name, num, unit in re.findall(
                r"`(VEENA_[A-Z0-9_]+)` (?:\((?:default )?|\| )(\d+(?:\.\d+)?)(?: (KiB|MiB|GiB))?",
                flat):
            value = env.get(name, "").strip("'")
            if not re.fullmatch(r"\d+(?:\.\d+)?", value):
                continue  # computed where empty (from the machine, the profile)
            stated += 1
            if float(num) * units.get(unit, 1) != float(value):
                wrong.append(f"{page}: {name} {num} {unit} (.env.example: {value})")
    assert stated > 15 and not wrong, wrong


def test_every_veena_tts_command_and_flag_named_exists(monkeypatch):
    parser = _cli_parser(monkeypatch)
    commands = _subparsers(parser)
    voice = _subparsers(commands["voice"])
    every_flag = _flags(parser).union(*(_flags(p) for p in [*commands.values(),
                                                            *voice.values()]))
    bench_flags = set(re.findall(r"\"(--[a-z][a-z0-9-]*)\"", "\n".join(
        p.read_text() for p in (ROOT / "bench").glob("*.py"))))
    wrong, checked = [], set()
    for page, text in _pages().items():
        for span in _code_spans(text):
            runs = [*_commands(span, "veena-tts"), *_commands(span, "scripts/veena-tts.sh")]
            first = span.split()[0] if span.split() else ""
            if not runs and first in commands and _options(span.split()[1:]):
                runs = [span.split()]  # `serve --workers N`: a subcommand with its flags
            for words in runs:
                path = [w for w in words if not w.startswith("-")][:2]
                if not path or path[0] not in commands:
                    wrong.append(f"{page}: veena-tts {' '.join(words[:2])}")
                    continue
                sub = commands[path[0]]
                if path[0] == "voice" and len(path) > 1 and path[1] in voice:
                    sub = voice[path[1]]
                elif path[0] == "voice":
                    wrong.append(f"{page}: veena-tts voice {path[1:] or ''}")
                    continue
                known = _flags(sub) | _flags(parser)
                checked.add(path[0])
                wrong += [f"{page}: veena-tts {path[0]} {o}" for o in _options(words)
                          if o not in known]
            for script in re.findall(r"bench/(\w+\.(?:py|sh))", span):
                source = (ROOT / "bench" / script).read_text()
                words = span.split(f"bench/{script}", 1)[1].split()
                wrong += [f"{page}: bench/{script} {o}" for o in _options(words)
                          if o.startswith("--") and o != "--help" and o not in source]
            if span.startswith("--") and not runs:  # a flag alone, in prose
                flag = _options(span.split()[:1])
                if flag and flag[0] not in every_flag | bench_flags | OTHER_FLAGS:
                    wrong.append(f"{page}: {flag[0]}")
    assert {"say", "serve", "download", "voice"} <= checked  # the pages were read
    assert not wrong, sorted(set(wrong))


def test_every_route_named_is_served():
    routes = app_routes()
    patterns = [(method, re.compile("^" + re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(path))
                                    + "$")) for method, path in routes]
    # the image's own folders (`/models`, `/app`) are paths, not routes
    image = set(re.findall(r"(?<![\w.:])(/[a-z]\w*)\b", (ROOT / "deploy/Dockerfile").read_text()))
    wrong, checked = [], set()
    for page, text in _pages().items():
        for span in _code_spans(text):
            if span.strip() in image:
                continue
            m = re.fullmatch(r"(?:(GET|POST|DELETE|PUT|PATCH) )?(/(?:[a-z][\w./{}-]*)?)",
                             span.strip())
            if not m or "." in m.group(2):
                continue  # a file path, not a route
            method, path = m.groups()
            ok = any(pattern.match(path) and method in (None, meth)
                     for meth, pattern in patterns)
            if not ok and method is None and (path.endswith("/") or path.count("/") == 1):
                ok = any(p.startswith(path.rstrip("/") + "/") for _, p in routes)  # `/v1/`
            checked.add(path)
            if not ok:
                wrong.append(f"{page}: {span}")
    assert {"/ready", "/v1/audio/speech"} <= checked
    assert not wrong, sorted(set(wrong))


def test_every_metric_named_is_exported():
    exported = _metrics()
    named = {(page, name) for page, text in _pages().items()
             for name in re.findall(r"\b(veena_[a-z_]*[a-z])\b(?!\.\w)", text)}
    assert len(named) > 10
    wrong = [f"{page}: {name}" for page, name in named if name not in exported]
    assert not wrong, sorted(wrong)


def test_sampling_fields_named_are_the_ones_a_request_may_set():
    lists, wrong = 0, []
    for page, text in _pages().items():
        flat = " ".join(text.split())
        for listed in re.findall(r"`sampling` \(any of ([^)]*)\)", flat):
            lists += 1
            if set(re.findall(r"`(\w+)`", listed)) != set(SAMPLING_FIELDS):
                wrong.append(f"{page}: sampling (any of {listed})")
        for body in re.findall(r"\"sampling\": (\{[^{}]*\})", text):
            wrong += [f"{page}: sampling {k}" for k in json.loads(body)
                      if k not in SAMPLING_FIELDS]
    assert lists >= 2 and not wrong, wrong


def test_the_operations_page_lists_every_exported_metric():
    page = (ROOT / "docs/operations.md").read_text().split("## Metrics", 1)[1]
    listed = set(re.findall(r"`(veena_[a-z_]+)", page))
    assert _metrics() == listed, (sorted(_metrics() - listed), sorted(listed - _metrics()))


def test_every_keyword_given_to_veena_tts_is_a_parameter():
    init = set(inspect.signature(veena.TTS.__init__).parameters) - {"self"}
    update = set(inspect.signature(veena.TTS.update_options).parameters) - {"self"}
    wrong, given = [], set()
    for page, text in _pages().items():
        given |= set(_calls(text, "veena.TTS"))
        wrong += [f"{page}: TTS({k}=)" for k in _calls(text, "veena.TTS") if k not in init]
        wrong += [f"{page}: update_options({k}=)" for k in _calls(text, "update_options")
                  if k not in update]
    fallback = set(inspect.signature(tts.FallbackAdapter.__init__).parameters)
    for page, text in _pages().items():  # the fallback recipe, against livekit-agents' own
        wrong += [f"{page}: FallbackAdapter({k}=)" for k in _calls(text, "tts.FallbackAdapter")
                  if k not in fallback]
    assert {"model", "base_url", "voice"} <= given
    assert not wrong, sorted(set(wrong))


def test_the_server_extra_is_listed_whole():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    names = {re.split(r"[<>=!~\[ ;]", spec, maxsplit=1)[0] for spec in extras["server"]}
    for page in ("getting-started", "development"):
        text = (ROOT / "docs" / f"{page}.md").read_text()
        assert not [n for n in names if n not in text], (page, names)


# --- the parameter table --------------------------------------------------------------------------

def _parameter_table() -> list[tuple[str, str, str]]:
    """(name, type, default) of each row of the plugin page's ``veena.TTS`` table."""
    text = (ROOT / "docs/plugin.md").read_text()
    section = text.split("## Parameters", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        # a pipe inside a code span (`str | None`) is no column separator, as in Markdown
        cells = [c.strip() for c in re.findall(r"(?:`[^`]*`|[^|`])+", line.strip().strip("|"))]
        if len(cells) >= 4 and cells[0].startswith("`") and not set(cells[1]) <= set("- "):
            rows.append((cells[0].strip("`"), cells[1].strip("`"), cells[2]))
    return rows


def _literal(cell: str) -> object:
    """The last Python literal in code quotes in a default cell (``None``, ``15.0``)."""
    for span in reversed(re.findall(r"`([^`]+)`", cell)):
        try:
            return ast.literal_eval(span)
        except (ValueError, SyntaxError):
            continue
    raise AssertionError(f"no literal default in {cell!r}")


def test_the_parameter_table_matches_the_signature(monkeypatch):
    for name in ("VEENA_CHUNK_CROSSFADE_MS", "VEENA_MAX_CHUNKS_IN_FLIGHT",
                 "VEENA_STARTUP_TIMEOUT_S", "VEENA_PROFILE", "VEENA_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    params = dict(inspect.signature(veena.TTS.__init__).parameters)
    params.pop("self")
    rows = _parameter_table()
    assert [r[0] for r in rows] == list(params), "the table lists every parameter, in order"
    built = veena.TTS(base_url="ws://127.0.0.1:1")  # nothing connects until a stream
    effective = {"seed": built._opts.seed,
                 "chunk_crossfade_ms": built._opts.chunk_crossfade_ms,
                 "max_chunks_in_flight": built._opts.max_chunks_in_flight,
                 "startup_timeout": built._opts.startup_timeout,
                 "voice_scope": built.voice_scope}
    for name, type_, default in rows:
        annotation = re.sub(r"^NotGivenOr\[(.*)\]$", r"\1", params[name].annotation)
        assert type_.replace(" ", "") == annotation.replace(" ", ""), (name, type_, annotation)
        value = params[name].default
        if value is not NOT_GIVEN:  # a plain default
            assert _literal(default) == value, (name, default, value)
        elif name in effective:
            assert _literal(default) == effective[name], (name, default, effective[name])
        else:  # decided elsewhere (the profile, the server): the cell says where
            assert default, name


USER_PAGES = ("index", "getting-started", "plugin", "gpu", "http-api", "websocket",
              "operations", "benchmarks", "troubleshooting", "deployment")


def test_user_pages_cite_no_test_files_and_no_machine_of_ours():
    """A user reads what the product does; which test proves it, and what a development
    machine measured in passing, belong in the tests and bench/README.md."""
    wrong = [f"{page}: {m}" for page in USER_PAGES
             for m in re.findall(r"tests/\S+|this (?:2-core |)(?:CPU|machine)\b",
                                 (ROOT / "docs" / f"{page}.md").read_text())]
    assert not wrong, wrong


# --- the OpenAI snippet, run ----------------------------------------------------------------------

async def test_the_openai_client_snippet_speaks_and_alloy_is_refused_as_the_page_says(
        tmp_path, monkeypatch):
    """The HTTP API page's Python example, run as written against a server on the fake
    engine (only its address and key changed), writes a WAV; an OpenAI voice name is the
    400 the page describes, naming the valid voices."""
    page = (ROOT / "docs/http-api.md").read_text()
    snippet = page.split("```python\n", 1)[1].split("```", 1)[0]
    assert 'base_url="http://localhost:8700/v1"' in snippet and "extra_body=" in snippet
    monkeypatch.chdir(tmp_path)
    async with fake_server(ServerOptions(api_key=API_KEY)) as server:
        code = snippet.replace("http://localhost:8700", server.url).replace(
            '"change-me"', repr(API_KEY))
        await asyncio.to_thread(exec, compile(code, "http-api.md", "exec"), {})
        with wave.open(str(tmp_path / "out.wav")) as w:
            assert w.getframerate() == 24000 and w.getnframes() > 0
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)
        with pytest.raises(openai.BadRequestError) as info:
            await asyncio.to_thread(client.audio.speech.create, model="veena", voice="alloy",
                                    input="Hello.")
        assert info.value.body["code"] == "bad_request" and "kavya" in info.value.body["message"]
