"""The field's files as they ship: a wiki-18-layout corpus (`id`, `contents`) and a faiss index of
e5-style vectors ("passage: " prefix), written here by the test itself with the real MiniLM."""
import json

import faiss
import numpy as np
import pytest
from typer.testing import CliRunner

from ragrl.errors import IndexMismatchError
from ragrl.paths import DEMO_CORPUS
from ragrl.retrieval.corpus import load_corpus
from ragrl.retrieval.faiss_import import import_faiss_index
from ragrl.retrieval.index import load_index

ROWS = 40
QUERIES = ["American singer album", "river in Europe", "football club"]


@pytest.fixture(scope="module")
def field_files(tmp_path_factory, minilm):
    """wiki-18.jsonl (integer ids, `contents`) and its flat inner-product index, as FlashRAG builds one."""
    root = tmp_path_factory.mktemp("wiki18")
    demo = load_corpus(DEMO_CORPUS)
    contents = [f'"{demo.titles[i]}"\n{demo.texts[i]}' for i in range(ROWS)]
    (root / "wiki-18.jsonl").write_text("".join(json.dumps({"id": i, "contents": c}) + "\n" for i, c in enumerate(contents)))
    vectors = minilm.encode([f"passage: {c}" for c in contents], normalize_embeddings=True).astype(np.float32)
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    faiss.write_index(index, str(root / "e5_Flat.index"))
    return root, vectors, contents


def test_search_r1_layout_loads_and_searches(field_files, minilm, tmp_path):
    root, vectors, contents = field_files
    out = import_faiss_index(root / "e5_Flat.index", root / "wiki-18.jsonl", tmp_path / "idx",
                             encoder="all-minilm-l6-v2", query_prefix="query: ")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["params"]["passages_as"] == {"rendering": "contents", "prefix": "passage: "}
    assert manifest["params"]["faiss"]["type"] == "IndexFlatIP" and manifest["embedding_dim"] == 384
    assert not (out / "dense").exists()      # the 60 GB file is searched where it lies
    index = load_index(out)
    hits = index.search(QUERIES, 5)
    # The same ranking as faiss itself over "query: "-prefixed queries.
    q = minilm.encode([f"query: {x}" for x in QUERIES], normalize_embeddings=True).astype(np.float32)
    scores, rows = faiss.read_index(str(root / "e5_Flat.index")).search(q, 5)
    assert [[h.id for h in row] for row in hits] == [[str(r) for r in row] for row in rows]
    assert [h.score for h in hits[0]] == pytest.approx(scores[0].tolist(), abs=1e-5)
    first = hits[0][0]
    assert f'"{first.title}"\n{first.text}' == contents[int(first.id)]   # contents split into title and text


def test_what_the_encoder_cannot_search_is_refused(field_files, tmp_path):
    root, vectors, _ = field_files
    cases = {
        "l2": (faiss.IndexFlatL2(384), vectors, "ranks by L2 distance"),
        "dim": (faiss.IndexFlatIP(16), np.ascontiguousarray(vectors[:, :16]), "vectors are 16-d but encoder"),
        "rows": (faiss.IndexFlatIP(384), vectors[:-1], f"{ROWS - 1} vectors for a corpus of {ROWS} passages"),
        "order": (faiss.IndexFlatIP(384), vectors[::-1].copy(), "not 'all-minilm-l6-v2''s vectors of this corpus"),
    }
    for name, (index, data, message) in cases.items():
        index.add(data)
        path = tmp_path / f"{name}.index"
        faiss.write_index(index, str(path))
        with pytest.raises(IndexMismatchError, match=message):
            import_faiss_index(path, root / "wiki-18.jsonl", tmp_path / name, encoder="all-minilm-l6-v2")
        assert not (tmp_path / name).exists()


def test_cli_import_then_moved_file_is_named(field_files, tmp_path):
    from ragrl.cli.main import app

    root, _, _ = field_files
    faiss_copy = tmp_path / "e5.index"
    faiss_copy.write_bytes((root / "e5_Flat.index").read_bytes())
    result = CliRunner().invoke(app, ["index", "import", "--faiss", str(faiss_copy), "--corpus",
                                      str(root / "wiki-18.jsonl"), "--encoder", "all-minilm-l6-v2",
                                      "--query-prefix", "query: ", "--out", str(tmp_path / "idx")])
    assert result.exit_code == 0, result.output
    assert f"imported {ROWS} vectors (IndexFlatIP, 384-d)" in result.output
    faiss_copy.unlink()
    with pytest.raises(Exception, match="searches the faiss file .* which is not there"):
        load_index(tmp_path / "idx")
