"""The transformers side of the real runtimes: the ``hf`` runtime and the training scorer.

Owns, by module: ``adapter`` (the ``hf`` RuntimeAdapter, its knob table ``HF_INHERENT``, and
the transformers training half reused by ``vllm-hf``), ``engine`` (loading a local checkpoint,
KV-cache rollout, the read-only teacher-forced scorer, the selected-logprob functions),
``fsdp`` (the FSDP2 scorer group: rank processes launched, supervised and torn down from the
parent), ``fsdp_rank`` (what runs inside one rank), ``fsdp_messages`` (the parent<->rank
protocol), ``library`` (the one handle on the transformers library) and ``logs`` (where
transformers' own log records go). Knows nothing about
planning, comparison, artifacts or pytest. This package file imports nothing, so importing the
framework never loads torch or transformers.
"""
