"""Data and model preparation steps for the Medusa ASR heads (run as ``python -m pipeline.X``)."""
