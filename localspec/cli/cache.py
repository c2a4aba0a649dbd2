"""`localspec cache`: what localspec keeps of earlier requests to draft from (localspec/history), and clearing it."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from localspec.cli import app, user_errors
from localspec.errors import UserError


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

    serve keeps them in memory only, apart per API key (the key itself is never
    stored); on disk only when started with --keep-history.

    --no-keep-history (or LOCALSPEC_HISTORY=memory) keeps nothing on disk;
    LOCALSPEC_HISTORY=off does not draft from earlier requests at all; chat
    --no-history keeps nothing on disk either. The variable only ever lowers a
    command's default: it never makes serve keep anything on disk.

    --clear removes every file, files set aside included; a localspec still
    running drops, at its next save, everything it held from before the clear.

    Examples:

      localspec cache

      localspec cache --clear
    """
    from localspec.history.disk import clear as clear_all
    from localspec.history.disk import describe, history_dir, leftovers

    with user_errors():
        folder = history_dir()
        if clear:
            try:
                removed = clear_all()
            except OSError as e:
                raise UserError(f"cannot clear the history in {folder} ({e.strerror or type(e).__name__}"
                                f"{f': {e.filename}' if e.filename else ''}): remove it by hand, or as its owner"
                                ) from None
            if as_json:
                print(json.dumps({"folder": str(folder), "removed": [str(p) for p in removed]}))
            else:
                print(f"removed {len([p for p in removed if p.suffix == '.npz'])} history file(s) from {folder}")
            return
        try:
            kept, left = describe(), leftovers()
        except OSError as e:
            raise UserError(f"cannot read the history folder {folder} ({e.strerror or type(e).__name__})") from None
        if as_json:
            print(json.dumps({"folder": str(folder), "histories": kept, "leftovers": left}))
            return
        if not kept and not left:
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
        for entry in left:  # they hold text too: said, so that --clear is not a surprise
            name = str(entry["path"]).rsplit("/", 1)[-1]
            print(f"  {name}: {int(entry['bytes']) / 1e6:.1f} MB, {entry['kind']} (--clear removes it)")  # type: ignore[call-overload]
        sys.stdout.flush()
