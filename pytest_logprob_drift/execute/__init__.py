"""Execution: the runtime protocol and fingerprints (``protocol``), the runtime catalog, the runner,
one case's steps (``case``), the engine pool, provenance and the read-only guard."""
