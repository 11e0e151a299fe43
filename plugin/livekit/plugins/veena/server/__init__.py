"""The TTS server: one engine and one decode scheduler next to the GPU, many agent workers."""
