"""Writes the GPT-2 test fixture and its reference outputs, all computed by
Hugging Face's own libraries (nothing here comes from kiln):

- tests/fixtures/gpt2-tiny/tokenizer.json: a byte-level BPE (GPT-2's
  scheme, about 500 tokens, `<|endoftext|>` special) trained with
  `tokenizers` on the text below;
- tests/fixtures/gpt2-tiny/{config.json, model.safetensors}: a
  `GPT2LMHeadModel` (2 layers, 64 wide, 4 heads, 128 positions) with random
  weights drawn from `torch.manual_seed(SEED)`, written by `save_pretrained`.
  Weights are N(0, 0.2), layer norm weights N(1, 0.2) and every bias
  N(0, 0.2): ten times GPT-2's initial scale, so logits are far from uniform
  and a wrong operation changes them visibly;
- tests/nn/gpt2_reference.rs: the prompts' ids as the tokenizer encodes
  them, the logits of a forward pass (eval mode, f32, CPU), greedy
  `generate` (64 new tokens, no end-of-text stop), and a left-padded batch
  with an attention mask (its logits at the last position and its greedy
  continuation).

    pip install torch transformers tokenizers safetensors
    python tests/nn/gpt2_fixture.py        # from the repository root
"""
import json
import os

import numpy as np
import tokenizers
import torch
import transformers
from tokenizers import ByteLevelBPETokenizer
from transformers import GPT2Config, GPT2LMHeadModel

SEED = 34
OUT = "tests/fixtures/gpt2-tiny"
REFERENCE = "tests/nn/gpt2_reference.rs"
NEW_TOKENS = 64

# Training text for the tokenizer (written for this fixture).
TEXT = """\
A kiln is an oven that turns clay into ceramic. The potter loads the kiln,
closes the door and raises the heat slowly, so that water leaves the clay
before it can boil. At the top of the firing the glaze melts and flows; then
the kiln cools for a day, and nobody opens the door too early.
Wood kilns need a crew that stokes the fire all night. Gas kilns are easier,
and electric kilns are the easiest of all: a controller follows a schedule
of ramps and holds, and the potter sleeps.
The graph is recorded first and run later. Nothing runs until a value is
read; then the passes rewrite the graph, fuse the small operations and plan
the memory, and the backend runs the plan on the processor or on the card.
Attention compares every query with every key, weighs the values, and adds
them up. A causal mask hides the future, so a token sees only the tokens
before it. The model predicts the next token, then the next, one at a time.
Temperature makes the choice bolder or safer. Top-k keeps the k most likely
tokens; top-p keeps the smallest set whose probability reaches p.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 12 16 32 64 128 256 512 1024 2048.
Punctuation, quotes "like these", parentheses (and brackets [too]), a colon:
a semicolon; a question? an exclamation! and an ellipsis...
"""

PROMPTS = [
    "The kiln cools",
    "A token sees only the tokens before it, and the model",
    "Héllo wörld: ünïcode ✓ and   spaces\tand\nnewlines",
    "Top-k keeps<|endoftext|>the potter sleeps",
]
# Prompts whose logits and greedy continuations are references.
FORWARD = [0, 1]
# A batch of prompts of different lengths, left-padded.
BATCH = ["The kiln", "Attention compares every query with every key", "A causal mask hides"]


def f32_text(values):
    """numpy's shortest text that reads back as the same f32, 8 a line."""
    vals = [np.format_float_positional(np.float32(x), unique=True, trim="0") for x in values]
    return "\n".join("    " + ", ".join(vals[i:i + 8]) + "," for i in range(0, len(vals), 8))


def ints_text(values):
    vals = [str(int(v)) for v in values]
    return "\n".join("    " + ", ".join(vals[i:i + 16]) + "," for i in range(0, len(vals), 16))


def rust_string(s):
    """A Rust string literal for `s` (escapes as Rust spells them)."""
    out = []
    for ch in s:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) > 0x7e:
            out.append("\\u{%x}" % ord(ch))
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(SEED)

    # The tokenizer: GPT-2's byte-level BPE, trained here.
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        [TEXT], vocab_size=500, min_frequency=1, special_tokens=["<|endoftext|>"], show_progress=False
    )
    bpe.save(os.path.join(OUT, "tokenizer.json"))
    tok = tokenizers.Tokenizer.from_file(os.path.join(OUT, "tokenizer.json"))
    eot = tok.token_to_id("<|endoftext|>")
    vocab = tok.get_vocab_size()

    # The model: random weights at ten times GPT-2's initial scale.
    config = GPT2Config(
        vocab_size=vocab,
        n_positions=128,
        n_embd=64,
        n_layer=2,
        n_head=4,
        bos_token_id=eot,
        eos_token_id=eot,
        activation_function="gelu_new",
    )
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln_" in name and name.endswith("weight"):
                p.normal_(1.0, 0.2)
            else:
                p.normal_(0.0, 0.2)
    model.eval()
    model.save_pretrained(OUT, safe_serialization=True)
    # No end-of-text stop in the references: exactly NEW_TOKENS tokens.
    gen = dict(do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=None, pad_token_id=eot)

    ids = [tok.encode(p).ids for p in PROMPTS]
    for p, i in zip(PROMPTS, ids):
        assert tok.decode(i, skip_special_tokens=False) == p, (p, tok.decode(i))
    logits, greedy = [], []
    with torch.no_grad():
        for k in FORWARD:
            x = torch.tensor([ids[k]])
            logits.append(model(x).logits[0].float().numpy())
            out = model.generate(x, attention_mask=torch.ones_like(x), **gen)
            assert out.shape[1] == x.shape[1] + NEW_TOKENS, out.shape
            greedy.append(out[0, x.shape[1]:].tolist())

        # The batch: left padding with end-of-text, an attention mask, and
        # positions counted over the real tokens (as `generate` counts them).
        rows = [tok.encode(p).ids for p in BATCH]
        width = max(len(r) for r in rows)
        batch_ids = torch.tensor([[eot] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
        batch_last = model(batch_ids, attention_mask=mask, position_ids=positions).logits[:, -1].numpy()
        batch_out = model.generate(batch_ids, attention_mask=mask, **gen)
        batch_greedy = batch_out[:, width:].tolist()
    decoded = tok.decode(greedy[0], skip_special_tokens=False)

    with open(REFERENCE, "w") as f:
        w = lambda s="": print(s, file=f)  # noqa: E731
        w("// @generated by tests/nn/gpt2_fixture.py from tests/fixtures/gpt2-tiny")
        w(f"// (transformers {transformers.__version__}, tokenizers {tokenizers.__version__},")
        w(f"// torch {torch.__version__}; CPU, f32, eval mode). Do not edit; rerun the script.")
        w()
        w(f"pub const VOCAB: usize = {vocab};")
        w(f"pub const END_OF_TEXT: u32 = {eot};")
        w(f"pub const NEW_TOKENS: usize = {NEW_TOKENS};")
        w()
        w("/// Prompts and their ids as the Python tokenizer encodes them.")
        w(f"pub const PROMPTS: [&str; {len(PROMPTS)}] = [")
        for p in PROMPTS:
            w("    " + rust_string(p) + ",")
        w("];")
        w(f"pub const IDS: [&[u32]; {len(ids)}] = [")
        for i in ids:
            w("    &[" + ", ".join(map(str, i)) + "],")
        w("];")
        w()
        w("/// Which prompts `LOGITS` and `GREEDY` are of.")
        w(f"pub const FORWARD: [usize; {len(FORWARD)}] = {FORWARD};")
        for n, l in enumerate(logits):
            w()
            w(f"/// Logits of prompt {FORWARD[n]}, [{l.shape[0]}, VOCAB] row-major.")
            w(f"pub static LOGITS_{n}: [f32; {l.size}] = [")
            w(f32_text(l.reshape(-1)))
            w("];")
        w()
        w("/// Greedy continuations of the `FORWARD` prompts.")
        w(f"pub const GREEDY: [[u32; NEW_TOKENS]; {len(greedy)}] = [")
        for g in greedy:
            w("    [")
            w(ints_text(g))
            w("    ],")
        w("];")
        w("/// `GREEDY[0]` decoded by the Python tokenizer.")
        w(f"pub const GREEDY_0_TEXT: &str = {rust_string(decoded)};")
        w()
        w("/// A left-padded batch (padding is END_OF_TEXT, mask 0).")
        w(f"pub const BATCH: [&str; {len(BATCH)}] = [")
        for p in BATCH:
            w("    " + rust_string(p) + ",")
        w("];")
        w(f"pub const BATCH_IDS: [[u32; {width}]; {len(rows)}] = [")
        for r in batch_ids.tolist():
            w("    [" + ", ".join(map(str, r)) + "],")
        w("];")
        w(f"pub const BATCH_MASK: [[u32; {width}]; {len(rows)}] = [")
        for r in mask.tolist():
            w("    [" + ", ".join(map(str, r)) + "],")
        w("];")
        w("/// The batch's logits at its last position, [batch, VOCAB] row-major.")
        w(f"pub static BATCH_LAST_LOGITS: [f32; {batch_last.size}] = [")
        w(f32_text(batch_last.reshape(-1)))
        w("];")
        w("/// The batch's greedy continuations.")
        w(f"pub const BATCH_GREEDY: [[u32; NEW_TOKENS]; {len(rows)}] = [")
        for g in batch_greedy:
            w("    [")
            w(ints_text(g))
            w("    ],")
        w("];")

    cfg = json.load(open(os.path.join(OUT, "config.json")))
    sizes = {n: os.path.getsize(os.path.join(OUT, n)) for n in sorted(os.listdir(OUT))}
    print(f"vocab {vocab}, end of text {eot}, activation {cfg.get('activation_function')}, files {sizes}")


if __name__ == "__main__":
    main()
