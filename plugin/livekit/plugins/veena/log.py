"""The plugin's logger; every line about a request carries its id in ``extra``."""

import logging

logger = logging.getLogger("livekit.plugins.veena")
