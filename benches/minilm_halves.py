"""Splits all-MiniLM-L6-v2's f32 checkpoint (91 MB) into two safetensors
files of disjoint tensors, model-0.safetensors and model-1.safetensors,
each small enough for one device call (64 MiB); kiln reads them as one
checkpoint (nn::bert::checkpoint_files). Also copies the small files.

    python3 benches/minilm_halves.py <model dir> <out dir>

Pure Python (the safetensors format is a JSON header and raw bytes), so
it needs neither torch nor the safetensors package.
"""
import json
import os
import shutil
import struct
import sys

src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
with open(os.path.join(src, "model.safetensors"), "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    data = f.read()
meta = header.pop("__metadata__", None)
# Two bins, largest tensor first into the lighter one: each under 64 MiB.
names = sorted(header, key=lambda k: header[k]["data_offsets"][0] - header[k]["data_offsets"][1])
parts, sizes = [[], []], [0, 0]
for k in names:
    i = 0 if sizes[0] <= sizes[1] else 1
    parts[i].append(k)
    sizes[i] += header[k]["data_offsets"][1] - header[k]["data_offsets"][0]
for i, part in enumerate(parts):
    h, blobs, off = {}, [], 0
    for k in part:
        a, b = header[k]["data_offsets"]
        h[k] = {"dtype": header[k]["dtype"], "shape": header[k]["shape"], "data_offsets": [off, off + b - a]}
        blobs.append(data[a:b])
        off += b - a
    if meta:
        h["__metadata__"] = meta
    hb = json.dumps(h).encode()
    hb += b" " * (-len(hb) % 8)
    with open(os.path.join(out, f"model-{i}.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + b"".join(blobs))
    print(f"model-{i}.safetensors: {len(part)} tensors, {off / 2**20:.1f} MiB")
for name in ["config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"]:
    if os.path.exists(os.path.join(src, name)):
        shutil.copy(os.path.join(src, name), out)
