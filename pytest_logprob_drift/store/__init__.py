"""The append-only artifact store (``artifacts``), resume checks of sealed attempts (``resume``)
and offline verification of a run (``verify``)."""
