"""Semantic operators: immutable descriptors and the catalog (``catalog``), per-case strict
resolution and provenance (``session``)."""
