"""The append-only artifact store, persistence only (no torch): file primitives (``files``), the
one seal mechanism (``seal``, keyed by ``keys``), attempts (``attempt``), the run and its plan log
(``run``), the names of every file (``layout``) and the typed documents (``documents``,
``comparison``); the tensor checks of what it holds are ``check``'s."""
