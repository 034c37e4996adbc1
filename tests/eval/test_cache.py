"""ragrl.eval.cache: per-system evaluation results on disk, keyed by name, adapter bytes and settings."""
import pytest

from ragrl.errors import RagrlError
from ragrl.eval.cache import Cache, adapter_digest


def test_an_entry_is_read_back_only_with_the_same_adapter_and_settings(tmp_path):
    cache = Cache(tmp_path / "c", 2, {"temperature": 0.0, "dtype": "torch.bfloat16"})
    assert cache.get("SFT", "abc") is None
    cache.put("SFT", "abc", [{"f1": 0.5}, {"f1": 1.0}])
    assert cache.get("SFT", "abc") == [{"f1": 0.5}, {"f1": 1.0}]
    assert cache.get("SFT", "other adapter") is None
    assert Cache(tmp_path / "c", 3, {"temperature": 0.0, "dtype": "torch.bfloat16"}).get("SFT", "abc") is None
    assert Cache(tmp_path / "c", 2, {"temperature": 0.7, "dtype": "torch.bfloat16"}).get("SFT", "abc") is None
    assert not list((tmp_path / "c").glob("*.tmp"))   # written through a temporary file, then renamed


def test_the_adapter_digest_follows_file_names_and_bytes_in_subfolders(tmp_path):
    a = tmp_path / "a"
    (a / "selector").mkdir(parents=True)
    (a / "selector" / "adapter_model.safetensors").write_bytes(b"x")
    first = adapter_digest(str(a))
    assert adapter_digest(str(a)) == first
    (a / "selector" / "adapter_model.safetensors").write_bytes(b"y")
    assert adapter_digest(str(a)) != first
    with pytest.raises(RagrlError, match="does not exist"):
        adapter_digest(str(tmp_path / "missing"))
