"""ragrl's offline data kit as an installable package: `ragrl_data.ROOT` is the kit's folder
(corpus/, embeddings/, eval/, train/, manifest.json). ragrl reads it as `kit:PATH`; nothing here
imports anything, so the package works with any Python and without ragrl."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent
MANIFEST = ROOT / "manifest.json"
