"""The comparison numerics: the verdict and everything computed beside it from the scores.

``verdict`` (identity and the fixed-threshold rule), ``sampling`` (the one definition of
processed logits), ``full_vocabulary`` (streamed KL/TV reductions), ``semantic_offset`` (the
sampling-semantics diagnosis), ``divergence_file`` (the sealed ``divergence.pt`` and its
summary), ``text`` (how the frontends and the report show them; torch-free) and
``comparison`` (the typed read model of comparison.json; torch-free). Knows nothing about
engines, files on disk, frontends or runs.
"""
