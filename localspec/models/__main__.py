"""``python -m localspec.models``: assemble the embedded default model and print its path (for scripts/setup)."""

from __future__ import annotations

import sys

from localspec.errors import UserError
from localspec.models.embedded import ensure_default_model


def main() -> None:
    try:
        print(ensure_default_model(progress=True))
    except UserError as exc:
        print(f"localspec: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
