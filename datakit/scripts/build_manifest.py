"""Write ragrl-data's manifest.json: every file's sha256, size, rows, what it is, the sources its rows
came from and its licence, beside the upstream sources (repository, commit, path, git blob, licence).

    .venv/bin/python datakit/scripts/build_manifest.py UPSTREAM_MANIFEST.json

Deterministic: the same files give the same bytes. `ragrl data` verifies against what it writes."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ragrl.kit import count_rows, sha256_of   # the same counting and hashing `ragrl data` verifies with

KIT = Path(__file__).resolve().parents[1] / "src" / "ragrl_data"
HOTPOT = ["ircot_hotpotqa_dev500", "rpt_hotpotqa_dev", "rpt_hotpotqa_train", "rpt_hotpotqa_test"]
TWOWIKI = ["arag_2wiki_dev_qa", "kag_2wiki_qa_sub", "hippo_2wiki_corpus"]
CC_BY_SA = "CC BY-SA 4.0 (Wikipedia text, HotpotQA)"

# path -> (what, source keys or key prefixes, licence)
FILES = {
    "corpus/wiki_passages.jsonl.gz": (
        "51,185 de-duplicated Wikipedia passages {id, title, text, sources}: HotpotQA / 2Wiki / MuSiQue dev "
        "contexts, HotpotQA and MuSiQue train contexts, HippoRAG's benchmark corpora (from Psi-RAG logs) and "
        "wiki-18 passages shown to Search-R1 agents (from reason_over_search logs)",
        [*HOTPOT, "kag_musique_dev100", "hippo_2wiki_corpus", "hippo_hotpotqa_train_corpus",
         "hippo_musique_train_corpus", "Newiz430/Psi-RAG:", "GaurisankarJ/reason_over_search:evaluation_search_r1"],
        "CC BY-SA (Wikipedia text; 3.0 for wiki-18 passages, 4.0 for HotpotQA's)"),
    "embeddings/wiki_passages.all-minilm-l6-v2.fp16.npy": (
        "float16 [51185, 384] all-MiniLM-L6-v2 vectors of the corpus, row i = corpus line i, L2-normalised, "
        "text 'title. text' (see embeddings/README.md)",
        [], "derived from the corpus: CC BY-SA; encoder all-MiniLM-L6-v2 Apache-2.0"),
    "embeddings/README.md": ("how the vectors were made: encoder, text, pooling, precision, hashes", [], "CC BY-SA 4.0"),
    "coverage.json": ("answer-in-corpus and stdlib-BM25 answer@k / gold@k figures per question set, computed "
                      "before the dev pools were split off", [], "CC BY-SA 4.0"),
    "eval/hotpotqa_dev.jsonl.gz": ("358 HotpotQA dev questions (IRCoT 500 subsample ∪ RPT rows) with 2 gold and "
                                   "10 context passage ids; the rest of dev is train/hotpotqa_dev_pool",
                                   HOTPOT, CC_BY_SA),
    "eval/musique_dev.jsonl.gz": ("100 answerable MuSiQue dev questions with 2-4 gold and 20 context passage "
                                  "ids and the question decomposition", ["kag_musique_dev100"], "CC BY 4.0 (MuSiQue)"),
    "eval/2wikimultihopqa_dev.jsonl.gz": ("345 2WikiMultihopQA dev questions recovered against HippoRAG's 2Wiki "
                                          "corpus, with heuristic evidence passage ids", TWOWIKI,
                                          "Apache-2.0 (2WikiMultihopQA)"),
    "eval/nq_test.jsonl.gz": ("1,000 NQ-open dev questions (FlashRAG's NQ test subsample), canonical answer lists; "
                              "open retrieval: the corpus covers them only partly", ["ros_nq", "nq_open_dev"],
                              "CC BY-SA 3.0 (Natural Questions)"),
    "eval/triviaqa_test.jsonl.gz": ("1,000 TriviaQA questions (FlashRAG's test subsample) with all aliases; "
                                    "open retrieval", ["ros_triviaqa"], "Apache-2.0 (TriviaQA repository)"),
    "eval/popqa_test.jsonl.gz": ("500 PopQA questions (half of FlashRAG's 1,000 by question text) with metadata; "
                                 "open retrieval", ["ros_popqa"], "MIT (PopQA)"),
    "train/hotpotqa_dev_pool.jsonl.gz": ("867 HotpotQA dev questions split off eval/ for training, gold passage "
                                         "ids as in eval/", HOTPOT, CC_BY_SA),
    "train/2wikimultihopqa_dev_pool.jsonl.gz": ("637 2Wiki dev questions split off eval/ for training",
                                                TWOWIKI, "Apache-2.0 (2WikiMultihopQA)"),
    "train/popqa_pool.jsonl.gz": ("500 PopQA questions, the other half by question text", ["ros_popqa"],
                                  "MIT (PopQA)"),
    "train/nq_open_dev_pool.jsonl.gz": ("2,610 NQ-open dev questions not in eval/nq_test", ["nq_open_dev"],
                                        "CC BY-SA 3.0 (Natural Questions)"),
    "train/hotpotqa_2wiki_train_r1searcher.jsonl.gz": (
        "8,498 HotpotQA-train + 2Wiki-train questions with one answer (R1-Searcher's stage 1 and 2 training "
        "sets); their answers are mostly not in the corpus", ["r1s_stage_1", "r1s_stage_2"],
        "MIT (R1-Searcher); questions CC BY-SA 4.0 (HotpotQA) and Apache-2.0 (2Wiki)"),
    "train/musique_train.jsonl.gz": ("19,938 answerable MuSiQue train questions and answers (no passages)",
                                     ["arag_musique_train_qa"], "CC BY 4.0 (MuSiQue)"),
    "train/nq_efficientqa_train.jsonl.gz": ("3,569 NQ-open EfficientQA dev + test questions, used as training "
                                            "questions", ["nq_open_eqa_dev", "nq_open_eqa_test"],
                                            "CC BY-SA 3.0 (Natural Questions)"),
    "train/multihop_train_with_context.jsonl.gz": (
        "100 HotpotQA-train + 100 MuSiQue-train questions with gold and context passage ids in the corpus "
        "(HippoRAG)", ["hippo_hotpotqa_train", "hippo_hotpotqa_train_corpus", "hippo_musique_train",
                       "hippo_musique_train_corpus"], "CC BY-SA 4.0 (HotpotQA) and CC BY 4.0 (MuSiQue)"),
}


def main(upstream_path: str) -> None:
    upstream = json.loads(Path(upstream_path).read_text())
    keys = [s["key"] for s in upstream["sources"]]
    on_disk = sorted(str(p.relative_to(KIT)) for p in KIT.rglob("*")
                     if p.is_file() and p.name not in ("manifest.json", "__init__.py", "README.md")
                     and "__pycache__" not in p.parts)
    on_disk.append("embeddings/README.md")
    missing = sorted(set(FILES) ^ set(on_disk))
    if missing:
        sys.exit(f"files and FILES differ: {missing}")
    files = {}
    for rel, (what, wanted, licence) in sorted(FILES.items()):
        path = KIT / rel
        sources = sorted({k for k in keys for w in wanted if k == w or k.startswith(w)})
        if len(sources) < len(wanted):
            sys.exit(f"{rel}: a source key matches nothing in the upstream manifest: {wanted}")
        files[rel] = {"sha256": sha256_of(path), "bytes": path.stat().st_size,
                      "rows": count_rows(path), "what": what, "sources": sources, "licence": licence}
    manifest = {
        "name": "ragrl-data",
        "about": "the offline RAG / multi-hop QA kit that ragrl's recipes, quickstart and benchmarks read "
                 "(kit:PATH); see README.md",
        "licence": "CC BY-SA 4.0 as a whole (share-alike Wikipedia text); each file's own licence below",
        "rules": "train on train/ files only, evaluate on eval/ files only; every question text is in exactly one "
                 "of them (checked by normalised text); choose settings on a slice of train/ held apart",
        "files": files,
        "sources": [{"key": s["key"], "repo": s["repo"], "commit": s["commit"], "path": s["path"],
                     "git_blob": s["blob"], "bytes": s["bytes"], "licence_stated_by_repo": s["license_stated_by_repo"]}
                    for s in upstream["sources"]],
        "dev_pools": upstream["dev_pools"],
    }
    (KIT / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {KIT / 'manifest.json'}: {len(files)} files, {len(manifest['sources'])} sources")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/manifest.json")
