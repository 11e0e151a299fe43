"""What differs between models: per-model facts (``profiles``), the codec families that
read them (``families``), fetching a checkpoint (``download``) and tiny random models with a
real profile's token layout for tests (``tiny_model``)."""

from . import families  # noqa: F401  (registers the built-in families with the pipeline)
