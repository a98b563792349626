"""The table of peer frameworks' default off-policy corrections, as data.

Owns what each framework's correction is called, the flag a user sets, its default band and
the statistic it compares (``PEER_CORRECTIONS``), the token-weight edges the figures report
fractions at (``BAND_EDGES``), and verl's ESS clamp. ``numerics.importance_sampling`` computes
each correction's fraction from this table; the plugin, the CLI and the report name them from
it. Torch-free (the plugin's failure text and the report read it); knows nothing about
tensors, files or how a fraction is shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

# verl computes rollout_corr/rollout_is_eff_sample_size on weights clamped to
# [rollout_is_threshold_lower, rollout_is_threshold] (volcengine/verl
# verl/trainer/ppo/rollout_corr_helper.py, compute_is_metrics: weights_for_ess = ...clamp(...));
# its default rollout_is_threshold is 2.0 and the lower bound defaults to its reciprocal.
VERL_ESS_UPPER = 2.0
VERL_ESS_LOWER = 1.0 / VERL_ESS_UPPER


class Statistic(Enum):
    """What a peer's correction compares against its band."""

    TOKEN_RATIO = "token_ratio"  # w = exp(r), per active token
    GEOMETRIC_RATIO = "geometric_ratio"  # exp(mean r), per sequence
    SEQUENCE_RATIO = "sequence_ratio"  # exp(sum r), per sequence
    MULT_PROB_ERROR = "mult_prob_error"  # mean over the sequence's tokens of exp(|r|)


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerCorrection:
    """One framework's default correction: the units outside ``[low, high]`` (a strict
    comparison: a value equal to an edge is inside; ``None`` is an open side) are the ones it
    clips, drops or masks. ``key`` names its fraction in the figures' JSON."""

    key: str
    short: str
    """A short name for table headers and junit properties (``drift_is_<short>``)."""
    framework: str
    flag: str
    default: str
    measures: str
    statistic: Statistic
    low: float | None
    high: float | None
    source: str


# The table a reader maps to their config. Each row cites the file its semantics were read from.
PEER_CORRECTIONS: tuple[PeerCorrection, ...] = (
    PeerCorrection(
        key="tis_clipped_token_fraction_cap_2",
        short="tis_clip_frac_cap2",
        framework="verl",
        flag="algorithm.rollout_correction.rollout_is=token, rollout_is_threshold",
        default="2.0",
        measures="fraction of active tokens whose weight exp(r) is above the cap (truncated)",
        statistic=Statistic.TOKEN_RATIO,
        low=None,
        high=2.0,
        # volcengine/verl verl/trainer/ppo/rollout_corr_helper.py (token IS weights truncated at
        # rollout_is_threshold; rollout_is_ratio_fraction_high counts weights > threshold)
        source="volcengine/verl verl/trainer/ppo/rollout_corr_helper.py",
    ),
    PeerCorrection(
        key="tis_clipped_token_fraction_cap_3",
        short="tis_clip_frac_cap3",
        framework="TRL",
        flag="vllm_importance_sampling_mode=token_truncate, vllm_importance_sampling_cap",
        default="3.0",
        measures="fraction of active tokens whose weight exp(r) is above the cap (clamped)",
        statistic=Statistic.TOKEN_RATIO,
        low=None,
        high=3.0,
        # huggingface/trl trl/trainer/grpo_trainer.py: token_truncate clamps
        # exp(old_per_token_logps - sampling_per_token_logps) at max=vllm_importance_sampling_cap
        source="huggingface/trl trl/trainer/grpo_trainer.py",
    ),
    PeerCorrection(
        key="tis_clipped_token_fraction_cap_5",
        short="tis_clip_frac_cap5",
        framework="OpenRLHF",
        flag="--vllm_is_correction_type tis --vllm_is_truncated_threshold 0.5 5.0",
        default="HIGH 5.0 (of [0.5, 5.0])",
        measures="fraction of active tokens whose weight exp(r) is above the upper cap",
        statistic=Statistic.TOKEN_RATIO,
        low=None,
        high=5.0,
        # OpenRLHF/OpenRLHF openrlhf/models/loss.py PolicyLoss.forward, "tis" branch:
        # exp(old_log_probs - rollout_log_probs).clamp(...); --vllm_is_truncated_threshold
        # defaults to [0.5, 5.0] (openrlhf/cli/train_ppo_ray.py)
        source="OpenRLHF/OpenRLHF openrlhf/models/loss.py",
    ),
    PeerCorrection(
        key="icepop_dropped_token_fraction",
        short="icepop_drop_frac",
        framework="OpenRLHF",
        flag="--vllm_is_correction_type icepop --vllm_is_truncated_threshold 0.5 5.0",
        default="[0.5, 5.0]",
        measures="fraction of active tokens whose weight exp(r) is outside the band (zeroed)",
        statistic=Statistic.TOKEN_RATIO,
        low=0.5,
        high=5.0,
        # OpenRLHF/OpenRLHF openrlhf/models/loss.py, "icepop" branch: keeps
        # (vllm_is >= low) & (vllm_is <= high), zeroes the rest; NeMo-RL docs/guides/grpo.md
        # gives the same reference bounds min=0.5, max=5 for ICE-POP
        source="OpenRLHF/OpenRLHF openrlhf/models/loss.py",
    ),
    PeerCorrection(
        key="seq_mask_tis_masked_sequence_fraction_0999_1001",
        short="seq_mask_frac_0999_1001",
        framework="seq-mask-tis (symmetric tight band)",
        flag=(
            "NeMo-RL loss_fn.truncated_importance_sampling_type=seq-mask-tis, "
            "truncated_importance_sampling_ratio_min / truncated_importance_sampling_ratio"
        ),
        default="[0.999, 1.001] (a symmetric variant of NeMo-RL's band)",
        measures="fraction of sequences whose geometric ratio exp(mean r) is outside the band",
        statistic=Statistic.GEOMETRIC_RATIO,
        low=0.999,
        high=1.001,
        # same rule as the NeMo-RL row below, with the upper edge at 1.001
        source="NVIDIA-NeMo/RL docs/guides/grpo.md (seq-mask-tis)",
    ),
    PeerCorrection(
        key="seq_mask_tis_masked_sequence_fraction_0999_1002",
        short="seq_mask_frac_0999_1002",
        framework="NeMo-RL",
        flag=(
            "loss_fn.truncated_importance_sampling_type=seq-mask-tis, "
            "truncated_importance_sampling_ratio_min / truncated_importance_sampling_ratio"
        ),
        default="[0.999, 1.002]",
        measures="fraction of sequences whose geometric ratio exp(mean r) is outside the band",
        statistic=Statistic.GEOMETRIC_RATIO,
        low=0.999,
        high=1.002,
        # NVIDIA-NeMo/RL docs/guides/grpo.md: seq-mask-tis discards a sequence whose geometric
        # mean of per-token IS ratios falls outside [ratio_min, ratio], reference bounds
        # min=0.999, max=1.002
        source="NVIDIA-NeMo/RL docs/guides/grpo.md",
    ),
    PeerCorrection(
        key="seq_mask_tis_masked_sequence_fraction_05_2",
        short="seq_mask_frac_05_2",
        framework="OpenRLHF",
        flag="--vllm_is_correction_type seq-mask-tis --vllm_is_truncated_threshold 0.5 2.0",
        default="[0.5, 2.0]",
        measures="fraction of sequences whose geometric ratio exp(mean r) is outside the band",
        statistic=Statistic.GEOMETRIC_RATIO,
        low=0.5,
        high=2.0,
        # OpenRLHF/OpenRLHF openrlhf/models/loss.py, "seq-mask-tis" branch:
        # seq_is = exp(masked_mean(log_ratio)); seq_mask = (seq_is >= low) & (seq_is <= high)
        source="OpenRLHF/OpenRLHF openrlhf/models/loss.py",
    ),
    PeerCorrection(
        key="trl_sequence_mask_masked_sequence_fraction",
        short="trl_seq_mask_frac",
        framework="TRL",
        flag="vllm_importance_sampling_mode=sequence_mask, vllm_importance_sampling_cap",
        default="3.0",
        measures="fraction of sequences whose sequence ratio exp(sum r) is above the cap (masked)",
        statistic=Statistic.SEQUENCE_RATIO,
        low=None,
        high=3.0,
        # huggingface/trl trl/trainer/grpo_trainer.py: sequence_mask sums the per-token log
        # differences over the completion, exponentiates, and sets ratios >
        # vllm_importance_sampling_cap to 0
        source="huggingface/trl trl/trainer/grpo_trainer.py",
    ),
    PeerCorrection(
        key="nemo_rl_seq_error_masked_sequence_fraction",
        short="nemo_seq_error_frac",
        framework="NeMo-RL",
        flag="grpo.seq_logprob_error_threshold",
        default="2.0 (commonly set; the config default is null, off)",
        measures=(
            "fraction of sequences whose mult-prob error mean(exp(|r|)) over their tokens "
            "is above the threshold (masked)"
        ),
        statistic=Statistic.MULT_PROB_ERROR,
        low=None,
        high=2.0,
        # NVIDIA-NeMo/RL nemo_rl/algorithms/grpo.py compute_and_apply_seq_logprob_error_masking:
        # seq_mult_prob_error = sum(exp(|generation - prev| * mask) * mask) / sum(mask), and a
        # sequence is masked when it exceeds seq_logprob_error_threshold
        source="NVIDIA-NeMo/RL nemo_rl/algorithms/grpo.py",
    ),
)

# Every weight edge the correction table uses: the token-weight fractions are reported at each.
BAND_EDGES: tuple[float, ...] = tuple(
    sorted(
        {e for p in PEER_CORRECTIONS for e in (p.low, p.high) if e is not None}
        | {VERL_ESS_LOWER, VERL_ESS_UPPER}
    )
)
