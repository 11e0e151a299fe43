"""Voices kept beyond one call: voice files (``files``: capture, clone, load, checks) and the
reference clips a voice is cloned from (``reference_clip``)."""
