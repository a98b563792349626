"""The HTML page of a report.

Owns rendering a run's summary rows, each case's reason and worst tokens, and the invalid
attempts as one self-contained HTML document (no scripts, fonts or images from elsewhere).
Knows nothing about files, seals or execution.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any


def render_html(
    run_dir: Path,
    headers: list[str],
    rows: list[list[Any]],
    cases: dict[str, dict[str, Any]],
    problems: list[str],
) -> str:
    esc = html.escape
    parts = [
        f"<!doctype html><meta charset='utf-8'><title>logprob drift: {esc(str(run_dir))}"
        "</title><style>body{font-family:sans-serif}td,th{padding:2px 8px;"
        "border-bottom:1px solid #ddd}.MISMATCH{color:#b00}.PASS{color:#070}</style>",
        f"<h1>{esc(run_dir.name)}</h1><table><tr>"
        + "".join(f"<th>{esc(h)}</th>" for h in headers)
        + "</tr>",
    ]
    for row in rows:
        parts.append(
            "<tr>" + "".join(f"<td class='{esc(str(c))}'>{esc(str(c))}</td>" for c in row) + "</tr>"
        )
    parts.append("</table>")
    for case_id, c in sorted(cases.items()):
        parts.append(
            f"<h2>{esc(str(c.get('label')))} <small>{esc(case_id)}</small></h2>"
            f"<p>{esc(str(c.get('reason', '')))}</p><table><tr><th>sample</th>"
            "<th>position</th><th>rollout</th><th>training</th><th>|diff|</th></tr>"
        )
        for w in c.get("worst_tokens", []):
            parts.append(
                "<tr>"
                + "".join(
                    f"<td>{esc(str(w.get(k)))}</td>"
                    for k in (
                        "sample",
                        "position",
                        "rollout_logprob",
                        "training_logprob",
                        "abs_diff",
                    )
                )
                + "</tr>"
            )
        parts.append("</table>")
    for p in problems:
        parts.append(f"<p class='MISMATCH'>invalid attempt skipped: {esc(p)}</p>")
    return "".join(parts)
