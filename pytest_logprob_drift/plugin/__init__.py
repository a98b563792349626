"""The pytest plugin: ``hooks`` is the pytest11 entry point (hooks only); ``options``,
``session``, ``items``, ``reporting``, ``xdist`` and ``hookspecs`` own the work."""
