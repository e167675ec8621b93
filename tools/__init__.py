"""The commands around the model, apart from the remote code a Hub artifact ships at its root.

Run from the repository root, as modules: ``python -m tools.transcribe`` (files -> text, subtitles, JSON),
``python -m tools.benchmark`` (HF generate vs our loop vs Medusa on real speech), ``python -m
tools.benchmark_gpu`` (MERaLiON-2 shapes on a GPU), ``python -m tools.benchmark_cpu_peers`` (the same against
faster-whisper on a CPU), ``python -m tools.profile_rounds`` / ``tools.profile_prefill`` / ``tools.round_kernels`` /
``tools.verify_pass_kernels`` (round, prefill and verify-pass cost), ``python -m tools.chain_confidence`` (a CPU
chain's stopping rule), ``python -m tools.results_tables`` (docs/RESULTS.md from the results). What they share:
``tools.audio_io`` (audio and transcript I/O), ``tools.files`` (atomic writes), ``tools.markdown`` (Markdown
tables), ``tools.runtime`` (device, dtype, inputs, loading an artifact with its base resolved offline),
``tools.real_whisper`` (Whisper bases converted offline from PyPI), ``tools.text_normalizer`` (WER) and the rest.
The training pipeline, the ``pipeline`` package beside this one, uses them too; nothing here imports ``pipeline``.
"""
