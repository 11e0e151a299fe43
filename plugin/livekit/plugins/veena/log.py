"""The plugin's logger; every line about a request carries its id in ``extra``. Also how the
command line sets up logging, in one place for the CLI and the server's worker processes."""

import logging
import os
import sys
import warnings

logger = logging.getLogger("livekit.plugins.veena")

_QUIET_ENV = {
    "VLLM_LOGGING_LEVEL": "ERROR",  # vLLM's configuration dump and per-layer load notes
    "TQDM_DISABLE": "1",  # weight-loading progress bars
    "TORCH_CPP_LOG_LEVEL": "ERROR",
    "PYTHONWARNINGS": "ignore::FutureWarning,ignore::DeprecationWarning",
}
"""Without ``-v``: the engine's own detail stays out of the terminal (engine processes read
these from the environment; anything set by the user wins)."""


def configure_logging(verbose: bool, process: str = "") -> None:
    """Log lines to stderr; ``process`` (e.g. ``worker 1``) names the process in each line
    where several processes share one terminal or log stream."""
    where = f"[{process}] " if process else ""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format=f"%(asctime)s %(levelname)s {where}%(name)s: %(message)s",
        stream=sys.stderr,
    )
    if verbose:
        return
    for name, value in _QUIET_ENV.items():
        os.environ.setdefault(name, value)
    warnings.simplefilter("ignore", FutureWarning)
    warnings.simplefilter("ignore", DeprecationWarning)
    for noisy in ("vllm", "transformers", "torch"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
