"""Reports of a run directory: ``load`` reads the run (verify statuses, the shown attempt of each
case, aggregated plot data), ``model`` holds what it read, ``summary`` the rows and text the
terminal prints, ``plots`` and ``html`` the self-contained page (torch-free), ``page``
publishes it."""
