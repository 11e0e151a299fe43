"""The LiveKit Agents side: ``veena.TTS``, its streams, and the speaker under them (an
in-process pipeline or a ``veena-tts serve`` server)."""
