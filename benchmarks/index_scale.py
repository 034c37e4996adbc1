"""Indexes at scale (issue #56): a corpus of millions of passages built, searched and served here.

    .venv/bin/python benchmarks/index_scale.py                       # 2,000,000 passages (~1 h here)
    .venv/bin/python benchmarks/index_scale.py --passages 20000      # a quick check of the script

The corpus is the kit's 51,185 passages drawn again and again in a seeded shuffle, each copy
perturbed so that no two rows are the same text: about a tenth of its words dropped or swapped
with a neighbour, and the title marked with the copy's number. BM25 thus sees realistic text and
a realistic vocabulary. Encoding 2M passages with MiniLM on two cores would take days, so each
copy's vector is its source passage's kit vector plus seeded Gaussian noise (renormalised): the
neighbourhoods a compressed index must keep are of the same kind as real ones. The encoder's own
throughput is measured on a sample and projected.

For each index kind (BM25; dense flat, HNSW, IVF-SQ8, IVF-PQ) the build runs in a process of its
own through `build_index`, so its wall time and peak resident memory (`ru_maxrss`, and the peak of
its anonymous memory, `RssAnon`, which leaves out memory-mapped file pages) are its own;
the size on disk is the index folder's. Dense kinds report recall@10 against exact search (the
build's own measurement, passage vectors as queries). QPS: in-process batched, and over HTTP
(`ragrl serve`) at 1 and 64 clients, for BM25 and the compressed dense kinds (IVF-PQ re-ranking from
the memory-mapped vectors), beside the same
figures at the kit's 51k. The JSON ends with the projection to 21M passages.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from retrieval import inprocess_qps, load_with_cpu, start_server  # noqa: E402  (the benchmark beside this one)

REPO = Path(__file__).resolve().parent.parent
WIKI18 = 21_015_324   # passages in wiki-18 (Search-R1 / FlashRAG's psgs_w100 split)
DENSE_KINDS = ("flat", "hnsw", "ivf_sq8", "ivf_pq")
NOISE = 0.25          # norm of the noise added to a unit vector, before renormalising


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_corpus(kit_corpus: Path, kit_vectors: Path, n: int, out: Path, seed: int) -> tuple[Path, Path]:
    """`n` perturbed copies of kit passages (plain JSON Lines) and their vectors (.npy float32)."""
    corpus_path, vectors_path = out / f"corpus_{n}.jsonl", out / f"vectors_{n}.npy"
    if corpus_path.is_file() and vectors_path.is_file():
        return corpus_path, vectors_path
    with gzip.open(kit_corpus, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    base = np.load(kit_vectors, mmap_mode="r")
    rng, prng = np.random.default_rng(seed), random.Random(seed)
    vectors = np.lib.format.open_memmap(vectors_path, mode="w+", dtype=np.float32, shape=(n, base.shape[1]))
    with open(corpus_path, "w", encoding="utf-8") as f:
        for start in range(0, n, len(rows)):
            order = rng.permutation(len(rows))[: n - start]
            for j, src in enumerate(order.tolist()):
                row = rows[src]
                words = row["text"].split()
                for _ in range(max(1, len(words) // 10)):
                    i = prng.randrange(len(words))
                    if prng.random() < 0.5 and len(words) > 3:
                        del words[i]
                    elif i + 1 < len(words):
                        words[i], words[i + 1] = words[i + 1], words[i]
                f.write(json.dumps({"id": f"s{start + j}", "title": f"{row['title']} ({start // len(rows)})",
                                    "text": " ".join(words)}) + "\n")
            v = np.asarray(base[order], dtype=np.float32)
            v += rng.normal(0, NOISE / np.sqrt(v.shape[1]), v.shape).astype(np.float32)
            v /= np.linalg.norm(v, axis=1, keepdims=True)
            vectors[start:start + len(order)] = v
    vectors.flush()
    return corpus_path, vectors_path


# BM25 through build_index. Dense kinds through the same stages minus `check_vectors` (8 passages
# re-encoded, a second): the synthetic vectors are not MiniLM's vectors of the perturbed text, and the
# check rightly refuses them.
_BUILD = """
import json, resource, sys, threading, time
from ragrl.retrieval.dense import DenseIndex, load_vectors
from ragrl.retrieval.index import StagedIndex, build_index
args = json.loads(sys.argv[1])
# ru_maxrss counts the pages of memory-mapped files the build reads or writes (the kernel may drop
# them at any time); RssAnon is the memory the build itself holds. Its peak, sampled every 20 ms.
peak_anon = [0]
def sample_anon():
    while True:
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                peak_anon[0] = max(peak_anon[0], int(line.split()[1]))
        time.sleep(0.02)
threading.Thread(target=sample_anon, daemon=True).start()
t = time.perf_counter()
if args.get("kind") != "dense":
    build_index(progress=False, **args)
else:
    with StagedIndex(args["corpus_path"], args["out_dir"]) as stage:
        vectors = load_vectors(args["vectors"])
        params = DenseIndex.write(stage.corpus, stage.tmp / "dense", stage.work_dir / "dense", "all-minilm-l6-v2",
                                  index=args["dense_index"], vectors=vectors, recall_queries=args["recall_queries"])
        params["hnsw"] = args["dense_index"] == "hnsw"
        stage.finish(kind="dense", params=params, encoder="all-minilm-l6-v2", embedding_dim=int(vectors.shape[1]))
print(json.dumps({"seconds": time.perf_counter() - t,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "peak_anon_mb": peak_anon[0] / 1024}))
"""


def timed_build(**args) -> dict:
    """build_index(**args) in a process of its own: its wall time and peak resident memory."""
    out = subprocess.run([sys.executable, "-c", _BUILD, json.dumps(args, default=str)], capture_output=True,
                         text=True, cwd=REPO)
    if out.returncode:
        raise RuntimeError(f"build failed: {out.stderr[-2000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    folder = Path(args["out_dir"])
    result["disk_mb"] = round(sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20, 1)
    manifest = json.loads((folder / "manifest.json").read_text())
    result["params"] = manifest["params"]
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in result.items()}


def encode_rate(corpus: Path, sample: int) -> float:
    from ragrl.models.embedder import load_embedder
    from ragrl.retrieval.dense import encode
    with open(corpus, encoding="utf-8") as f:
        texts = [f"{r['title']}. {r['text']}" for r in (json.loads(next(f)) for _ in range(sample))]
    model = load_embedder("all-minilm-l6-v2")
    encode(model, texts[:64])
    t = time.perf_counter()
    encode(model, texts)
    return sample / (time.perf_counter() - t)


def serve_figures(index_dir: Path, queries: list[str], requests: int) -> dict:
    from ragrl.retrieval.index import load_index
    index = load_index(index_dir)
    result = {"inprocess": inprocess_qps(index, queries)}
    proc, url = start_server(index_dir)
    try:
        result["http"] = {str(c): load_with_cpu(url, proc.pid, queries, c, requests if c > 1 else requests // 4)
                          for c in (1, 64)}
    finally:
        proc.terminate()
        proc.wait(30)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--passages", type=int, default=2_000_000)
    ap.add_argument("--kinds", default="bm25," + ",".join(DENSE_KINDS))
    ap.add_argument("--work", type=Path, default=Path("/tmp/ragrl_index_scale"))
    ap.add_argument("--requests", type=int, default=2000, help="HTTP requests per client level (1 client: a quarter)")
    ap.add_argument("--recall-queries", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "index_scale.json")
    args = ap.parse_args()
    from ragrl.paths import resolve_kit
    kit_corpus = resolve_kit("kit:corpus/wiki_passages.jsonl.gz")
    kit_vectors = resolve_kit("kit:embeddings/wiki_passages.all-minilm-l6-v2.fp16.npy")
    args.work.mkdir(parents=True, exist_ok=True)
    result: dict = {"benchmark": "index_scale", "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                    "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)},
                    "passages": args.passages, "seed": args.seed, "builds": {}, "serving": {}}

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")

    log(f"synthetic corpus of {args.passages} passages")
    t = time.perf_counter()
    corpus, vectors = make_corpus(kit_corpus, kit_vectors, args.passages, args.work, args.seed)
    result["corpus"] = {"path": str(corpus), "bytes": corpus.stat().st_size, "vectors_bytes": vectors.stat().st_size,
                        "made_in_s": round(time.perf_counter() - t, 1),
                        "text_plus_vectors_mb": round((corpus.stat().st_size + vectors.stat().st_size) / 2**20, 1)}
    save()
    kinds = args.kinds.split(",")
    for kind in kinds:
        log(f"build {kind}")
        spec = {"corpus_path": str(corpus), "out_dir": str(args.work / f"idx_{kind}_{args.passages}")}
        if kind != "bm25":
            spec.update(kind="dense", vectors=str(vectors), dense_index=kind,
                        recall_queries=args.recall_queries if kind != "flat" else 0)
        result["builds"][kind] = timed_build(**spec)
        save()
    log("encoder throughput")
    rate = encode_rate(corpus, 512)
    result["encoder"] = {"model": "all-minilm-l6-v2", "passages_per_s": round(rate, 1)}
    with gzip.open(resolve_kit("kit:eval/hotpotqa_dev.jsonl.gz"), "rt", encoding="utf-8") as f:
        queries = [json.loads(line)["question"] for line in f][:512]
    for kind in ("bm25", "ivf_sq8", "ivf_pq"):
        if kind in kinds:
            log(f"serve {kind}")
            result["serving"][kind] = serve_figures(args.work / f"idx_{kind}_{args.passages}", queries, args.requests)
            save()
    result["projection_21m"] = project(result)
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    save()
    log(f"wrote {args.out}")


def project(result: dict) -> dict:
    """Build time and disk, linear in passages from this run's figures (k-means training, HNSW's log
    factor and BM25's vocabulary growth make it a lower bound for those). Peak memory is not
    projected here: it is not linear (a streaming build's is bounded by a chunk and the vocabulary,
    a flat index's is its vectors); compare two sizes' runs for its slope."""
    scale = WIKI18 / result["passages"]
    out = {"passages": WIKI18, "method": project.__doc__.split("(")[0].strip()}
    for kind, b in result["builds"].items():
        out[kind] = {"build_hours": round(b["seconds"] * scale / 3600, 2), "disk_gb": round(b["disk_mb"] * scale / 1024, 1)}
    if "encoder" in result:
        out["encode_hours_on_this_cpu"] = round(WIKI18 / result["encoder"]["passages_per_s"] / 3600, 1)
    return out


if __name__ == "__main__":
    main()
