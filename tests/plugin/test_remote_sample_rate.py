"""Remote mode takes its sample rate from the server's ``/ready``, not from a guessed
profile: a plugin that assumed the default (Veena, 24 kHz) speaking to a BiCodec server
(16 kHz) emits 16 kHz frames and reports 16 kHz."""

import pytest
from livekit.plugins import veena

from livekit.plugins.veena.server.app import ServerOptions

from ..servers import serve

pytestmark = pytest.mark.engine


async def test_remote_sample_rate_comes_from_the_server(spark_pipeline):
    async with serve(spark_pipeline, ServerOptions()) as url:
        t = veena.TTS(base_url=url.replace("http://", "ws://"), max_tokens_per_chunk=60)
        assert t.sample_rate == 24000  # the default profile's guess before any connection
        frame = await t.synthesize("नमस्ते।").collect()
        assert frame.sample_rate == 16000 and t.sample_rate == 16000
        assert frame.samples_per_channel > 0
        await t.aclose()
