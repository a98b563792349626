"""The append-only artifact store: file primitives (``files``), the one seal mechanism
(``seal``, keyed by ``keys``), attempts (``attempt``), the run and its plan log (``run``), the
names of every file (``layout``), resume checks of sealed attempts (``resume``) and offline
verification of a run (``verify``)."""
