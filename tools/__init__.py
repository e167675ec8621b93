"""The commands around the model, apart from the remote code a Hub artifact ships at its root.

Run from the repository root, as modules: ``python -m tools.transcribe`` (files -> text, subtitles, JSON),
``python -m tools.benchmark`` (HF generate vs our loop vs Medusa on real speech), ``python -m
tools.benchmark_gpu`` (MERaLiON-2 shapes on a GPU), ``python -m tools.benchmark_ctranslate2``,
``python -m tools.profile_rounds`` / ``tools.profile_prefill`` (round and prefill cost). ``tools.audio_io`` is
the audio and transcript I/O they share. The training pipeline is the ``pipeline`` package beside this one.
"""
