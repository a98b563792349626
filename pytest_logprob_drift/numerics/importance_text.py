"""Plain-text rendering of a comparison's importance-sampling figures.

Owns how the CLI run table, the plugin's failure text and junit properties, and the report's
text show ``diagnostics.importance_sampling`` (``numerics.comparison.ImportanceSamplingFigures``;
computed by ``numerics.importance_sampling``, checked by ``store.importance_check``): the ESS
cell, the headline line of the three figures that matter most, every correction named with its
framework and flag, and name/value properties per case. Torch-free; knows nothing about how
the figures were computed. A comparison without the part renders as ``-`` or nothing.

The three headline figures, and why these three:

- the normalized ESS of the raw token weights: how much of the batch an importance-weighted
  gradient still uses; the one number every framework logs;
- verl's TIS clipped-token fraction at cap 2 (``rollout_is_threshold``, its default): the
  token-level truncation most runs use, so the fraction of tokens whose correction changes;
- NeMo-RL's seq-mask-tis masked-sequence fraction at [0.999, 1.002]: the sequence filter whose
  band is at the drift's own scale (the contract judges 1e-3), so it is the figure that moves
  when a configuration change shifts every token a little. NeMo-RL's
  ``seq_logprob_error_threshold`` 2.0 is reported too (junit, report) but not in the headline:
  it needs a mean token ratio exp(|r|) above 2, drift of order 0.7 nats per token, which a
  configuration change near the 1e-3 contract never reaches, so it reads 0 almost everywhere.
"""

from __future__ import annotations

import json

from pytest_logprob_drift.numerics.comparison import Diagnostics, ImportanceSamplingFigures
from pytest_logprob_drift.numerics.peer_corrections import (
    PEER_CORRECTIONS,
    PeerCorrection,
    Statistic,
)

ESS_HEADER = "ESS"
"""The run table's column: the normalized ESS of the raw token weights."""

TOKEN_HEADLINE = "tis_clipped_token_fraction_cap_2"
"""verl's token TIS at its default cap: the headline token-level correction."""

SEQUENCE_HEADLINE = "seq_mask_tis_masked_sequence_fraction_0999_1002"
"""NeMo-RL's seq-mask-tis at its reference band: the headline sequence-level correction."""

PROPERTY_PREFIX = "drift_is_"


def peer(key: str) -> PeerCorrection:
    """The peer correction whose figures' key is ``key``."""
    return next(p for p in PEER_CORRECTIONS if p.key == key)


def figures_of(diagnostics: Diagnostics | None) -> ImportanceSamplingFigures | None:
    return None if diagnostics is None else diagnostics.importance_sampling


def number(value: float | None) -> str:
    """A figure as text (three significant digits; ``-`` when absent)."""
    return "-" if value is None else f"{value:.3g}"


def ess_text(value: float | None) -> str:
    """An ESS as text: four significant digits, since the drift a contract judges costs the
    ESS its third or fourth digit (``-`` when absent)."""
    return "-" if value is None else f"{value:.4g}"


def percent(fraction: float | None) -> str:
    """A fraction as a percentage (``-`` when absent)."""
    return "-" if fraction is None else f"{100 * fraction:.3g}%"


def _raw(value: float | None) -> str:
    return "-" if value is None else repr(value)


def ess_cell(diagnostics: Diagnostics | None) -> str:
    """The ESS column's cell."""
    figures = figures_of(diagnostics)
    return "-" if figures is None else ess_text(figures.ess)


def band(p: PeerCorrection) -> str:
    """The band a correction keeps, as its user would write it: ``[low, high]`` or ``<= cap``."""
    if p.low is None:
        return f"<= {p.high:g}"
    return f"[{p.low:g}, {p.high:g}]" if p.high is not None else f">= {p.low:g}"


def unit(p: PeerCorrection) -> str:
    """What the correction's fraction counts: tokens or sequences."""
    return "tokens" if p.statistic is Statistic.TOKEN_RATIO else "sequences"


def correction_phrase(p: PeerCorrection, fraction: float | None) -> str:
    """One correction, named so a reader can map it to their config."""
    return f"{p.framework} {p.flag} {band(p)}: {percent(fraction)} of {unit(p)}"


def headline(diagnostics: Diagnostics | None) -> str | None:
    """The line of the three figures that matter most (None without the part)."""
    figures = figures_of(diagnostics)
    if figures is None:
        return None
    token, sequence = peer(TOKEN_HEADLINE), peer(SEQUENCE_HEADLINE)
    return (
        f"importance sampling over {figures.active_tokens} tokens in {figures.sequences} "
        f"sequences: ESS {ess_text(figures.ess)} (raw weights; verl-clamped "
        f"{ess_text(figures.ess_verl_clamped)}); {token.framework} TIS cap {token.high:g} "
        f"clips {percent(figures.correction(TOKEN_HEADLINE))} of tokens; "
        f"{sequence.framework} seq-mask-tis {band(sequence)} masks "
        f"{percent(figures.correction(SEQUENCE_HEADLINE))} of sequences"
    )


def lines(diagnostics: Diagnostics | None) -> list[str]:
    """The headline, then what every peer correction would do (the report's text)."""
    figures = figures_of(diagnostics)
    if figures is None:
        return []
    out = [headline(diagnostics) or ""]
    out += [
        f"  {correction_phrase(p, figures.correction(p.key))}"
        for p in PEER_CORRECTIONS
        if figures.correction(p.key) is not None
    ]
    return out


def properties(diagnostics: Diagnostics | None) -> list[tuple[str, str]]:
    """Name/value pairs (junit properties); none without the part.

    ``drift_is_ess``, ``drift_is_ess_verl_clamped``, ``drift_is_ess_sequence``,
    ``drift_is_chi2_token``, ``drift_is_approx_kl_k3``, ``drift_is_<short>`` per peer
    correction (``PeerCorrection.short``: ``drift_is_tis_clip_frac_cap2``, ...), and
    ``drift_importance_sampling``: the whole part as JSON."""
    figures = figures_of(diagnostics)
    if figures is None:
        return []
    out = [
        (f"{PROPERTY_PREFIX}ess", repr(figures.ess)),
        (f"{PROPERTY_PREFIX}ess_verl_clamped", repr(figures.ess_verl_clamped)),
        (f"{PROPERTY_PREFIX}ess_sequence", repr(figures.ess_sequence)),
        (f"{PROPERTY_PREFIX}chi2_token", repr(figures.chi2_token)),
        (f"{PROPERTY_PREFIX}approx_kl_k3", _raw(figures.approx_kl_k3)),
    ]
    out += [
        (f"{PROPERTY_PREFIX}{p.short}", _raw(figures.correction(p.key)))
        for p in PEER_CORRECTIONS
        if figures.correction(p.key) is not None
    ]
    out.append(("drift_importance_sampling", json.dumps(figures.to_json(), sort_keys=True)))
    return out
