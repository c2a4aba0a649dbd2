"""The layers of localspec/ hold: a module imports only modules on its own floor or below (docs/architecture.md,
"Layers"). Every import counts, those inside functions and those made only for type checking too: the fix for a
climbing import is to move code, not to hide the import."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# bottom to top; a module's floor is that of the longest name here that it starts with
FLOORS: list[tuple[str, ...]] = [
    ("_version", "_native", "errors", "tokens", "passes", "machine", "faults", "worker", "paths", "endpoints",
     "gguf", "bounded_json"),
    # what a request asks for its answer: plain data, checked without a model
    ("schema",),
    ("settings", "events", "finish_reasons"),
    ("sampling", "models", "history"),
    ("engine",),
    ("drafters", "structured"),
    ("speculative",),
    ("request", "opening", "openai_body"),
    ("runtime",),
    ("batch", "tui", "bench", "serve"),
    ("cli", "__main__", ""),  # "": the package's face, localspec/__init__.py (generate, generate_many)
]
# the imports that climb, each for its reason (docs/architecture.md, "Layers")
CLIMBS = {
    # the GPU-layer default is whether this llama.cpp can offload, which only the engine may ask; asked when settings
    # are built, never for --help
    ("settings", "engine.backend"),
}


def floor_of(module: str) -> int:
    name = module.removeprefix("localspec").removeprefix(".")
    best = max((p for row in FLOORS for p in row if name == p or name.startswith(p + ".") or p == ""), key=len)
    return next(i for i, row in enumerate(FLOORS) if best in row)


def module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """Every localspec module ``path`` imports, with its line (``from localspec import faults`` is localspec.faults)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = {f"{node.module}.{a.name}" for a in node.names
                       if (ROOT / node.module.replace(".", "/") / a.name).with_suffix(".py").exists()
                       or (ROOT / node.module.replace(".", "/") / a.name / "__init__.py").exists()}
            found += [(node.lineno, m) for m in modules or {node.module}]
    return [(line, m) for line, m in found if m == "localspec" or m.startswith("localspec.")]


def climbs() -> list[str]:
    found = []
    for path in sorted((ROOT / "localspec").rglob("*.py")):
        me = module_of(path)
        for line, target in imports(path):
            if floor_of(target) > floor_of(me) and not any(
                    me.removeprefix("localspec.").startswith(a) and target.removeprefix("localspec.").startswith(b)
                    for a, b in CLIMBS):
                found.append(f"{path.relative_to(ROOT)}:{line} imports {target} (floor {floor_of(target)} above "
                             f"its {floor_of(me)})")
    return found


def test_no_module_imports_one_on_a_floor_above_its_own() -> None:
    assert climbs() == []


def test_the_check_sees_a_climb_of_each_kind(tmp_path: Path) -> None:
    # the floors as the test reads them, on modules it knows: a sampler importing the scheduler climbs, and so would
    # a function-level import and a type-checking one (ast sees all of them)
    assert floor_of("localspec.sampling") < floor_of("localspec.speculative.scheduler")
    assert floor_of("localspec.schema.spec") < floor_of("localspec.settings") < floor_of("localspec.structured")
    assert floor_of("localspec") == floor_of("localspec.cli.run") == len(FLOORS) - 1
    source = tmp_path / "probe.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from localspec.runtime import Runtime\n"
                      "def f():\n    import localspec.serve.app\n    from localspec import faults\n")
    assert sorted(m for _, m in imports(source)) == ["localspec.faults", "localspec.runtime", "localspec.serve.app"]
