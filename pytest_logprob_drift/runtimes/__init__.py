"""Real runtime back ends (transformers, FSDP, vLLM) and the local tiny checkpoint.

Owns the code that touches torch, transformers and vLLM: building and resolving checkpoints
(``tiny_model``), rollout and teacher-forced scoring with plain transformers (``hf_engine``),
the FSDP-sharded training scorer over real processes (``fsdp_scoring``) and the vLLM rollout
engine (``vllm_engine``).

Must not know about planning, cases, artifacts, comparison or pytest. This package file itself
imports nothing, so that importing the framework, planning and pytest collection never load
torch; the submodules are imported lazily, only when a case executes.
"""
