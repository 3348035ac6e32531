"""Writes tests/nn/gpt2_training_reference.rs: the losses of 10 AdamW steps
(torch.optim.AdamW's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8,
weight decay 0.01) training the GPT-2 fixture (tests/fixtures/gpt2-tiny,
its weights read from model.safetensors) on one fixed batch, in f32 on the
CPU, computed by PyTorch alone: the model is GPT-2's architecture written
as a plain nn.Module (pre-LN blocks, tanh GELU, F.scaled_dot_product_attention
with is_causal=True, the LM head tied to wte, no dropout), the loss
F.cross_entropy of next-token logits against fixed targets.

    pip install torch
    python tests/nn/gpt2_training_reference.py     # from the repository root
"""
import json
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

FIXTURE = "tests/fixtures/gpt2-tiny"
BATCH, SEQ, STEPS = 3, 12, 10


def read_safetensors(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        assert meta["dtype"] == "F32", meta
        a, b = meta["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[8 + n + a:8 + n + b]), dtype=torch.float32).reshape(meta["shape"])
    return out


class Block(nn.Module):
    def __init__(self, d, heads, inner, eps):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d, eps=eps), nn.LayerNorm(d, eps=eps)
        self.c_attn, self.attn_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, inner), nn.Linear(inner, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.c_attn(self.ln_1(x)).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["n_embd"]
        inner = c.get("n_inner") or 4 * d
        self.wte, self.wpe = nn.Embedding(c["vocab_size"], d), nn.Embedding(c["n_positions"], d)
        self.h = nn.ModuleList(Block(d, c["n_head"], inner, c["layer_norm_epsilon"]) for _ in range(c["n_layer"]))
        self.ln_f = nn.LayerNorm(d, eps=c["layer_norm_epsilon"])

    def load(self, w):
        """Hugging Face names; Conv1D weights are stored [in, out]."""
        with torch.no_grad():
            self.wte.weight.copy_(w["transformer.wte.weight"])
            self.wpe.weight.copy_(w["transformer.wpe.weight"])
            self.ln_f.weight.copy_(w["transformer.ln_f.weight"])
            self.ln_f.bias.copy_(w["transformer.ln_f.bias"])
            for i, blk in enumerate(self.h):
                p = f"transformer.h.{i}."
                for mine, theirs in [("ln_1", "ln_1"), ("ln_2", "ln_2")]:
                    getattr(blk, mine).weight.copy_(w[p + theirs + ".weight"])
                    getattr(blk, mine).bias.copy_(w[p + theirs + ".bias"])
                for mine, theirs in [("c_attn", "attn.c_attn"), ("attn_proj", "attn.c_proj"),
                                     ("c_fc", "mlp.c_fc"), ("mlp_proj", "mlp.c_proj")]:
                    getattr(blk, mine).weight.copy_(w[p + theirs + ".weight"].t())
                    getattr(blk, mine).bias.copy_(w[p + theirs + ".bias"])

    def forward(self, ids, targets):
        x = self.wte(ids) + self.wpe(torch.arange(ids.size(1)))
        for blk in self.h:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def batch(vocab):
    """The ids and targets the Rust test makes the same way."""
    ids = [(i * 37 + 11) % vocab for i in range(BATCH * SEQ)]
    targets = [(i * 53 + 7) % vocab for i in range(BATCH * SEQ)]
    return ids, targets


def main():
    config = json.load(open(f"{FIXTURE}/config.json"))
    model = Gpt(config)
    model.load(read_safetensors(f"{FIXTURE}/model.safetensors"))
    ids, targets = batch(config["vocab_size"])
    ids, targets = torch.tensor(ids).view(BATCH, SEQ), torch.tensor(targets)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    losses = []
    for _ in range(STEPS):
        loss = model(ids, targets)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    with open("tests/nn/gpt2_training_reference.rs", "w") as f:
        f.write("//! Written by tests/nn/gpt2_training_reference.py (PyTorch "
                f"{torch.__version__.split('+')[0]}, f32, CPU); do not edit.\n\n")
        f.write(f"pub const BATCH: usize = {BATCH};\npub const SEQ: usize = {SEQ};\n\n")
        f.write("/// The loss of each AdamW step, before its update.\n")
        f.write(f"pub const LOSSES: [f64; {STEPS}] = [\n")
        for l in losses:
            f.write(f"    {l!r},\n")
        f.write("];\n")
    print(losses)


if __name__ == "__main__":
    main()
