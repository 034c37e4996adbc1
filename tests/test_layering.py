"""The layers of docs/architecture.md, enforced on every module of the package.

1. Layering: a module imports only from its own layer or a lower one (every import, at the top of a
   file or inside a function, is read from the source).
2. No import cycle between modules (top-level imports form a DAG), so a file's dependencies can be
   read from its top and any module imports on its own.
3. Imports sit at the top of each file; a function-level import is allowed only for an optional or
   heavy dependency on the LAZY list, and in the CLI (whose commands import the library when they
   run, so that `ragrl --help` does not load torch); either way its line says why in a comment.
4. The core below ragrl.methods never names a method (no method's module, protocol or reward name),
   and no module above it imports one: the library, CLI and quickstart reach a method through its
   record (`ragrl.methods.base.Method`) and the registries alone.
5. Training never imports the HTTP server (a machine that only trains need not have the web
   stack), checked in a fresh interpreter.
"""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path


SRC = Path(__file__).resolve().parents[1] / "src" / "ragrl"

# Lowest first. A module's layer is its package (ragrl/<package>/...), or its own name for the
# modules directly under ragrl/.
LAYERS = [
    {"__init__", "errors", "jsonl", "paths", "kit", "registry", "yaml_config", "config_help", "datasets", "data", "recipes", "text"},
    {"algos"},
    {"models"},
    {"retrieval"},
    {"engines"},
    {"rollout"},
    {"policy"},
    {"rewards"},
    {"eval"},
    {"methods"},
    {"train"},
    {"compare"},
    {"quickstart"},
    {"api"},
    {"cli"},
]
LAYER_OF = {name: i for i, names in enumerate(LAYERS) for name in names}
# Optional or heavy dependencies a function may import late (each such line carries a comment).
LAZY = ("vllm", "pyarrow", "peft", "matplotlib", "fastapi", "uvicorn", "starlette", "wandb", "mlflow", "faiss", "sentence_transformers",
        "torch.distributed", "torch.utils.tensorboard", "huggingface_hub", "deepspeed", "trl",
        "ragrl.retrieval.server")


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    parts = module.split(".")
    return LAYER_OF[parts[1] if len(parts) > 1 else "__init__"]


def imports(path: Path):
    """(line, imported module, at module level, the source line) for every import of the file."""
    source = path.read_text()
    lines = source.split("\n")

    def walk(node, in_function):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.ImportFrom) and not child.level:
                names = [child.module] + [f"{child.module}.{a.name}" for a in child.names]
            elif isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            else:
                yield from walk(child, inner)
                continue
            for name in names:
                yield child.lineno, name, not in_function, lines[child.end_lineno - 1]

    yield from walk(ast.parse(source), False)


MODULES = {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def test_every_package_has_a_layer():
    packages = {m.split(".")[1] for m in MODULES if "." in m}
    assert packages <= set(LAYER_OF), f"packages with no layer: {sorted(packages - set(LAYER_OF))}"


def test_no_module_imports_a_higher_layer():
    bad = []
    for mod, path in MODULES.items():
        for line, name, _, _ in imports(path):
            if name.startswith("ragrl.") and name.split(".")[1] in LAYER_OF and layer(name) > layer(mod):
                bad.append(f"{path.relative_to(SRC)}:{line} imports {name}")
    assert not bad, "imports against the layers:\n" + "\n".join(sorted(set(bad)))


def test_the_layer_check_fails_on_an_upward_import(tmp_path):
    """The check above is worth something only if it sees an upward import."""
    fake = SRC / "rollout" / "x.py"
    assert layer("ragrl.rollout.x") < layer("ragrl.train.trainer")
    src = tmp_path / "x.py"
    src.write_text("def f():\n    from ragrl.train.trainer import Trainer  # inside a function\n")
    found = [name for _, name, _, _ in imports(src) if name.startswith("ragrl.train")]
    assert found and layer(found[0]) > layer(module_name(fake))


def test_module_level_imports_have_no_cycle():
    graph = {m: set() for m in MODULES}
    for mod, path in MODULES.items():
        for _, name, top, _ in imports(path):
            # `from ragrl.a import b` names module ragrl.a.b when b is a module, else ragrl.a
            target = name if name in MODULES else name.rsplit(".", 1)[0] if name.rsplit(".", 1)[0] in MODULES else None
            if top and target and target != mod and not mod.startswith(target + "."):
                graph[mod].add(target)
    cycles, state = [], {}

    def visit(m, path):
        state[m] = "open"
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                cycles.append(" -> ".join(path[path.index(n):] + [n]) if n in path else f"{m} -> {n}")
            elif n not in state:
                visit(n, path + [n])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_imports_sit_at_the_top_except_lazy_dependencies_with_a_reason():
    bad = []
    for mod, path in MODULES.items():
        for line, name, top, text in imports(path):
            lazy = any(name == d or name.startswith(d + ".") for d in LAZY) or mod.startswith("ragrl.cli.")
            if not top and (not lazy or "#" not in text):
                bad.append(f"{path.relative_to(SRC)}:{line} imports {name} inside a function")
    bad = sorted(set(bad))
    assert not bad, "function-level imports (move them to the top, or name why they are late):\n" + "\n".join(bad)


def test_the_core_never_names_a_method():
    from ragrl.methods import METHODS

    words = set()
    for method in METHODS.values():
        words.add(f"ragrl.methods.{method.name}")
        words.update(f'"{r}"' for r in method.rewards)
        words.update(f'"{p.name}"' for p in method.protocols)
    bad = []
    for mod, path in MODULES.items():
        if layer(mod) >= LAYER_OF["methods"]:
            continue
        code = path.read_text()
        for word in words:
            for m in re.finditer(re.escape(word), code):
                line = code[: m.start()].count("\n") + 1
                bad.append(f"{path.relative_to(SRC)}:{line} names {word}")
    assert not bad, "the core names a method:\n" + "\n".join(sorted(bad))


# The shared parts of ragrl/methods that are no method of their own.
METHODS_SHARED = {"__init__", "base", "synthetic", "lm_setup"}


def method_modules() -> set[str]:
    """Each method's own module or folder under ragrl/methods."""
    return {p.stem for p in (SRC / "methods").iterdir()
            if (p.suffix == ".py" or (p / "__init__.py").exists()) and p.stem not in METHODS_SHARED}


def test_no_module_above_the_methods_imports_a_method():
    own = method_modules()
    assert {"harr", "search_r1", "smartrag", "mmoa"} <= own   # the check sees the methods
    bad = []
    for mod, path in MODULES.items():
        if layer(mod) <= LAYER_OF["methods"]:
            continue
        for line, name, _, _ in imports(path):
            parts = name.split(".")
            if parts[:2] == ["ragrl", "methods"] and len(parts) > 2 and parts[2] in own:
                bad.append(f"{path.relative_to(SRC)}:{line} imports {name}")
    assert not bad, "a method imported above ragrl.methods (go through its Method record):\n" + "\n".join(sorted(set(bad)))


BLOCK_WEB = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"fastapi", "starlette", "uvicorn", "faiss"}:
            raise ImportError(f"blocked by the test: {name}")
sys.meta_path.insert(0, _Block())
"""


def _run(code: str, tmp_path, block_web: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAGRL_HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    code = (BLOCK_WEB if block_web else "") + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_training_and_in_process_retrieval_run_without_the_web_stack_or_faiss(tmp_path):
    """A lent GPU machine has neither (scripts/device/README.md): BM25 training must not import them."""
    out = _run("""
    import sys
    import ragrl.train.trainer, ragrl.train.recipe, ragrl.retrieval.client, ragrl.methods
    from ragrl.retrieval.resolve import cached_bm25_index, make_retriever
    hits = make_retriever(str(cached_bm25_index(None))).search(["the capital of France"], 2)
    assert len(hits) == 1 and len(hits[0]) == 2, hits
    assert "ragrl.retrieval.server" not in sys.modules and "faiss" not in sys.modules
    print("ok")
    """, tmp_path, block_web=True)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_the_block_itself_works(tmp_path):
    """The check above is only worth something if importing the server really fails under the block."""
    out = _run("import ragrl.retrieval.server\n", tmp_path, block_web=True)
    assert out.returncode != 0 and "blocked by the test: fastapi" in out.stderr
