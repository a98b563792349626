"""The installed diagnostics: which ones a run computes, seals, checks and shows, in order.

Owns the list of built-in diagnostics, loaded by module name the first time a hub asks (as
pytest loads its plugins), so that importing this module, planning and config loading import
no diagnostic, no torch and no markup. ``install`` adds one for this process (a diagnostic
defined outside the package, such as the test tree's); ``uninstall`` removes it.
``config_keys`` lists the installed diagnostics' config keys (``$.diagnostics.<key>``) for
config loading and the execution key: a built-in folder's from its ``__init__`` (which imports
no diagnostic, nor typing), an installed one's from its ``config_key``.
``diagnostics_type`` assembles comparison.json's ``diagnostics`` type from the installed
diagnostics' part types (built once per installed set, on first use).
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing is never imported at run time (this module is torch-free too)
if TYPE_CHECKING:
    from pytest_logprob_drift.diagnostics.config_key import ConfigKey
    from pytest_logprob_drift.diagnostics.protocol import Diagnostic
    from pytest_logprob_drift.numerics.comparison import Diagnostics

BUILTIN = (
    "pytest_logprob_drift.diagnostics.importance_sampling",
    "pytest_logprob_drift.diagnostics.full_vocabulary",
    "pytest_logprob_drift.diagnostics.path_split",
    "pytest_logprob_drift.diagnostics.layers",
    "pytest_logprob_drift.diagnostics.routing",
    "pytest_logprob_drift.diagnostics.signatures",
)
"""The built-in diagnostics' folders, in the order the hubs show them; each folder's
``diagnostic`` module exports ``DIAGNOSTIC`` and its ``__init__`` ``CONFIG_KEY`` (or None)."""

_loaded: list[Diagnostic] | None = None
_extra: list[Diagnostic] = []
_type: type[Diagnostics] | None = None


def installed() -> tuple[Diagnostic, ...]:
    """The built-in diagnostics, then those ``install``ed, in order."""
    global _loaded
    if _loaded is None:
        _loaded = [importlib.import_module(f"{folder}.diagnostic").DIAGNOSTIC for folder in BUILTIN]
    return (*_loaded, *_extra)


def config_keys() -> tuple[ConfigKey, ...]:
    """The installed diagnostics' config keys, in the registry's order (the order of
    ``$.diagnostics``' allowed keys and of the execution key's ``diagnostics`` members);
    imports the built-in folders' ``__init__`` only, no diagnostic."""
    builtin = (importlib.import_module(folder).CONFIG_KEY for folder in BUILTIN)
    extra = (d.config_key for d in _extra)
    return tuple(k for k in (*builtin, *extra) if k is not None)


def by_name(name: str) -> Diagnostic | None:
    """The installed diagnostic whose part is ``diagnostics.<name>`` (None: not installed)."""
    return next((d for d in installed() if d.name == name), None)


def install(diagnostic: Diagnostic) -> None:
    """Install ``diagnostic`` for this process, after the built-in ones (its ``config_key``
    among ``config_keys``); a ValueError when one of that name, or one with its config key, is
    installed already."""
    if by_name(diagnostic.name) is not None:
        raise ValueError(f"diagnostic {diagnostic.name} is installed already")
    key = diagnostic.config_key
    if key is not None and key.key in {k.key for k in config_keys()}:
        raise ValueError(f"config key diagnostics.{key.key} is taken already")
    _extra.append(diagnostic)
    _forget_type()


def uninstall(name: str) -> None:
    """Remove the diagnostic ``name`` that ``install`` added (built-in ones stay)."""
    _extra[:] = [d for d in _extra if d.name != name]
    _forget_type()


def diagnostics_type() -> type[Diagnostics]:
    """comparison.json's ``diagnostics`` type for the installed diagnostics: today's declared
    members (``numerics.comparison.Diagnostics``, so runs sealed by today's release decode,
    in their sealed order), then ``diagnostics.<name>`` typed ``part_type`` for each installed
    diagnostic whose part it does not declare, in the registry's order (absent: None, as
    every optional part). Built with ``msgspec.defstruct`` once per installed set."""
    global _type
    if _type is None:
        _type = _assembled()
    return _type


def _assembled() -> type[Diagnostics]:
    import msgspec

    from pytest_logprob_drift.numerics.comparison import Diagnostics

    declared = set(Diagnostics.__struct_fields__)
    fields = [(d.name, d.part_type, None) for d in installed() if d.name not in declared]
    if not fields:
        return Diagnostics
    made = msgspec.defstruct(
        "Diagnostics",
        fields,
        bases=(Diagnostics,),
        module=Diagnostics.__module__,
        frozen=True,
        forbid_unknown_fields=True,
        kw_only=True,
        omit_defaults=True,
    )
    assert issubclass(made, Diagnostics)  # its base: the declared members
    return made


def _forget_type() -> None:
    """Drop the assembled type: the installed set changed."""
    global _type
    _type = None
