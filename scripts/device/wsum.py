"""sha256 over (name, float32 bytes) of every tensor of a converted model dir, sorted by name."""
import hashlib, sys
from safetensors.torch import load_file
t = load_file(sys.argv[1] + "/model.safetensors")
h = hashlib.sha256()
for k in sorted(t):
    h.update(k.encode()); h.update(t[k].float().contiguous().numpy().tobytes())
print("weights", len(t), h.hexdigest())
