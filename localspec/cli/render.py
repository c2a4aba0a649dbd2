"""Human-readable summaries of a generation's Stats (stderr) and the --json document (stdout)."""

from __future__ import annotations

from typing import Any

from localspec.events import Stats, Token


def stats_lines(stats: Stats, drafter: str, *, device: str = "") -> list[str]:
    """``device``: where the model ran (Runtime.device.description), shown at the end of the first line."""
    lines = [
        f"{stats.generated_tokens} tokens in {stats.decode_seconds:.2f} s: {stats.tokens_per_second:.1f} tok/s"
        f" · prompt {stats.prompt_tokens} tokens, prefill {stats.prefill_seconds:.2f} s"
        f" · stop: {stats.stop_reason}" + (f" · {device}" if device else "")
    ]
    if drafter != "none":
        lines.append(
            f"drafter {drafter}: {stats.target_passes} target passes, drafted {stats.drafted},"
            f" accepted {stats.accepted} ({stats.acceptance_rate:.1%}),"
            f" {stats.mean_accepted_length:.2f} tokens/pass"
            + (f" ({stats.tree_passes} tree passes, {stats.branches} branches)" if stats.tree_passes else "")
            + (f" · from earlier requests: drafted {stats.cache_drafted}, accepted {stats.cache_accepted}"
               if stats.cache_drafted else "")
            + f" · time draft {stats.draft_seconds:.2f} s / verify {stats.verify_seconds:.2f} s"
        )
        if stats.forced_drafted:
            lines.append(grammar_line(stats))
        if stats.accepted_by_position:
            shown = stats.accepted_by_position[:8]
            cells = " ".join(f"{a / d:.0%}" if d else "-" for a, d in shown)
            more = " …" if len(stats.accepted_by_position) > len(shown) else ""
            lines.append(f"acceptance by draft position: {cells}{more}")
    if stats.accepted_prediction_tokens or stats.rejected_prediction_tokens:
        lines.append(prediction_line(stats))
    return lines


def prediction_line(stats: Stats) -> str:
    """A prediction's share: what was drafted from it (verified like any draft), and OpenAI's count of its tokens
    found in the answer."""
    return (f"prediction: drafted {stats.prediction_drafted}, accepted {stats.prediction_accepted}"
            f" · of its {stats.accepted_prediction_tokens + stats.rejected_prediction_tokens} tokens the answer holds "
            f"{stats.accepted_prediction_tokens}")


def grammar_line(stats: Stats) -> str:
    """Structured output's share: the tokens its grammar forced (drafted like any other, verified) and its time."""
    per_pass = stats.grammar_seconds / stats.target_passes * 1e6 if stats.target_passes else 0.0
    return (f"grammar: forced {stats.forced_drafted} tokens, accepted {stats.forced_accepted}"
            f" · host time {stats.grammar_seconds * 1e3:.1f} ms ({per_pass:.0f} µs a pass)")


def json_document(
    model: str, drafter: str, text: str, tokens: list[Token], stats: Stats, *, device: str = ""
) -> dict[str, Any]:
    return {
        "model": model,
        "drafter": drafter,
        "text": text,
        "tokens": [{"id": t.id, "text": t.text, "source": t.source} for t in tokens],
        "stats": {**stats.to_dict(), **({"device": device} if device else {})},
    }
