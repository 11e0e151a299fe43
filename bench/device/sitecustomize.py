"""For ``bench/gpu.sh`` on a machine without livekit-agents (the lent GPU machine has no
registry, and livekit-agents' wheels are over what a run may carry). Only the package's
``__init__`` imports livekit-agents, to register the LiveKit plugin; the server, pipeline,
codecs, benchmarks and codec tests never do. So there the package is registered without
running its ``__init__``. Python imports this file at start-up in every process (spawned
benchmark workers too) because gpu.sh puts its folder first on PYTHONPATH."""

import importlib.util
import sys
import types
from pathlib import Path

PACKAGE = "livekit.plugins.veena"


def _agents_missing() -> bool:
    try:
        return importlib.util.find_spec("livekit.agents") is None
    except ImportError:
        return True


if _agents_missing() and PACKAGE not in sys.modules:
    package = types.ModuleType(PACKAGE)
    package.__path__ = [str(Path(__file__).resolve().parents[2] / "plugin" / "livekit"
                            / "plugins" / "veena")]
    sys.modules[PACKAGE] = package
