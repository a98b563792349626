"""Diagnostics as plugins: the ``Diagnostic`` protocol, the installed registry, one folder each.

``protocol`` declares what a diagnostic owns, ``registry`` lists the installed ones (torch-free,
loaded by name), and each folder (``importance_sampling``, ...) is one diagnostic. The hubs
(scoring, writing and checking an attempt, the run command's table, the plugin's properties and
failure text, the report's columns and case section) loop over ``registry.installed()`` and
name none of them.
"""
