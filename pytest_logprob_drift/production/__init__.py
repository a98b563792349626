"""Production runs: judging what an RL run already logged, by the contract, sealed.

``sources`` reads the input files a user names (bounded, hashed while read, pickles refused),
``formats`` turns NeMo-RL's, slime's and the neutral format's records into one step's rows,
``importer`` builds each step's token grid, judges it with ``numerics.verdict`` and seals it
as an attempt of a run published atomically. Imported by ``cli.import_cmd`` only when the
command runs (it loads torch).
"""
