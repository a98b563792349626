"""The offline tensor checks of sealed artifacts: an attempt's check (``resume``), a run's
verification (``verify``), the sealed tensors' shapes (``sealed_tensors``), the re-judged verdict
(``rejudge``) and each sealed diagnostic's check (the ``*_check`` modules); the store below them
is persistence only."""
