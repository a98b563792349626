"""The ``vllm-hf`` runtime: a vLLM rollout engine scored against transformers training.

Owns nothing itself; its modules own: ``adapter`` (knobs onto an engine spec, read-back values
onto knob paths), ``engine`` (the ``vllm.LLM`` lifecycle and sampling), ``read_back`` (live
values from vLLM's own objects), ``processes`` (/proc, /dev/shm, reaping, the construction
environment), ``logs`` (vLLM's output: a log file beside the artifacts, or the terminal) and
``worker_ext`` (code run inside vLLM's workers). Knows nothing about cases, comparison or
pytest; importing this package imports neither torch nor vLLM.
"""
