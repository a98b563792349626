"""The installed diagnostics: which ones a run computes, seals, checks and shows, in order.

Owns the list of built-in diagnostics, loaded by module name the first time a hub asks (as
pytest loads its plugins), so that importing this module, planning and config loading import
no diagnostic, no torch and no markup. ``install`` adds one for this process (a diagnostic
defined outside the package, such as the test tree's); ``uninstall`` removes it.
``diagnostics_type`` assembles comparison.json's ``diagnostics`` type from the installed
diagnostics' part types (built once per installed set, on first use).
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing is never imported at run time (this module is torch-free too)
if TYPE_CHECKING:
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
"""The built-in diagnostics' modules, in the order the hubs show them; each exports
``DIAGNOSTIC``."""

_loaded: list[Diagnostic] | None = None
_extra: list[Diagnostic] = []
_type: type[Diagnostics] | None = None


def installed() -> tuple[Diagnostic, ...]:
    """The built-in diagnostics, then those ``install``ed, in order."""
    global _loaded
    if _loaded is None:
        _loaded = [importlib.import_module(module).DIAGNOSTIC for module in BUILTIN]
    return (*_loaded, *_extra)


def by_name(name: str) -> Diagnostic | None:
    """The installed diagnostic whose part is ``diagnostics.<name>`` (None: not installed)."""
    return next((d for d in installed() if d.name == name), None)


def install(diagnostic: Diagnostic) -> None:
    """Install ``diagnostic`` for this process, after the built-in ones; a ValueError when one
    of that name is installed already."""
    if by_name(diagnostic.name) is not None:
        raise ValueError(f"diagnostic {diagnostic.name} is installed already")
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
