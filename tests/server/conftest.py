import pytest
from aiohttp import web

from livekit.plugins.veena.server.app import ServerOptions, create_app

API_KEY = "test-key"


@pytest.fixture(scope="session")
async def server_url(pipeline):
    app = create_app(pipeline, ServerOptions(api_key=API_KEY, max_text_chars=20000,
                                             max_contexts_per_connection=4), own_pipeline=False)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()
