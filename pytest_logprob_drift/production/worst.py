"""The worst samples of an imported run, turned into a prompt file ``init --prompts`` accepts.

Owns ``import --worst K --prompts-out FILE``: while the steps are imported, each step judged
PASS or MISMATCH hands its token grid to ``WorstSamples.add``, which ranks the step's rows by
``numerics.sample_drift`` (most mismatching active tokens, then largest max |diff|, then the
earlier step and row) and keeps the ``K`` worst of the run so far with their prompts (a row's
token ids before its response starts: the prompt the framework logged, never re-tokenized), so
memory stays ``K`` prompts whatever the number of steps. A sample with an empty prompt cannot
be replayed and is counted apart, never ranked. Once the run is published, ``prompt_document``
is the prompt file: the prompts' token ids and a version-2 ``source`` record
(``config.prompt_source.ImportedPromptSource``) naming the run, and for each prompt its step,
case, grid row, the framework's sample id and source line or index, with its drift; with the
tokenizer digests of ``--checkpoint DIR`` when one was given. ``write_prompt_file`` publishes
it without ever overwriting a file. Knows nothing about the command line.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pytest_logprob_drift.config.prompt_source import (
    ImportedInputFile,
    ImportedPrompt,
    ImportedPromptSource,
)
from pytest_logprob_drift.errors import UsageError
from pytest_logprob_drift.numerics.sample_drift import SampleDrift, sample_drift
from pytest_logprob_drift.production.sources import InputRecord
from pytest_logprob_drift.store.documents import ImportedRow


@dataclass(frozen=True, slots=True, kw_only=True)
class WorstSample:
    drift: SampleDrift
    case_id: str
    prompt: tuple[int, ...]
    source: ImportedRow
    """Its row's source, ``input`` an index into the run's input files."""


class WorstSamples:
    """The ``k`` worst samples of the steps added so far."""

    def __init__(self, k: int) -> None:
        if k < 1:
            raise UsageError(f"--worst must be a positive integer, got {k}")
        self.k = k
        self.kept: list[WorstSample] = []
        self.empty_prompts = 0

    def add(
        self,
        *,
        step: int,
        case_id: str,
        training: torch.Tensor,
        rollout: torch.Tensor,
        active: torch.Tensor,
        threshold: float,
        token_ids: torch.Tensor,
        starts: torch.Tensor,
        sources: Sequence[ImportedRow],
    ) -> None:
        """Rank one judged step's rows (its ``[B, T]`` grid, ``starts`` each row's first
        response column, ``sources`` each row's source) into the kept ``k``."""
        ranked = sorted(
            sample_drift(training, rollout, active, threshold, step=step),
            key=SampleDrift.rank_key,
        )
        candidates: list[WorstSample] = []
        for drift in ranked:
            start = int(starts[drift.row])
            if start < 1:
                self.empty_prompts += 1
                continue
            if len(candidates) < self.k:
                candidates.append(
                    WorstSample(
                        drift=drift,
                        case_id=case_id,
                        prompt=tuple(int(t) for t in token_ids[drift.row, :start].tolist()),
                        source=sources[drift.row],
                    )
                )
        merged = sorted([*self.kept, *candidates], key=lambda w: w.drift.rank_key())
        self.kept = merged[: self.k]


def prompt_document(
    worst: WorstSamples,
    *,
    experiment_id: str,
    fmt: str,
    inputs: Sequence[InputRecord],
    threshold: float,
    tokenizer_files: Mapping[str, str] | None,
) -> dict[str, Any]:
    """The prompt file of the kept samples, worst first (``UsageError`` when none was kept:
    no step was judged, or every judged sample had an empty prompt)."""
    if not worst.kept:
        raise UsageError(
            "--worst: no sample to write (no step was judged PASS or MISMATCH"
            + (
                f", and {worst.empty_prompts} judged sample(s) had no prompt tokens)"
                if worst.empty_prompts
                else ")"
            )
        )
    source = ImportedPromptSource(
        experiment_id=experiment_id,
        format=fmt,
        inputs=tuple(ImportedInputFile(path=r.path, sha256=r.sha256, size=r.size) for r in inputs),
        prompts=tuple(
            ImportedPrompt(
                step=w.drift.step,
                case_id=w.case_id,
                row=w.drift.row,
                sample=w.source.sample,
                input=w.source.input,
                line=w.source.line,
                index=w.source.index,
                active=w.drift.active,
                mismatches=w.drift.mismatches,
                max_abs_diff=w.drift.max_abs_diff,
            )
            for w in worst.kept
        ),
        tokenizer_files=tokenizer_files,
        threshold=threshold,
    )
    return {"token_ids": [list(w.prompt) for w in worst.kept], "source": source.to_json()}


def refuse_existing(output: Path) -> None:
    """Refuse, before any work, a prompt file that exists or whose directory does not."""
    if os.path.lexists(output):
        raise UsageError(f"{output}: already exists; --prompts-out never overwrites a file")
    parent = output.parent if str(output.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{output}: its directory does not exist")


def write_prompt_file(output: Path, document: Mapping[str, Any]) -> None:
    """One token-id row per line and the ``source`` record (the form ``prompts`` writes),
    written to a temporary file and linked into place: never over an existing file."""
    rows = ",\n    ".join(json.dumps(row) for row in document["token_ids"])
    source = json.dumps(document["source"], indent=2, sort_keys=True).replace("\n", "\n  ")
    text = f'{{\n  "token_ids": [\n    {rows}\n  ],\n  "source": {source}\n}}\n'
    parent = output.parent if str(output.parent) else Path(".")
    refuse_existing(output)
    fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", dir=parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.link(tmp, output)
    except FileExistsError:
        raise UsageError(
            f"{output}: already exists; --prompts-out never overwrites a file"
        ) from None
    finally:
        Path(tmp).unlink(missing_ok=True)
