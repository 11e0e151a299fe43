import pytest

from livekit.plugins.veena.watermark import PerthWatermarker
from livekit.plugins.veena.watermark.weights import installed_perth_weights


@pytest.fixture(scope="session")
def perth():
    """Perth's published weights, from the installed ``resemble-perth`` (the [neutts] extra)."""
    weights = installed_perth_weights()
    assert weights is not None, "resemble-perth is not installed: run scripts/bootstrap.sh"
    return PerthWatermarker(weights)
