"""`localspec cache`: what localspec keeps of earlier requests to draft from (localspec/history), and clearing it."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from localspec.cli import app, user_errors


@app.command()
def cache(
    clear: Annotated[bool, typer.Option("--clear", help="Remove every kept history (all models, all scopes).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Show what is kept of earlier requests to draft from (per model: size, requests, scopes), or clear it.

    run, chat, batch and the Python API keep each request's prompt and output
    as token ids (they decode to the text) in the cache folder: one file per
    model, readable by you only, at most a million tokens per model (the oldest
    go first).

    serve keeps them in memory only unless started with --keep-history, apart
    per API key (the key itself is never stored).

    --no-keep-history (or LOCALSPEC_HISTORY=memory) keeps nothing on disk;
    LOCALSPEC_HISTORY=off does not draft from earlier requests at all.

    Examples:

      localspec cache

      localspec cache --clear
    """
    from localspec.history.disk import clear as clear_all
    from localspec.history.disk import describe, history_dir

    with user_errors():
        folder = history_dir()
        if clear:
            removed = clear_all()
            if as_json:
                print(json.dumps({"folder": str(folder), "removed": [str(p) for p in removed]}))
            else:
                print(f"removed {len([p for p in removed if p.suffix == '.npz'])} history file(s) from {folder}")
            return
        kept = describe()
        if as_json:
            print(json.dumps({"folder": str(folder), "histories": kept}))
            return
        if not kept:
            print(f"nothing kept ({folder})")
            return
        print(f"kept in {folder}:")
        for entry in kept:
            size = int(entry["bytes"])  # type: ignore[call-overload]
            name = str(entry["path"]).rsplit("/", 1)[-1]
            if "error" in entry:
                print(f"  {name}: {size / 1e6:.1f} MB, {entry['error']} (set aside at the next run)")
                continue
            scopes = entry.get("scopes", {})
            assert isinstance(scopes, dict)
            requests = sum(s["requests"] for s in scopes.values())
            tokens = sum(s["tokens"] for s in scopes.values())
            print(f"  {name} (model sha256 {str(entry.get('model', ''))[:16]}…): {size / 1e6:.1f} MB, "
                  f"{requests} requests, {tokens} tokens")
            for scope, s in scopes.items():
                print(f"    scope {scope}: {s['requests']} requests, {s['tokens']} tokens")
        sys.stdout.flush()
