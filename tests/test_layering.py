"""The layering rules of DESIGN.md, checked in a fresh interpreter: training never imports the HTTP
server (a machine that only trains need not have fastapi/starlette/uvicorn; a lent GPU machine did
not), and the rollout engine never imports the trainer."""
import os
import subprocess
import sys
import textwrap

BLOCK_WEB = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"fastapi", "starlette", "uvicorn"}:
            raise ImportError(f"blocked by the test: {name}")
sys.meta_path.insert(0, _Block())
"""


def _run(code: str, tmp_path, block_web: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAGRL_HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    code = (BLOCK_WEB if block_web else "") + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_training_and_in_process_retrieval_run_without_the_web_stack(tmp_path):
    out = _run("""
    import sys
    import ragrl.train.trainer, ragrl.retrieval.client, ragrl.rollout.pipeline
    from ragrl.retrieval.inprocess import make_retriever
    from ragrl.train.trainer import cached_bm25_index
    hits = make_retriever(str(cached_bm25_index(None))).search(["the capital of France"], 2)
    assert len(hits) == 1 and len(hits[0]) == 2, hits
    assert "ragrl.retrieval.server" not in sys.modules
    print("ok")
    """, tmp_path, block_web=True)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_the_block_itself_works(tmp_path):
    """The check above is only worth something if importing the server really fails under the block."""
    out = _run("import ragrl.retrieval.server\n", tmp_path, block_web=True)
    assert out.returncode != 0 and "blocked by the test: fastapi" in out.stderr


def test_the_rollout_engine_never_imports_the_trainer(tmp_path):
    out = _run("""
    import sys, pkgutil, importlib, ragrl.rollout
    for m in pkgutil.iter_modules(ragrl.rollout.__path__):
        importlib.import_module(f"ragrl.rollout.{m.name}")
    bad = sorted(m for m in sys.modules if m == "ragrl.train" or m.startswith("ragrl.train."))
    print(bad)
    """, tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
