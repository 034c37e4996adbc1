"""Shards of one corpus behind real `ragrl serve` apps over HTTP: the merged top-k of two dense halves
equals one index over the whole corpus, a shard that goes away is waited for and then named (never a
partial top-k), and shards that are not parts of one corpus are refused."""
import json

import pytest

from ragrl.errors import RagrlError
from ragrl.retrieval.client import RetrievalUnavailable
from ragrl.retrieval.index import build_index, corpus_location, load_index, read_manifest
from ragrl.retrieval.resolve import make_retriever
from ragrl.retrieval.server import ServerThread, create_app
from ragrl.retrieval.sharded import ShardedRetriever

QUERIES = ["Who composed the opera Maria Golovin?", "battle of Guam 1944", "Hamlet play author",
           "a river in Europe", "American football coach"]


@pytest.fixture(scope="module")
def halves(small_dense_dir, tmp_path_factory):
    """The small dense index's corpus split in two, each half indexed on its own (flat, MiniLM)."""
    rows = [json.loads(line) for line in open(corpus_location(small_dense_dir, read_manifest(small_dense_dir)))]
    root = tmp_path_factory.mktemp("shards")
    out = []
    for name, part in (("a", rows[::2]), ("b", rows[1::2])):
        path = root / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in part))
        out.append(load_index(build_index(path, root / name, kind="dense", progress=False)))
    return out


def test_two_dense_shards_merge_to_the_whole_indexs_top_k(small_dense_dir, halves):
    whole = load_index(small_dense_dir).search(QUERIES, 5)
    with ServerThread(create_app(halves[0])) as url_a, ServerThread(create_app(halves[1])) as url_b:
        sharded = make_retriever(f"{url_a} | {url_b}")
        assert isinstance(sharded, ShardedRetriever)
        merged = sharded.search(QUERIES, 5)
    for got, want in zip(merged, whole):
        assert [h.id for h in got] == [h.id for h in want]
        assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-5)
    # both halves answered: each query's top 5 mixes them somewhere
    ids_a = {h.id for hits in halves[0].search(QUERIES, 5) for h in hits}
    assert any(h.id in ids_a for hits in merged for h in hits)
    assert any(h.id not in ids_a for hits in merged for h in hits)


def test_a_shard_that_goes_away_is_waited_for_then_named_never_left_out(halves):
    a, b = ServerThread(create_app(halves[0])), ServerThread(create_app(halves[1]))
    urls = [a.start(), b.start()]
    try:
        sharded = make_retriever("|".join(urls), max_wait_s=1, backoff=0.05, max_backoff=0.2)
        assert len(sharded.search(QUERIES[:2], 3)[0]) == 3
        b.stop()
        with pytest.raises(RetrievalUnavailable, match=urls[1]):
            sharded.search(QUERIES[:2], 3)
    finally:
        a.stop()


def test_shards_that_are_not_parts_of_one_corpus_are_refused(halves, demo_bm25_index):
    with ServerThread(create_app(halves[0])) as url_a, ServerThread(create_app(halves[0])) as url_a2, \
            ServerThread(create_app(demo_bm25_index)) as url_bm25:
        with pytest.raises(RagrlError, match="serve the same corpus"):
            make_retriever(f"{url_a}|{url_a2}").search(QUERIES[:1], 3)
        with pytest.raises(RagrlError, match="different kinds of index"):
            make_retriever(f"{url_a}|{url_bm25}").search(QUERIES[:1], 3)
    with pytest.raises(RagrlError, match="each part must be a retrieval server's http"):
        make_retriever("http://127.0.0.1:9|/some/index/folder")
