"""The streaming pipeline, stage by stage as a turn flows through it: text into pieces
(``chunking``, ``sentences``), one spoken turn (``turn``), the pipeline and its runs
(``pipeline``, ``synthesis``, ``request_run``), the engine (``engine``), token parsing
(``parsing``), window planning (``windowing``, ``pacing``), decode scheduling
(``scheduler``), stitching (``stitching``), and what a run reports (``timings``,
``transcripts``)."""
