"""BERT checkpoints in the PyTorch layout of the MLPerf reference's conversions -> megatron-core `torch_dist`.

The MLPerf BERT run starts from the phase-1 checkpoint model.ckpt-28252, published as TensorFlow. Its PyTorch
form is what NVIDIA's `convert_tf_checkpoint.py` (named in the reference README) or Hugging Face's BERT
converter writes: a state dict with names like `bert.encoder.layer.0.attention.self.query.weight`, saved bare
or under "model". This maps it onto the post-LN megatron-core BertModel the benchmark file describes (query,
key and value fused head by head as megatron-core lays them out; the vocabulary padded with zero rows) and
saves a model-only `torch_dist` checkpoint that `mlbench run --init-checkpoint` loads in any layout.

`python -m mlbench.train.checkpoint.convert_bert BENCHMARK.json SRC DEST` (run by `mlbench convert-checkpoint`);
prints one JSON line; exits 2 with the reason on stderr when SRC does not fit the model.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from mlbench import owners
from mlbench.run_plan import benchmark_from_dict
from mlbench.spec import Benchmark, ModelSpec
from mlbench.train import checkpoint, one_process_world
from mlbench.train.checkpoint.folder import load_error, partial_prefix

CheckpointError = checkpoint.CheckpointError


def reference_state(src: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a PyTorch BERT checkpoint, with the `bert.`-style names (TF's gamma / beta renamed)."""
    try:
        obj = torch.load(src, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same one-line answer
        raise CheckpointError(f"not a PyTorch checkpoint torch.load can read as weights ({load_error(e)})") from None
    sd = obj.get("model", obj) if isinstance(obj, dict) else None
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError("expected a state dict of tensors (bare or under 'model')")
    out = {}
    for k, v in sd.items():
        if not isinstance(k, str):  # ('int' object has no attribute 'removeprefix')
            raise CheckpointError(f"key {k!r} is not a tensor's name; a state dict is keyed by names")
        # a sparse or meta tensor, or a 0-d one, came out of the conversion as a traceback, exit 1
        if v.layout != torch.strided or v.is_meta:
            kind = "a meta tensor, with no values" if v.is_meta else f"a {str(v.layout).removeprefix('torch.')} tensor"
            raise CheckpointError(f"{k} is {kind}; a weight is a dense tensor of values")
        if v.dim() == 0:
            raise CheckpointError(f"{k} is a single number; a weight has at least one dimension")
        k = k.removeprefix("module.")
        k = k if k.startswith(("bert.", "cls.")) else f"bert.{k}"  # a bare BertModel's names
        out[k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")] = v
    return out


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: ModelSpec, prefix: str,
              kind: str) -> torch.Tensor:
    """megatron-core's linear_qkv rows: for each query group, its query heads, then its key, then its value. KIND:
    'weight' or 'bias', which says the shape each must have (the query's own shape said it, and a query of the
    wrong shape was reported as the key's)."""
    groups = m.num_query_groups or m.num_attention_heads
    kv = m.kv_channels or m.hidden_size // m.num_attention_heads
    cols = (m.hidden_size,) if kind == "weight" else ()
    for t, rows, what in ((q, m.num_attention_heads * kv, "query"), (k, groups * kv, "key"), (v, groups * kv, "value")):
        if tuple(t.shape) != (rows, *cols):
            raise CheckpointError(f"{prefix}{what}.{kind}: shape {list(t.shape)}, this model needs {[rows, *cols]} "
                                  f"(a different architecture)")
    parts = [q.reshape(groups, -1, *cols), k.reshape(groups, kv, *cols), v.reshape(groups, kv, *cols)]
    return torch.cat(parts, dim=1).reshape(-1, *cols)


def to_megatron(ref: dict[str, torch.Tensor], m: ModelSpec, vocab_rows: int) -> dict[str, torch.Tensor]:
    """megatron-core names and layouts for the post-LN BertModel `m` describes; raises CheckpointError naming
    the missing tensors. The word embeddings and MLM bias are zero-padded to `vocab_rows`."""
    if m.family != "bert" or m.norm_position != "post":
        raise CheckpointError("only a post-LN BERT (family bert, norm_position post) takes this conversion")
    ref = dict(ref)
    missing: list[str] = []

    def take(name: str) -> torch.Tensor | None:
        if name not in ref:
            missing.append(name)
            return None
        t = ref.pop(name)
        # Copied into float parameters as they are: an int or bool tensor would be rounded into weights, a
        # complex one lose its imaginary part, a NaN train 600 steps of NaN loss
        if not t.is_floating_point():
            raise CheckpointError(f"{name} is {str(t.dtype).removeprefix('torch.')}; a weight is floating point")
        if not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{name} holds NaN or infinite values; a weight is a finite number")
        return t

    def pad(t: torch.Tensor | None, name: str, value: float = 0.0) -> torch.Tensor | None:
        """T, a row a token of the reference's vocabulary, with padding rows up to VOCAB_ROWS: a checkpoint of
        another vocabulary (5 rows, say) was padded up and converted, its missing tokens never predicted."""
        if t is None:
            return None
        if t.shape[0] != m.vocab_size:
            raise CheckpointError(f"{name}: {t.shape[0]:,} rows, this model's vocabulary has {m.vocab_size:,} tokens "
                                  f"(another vocabulary)")
        extra = vocab_rows - t.shape[0]
        return torch.cat([t, t.new_full((extra, *t.shape[1:]), value)]) if extra > 0 else t

    out: dict[str, torch.Tensor] = {}
    e = "bert.embeddings."
    out["embedding.word_embeddings.weight"] = pad(take(e + "word_embeddings.weight"), e + "word_embeddings.weight")
    if m.position_embedding == "learned_absolute":
        out["embedding.position_embeddings.weight"] = take(e + "position_embeddings.weight")
    if m.num_tokentypes:
        out["embedding.tokentype_embeddings.weight"] = take(e + "token_type_embeddings.weight")
    for p in ("weight", "bias"):
        out[f"embedding.embedding_dropout.layer_norm.{p}"] = take(f"{e}LayerNorm.{p}")
    for i in range(m.num_layers):
        r, t = f"bert.encoder.layer.{i}.", f"encoder.layers.{i}."
        for p in ("weight", "bias"):
            q, k, v = (take(f"{r}attention.self.{n}.{p}") for n in ("query", "key", "value"))
            if q is not None and k is not None and v is not None:
                out[f"{t}self_attention.linear_qkv.{p}"] = _fuse_qkv(q, k, v, m, f"{r}attention.self.", p)
            out[f"{t}self_attention.linear_proj.{p}"] = take(f"{r}attention.output.dense.{p}")
            out[f"{t}self_attn_bda.norm.{p}"] = take(f"{r}attention.output.LayerNorm.{p}")
            out[f"{t}mlp.linear_fc1.{p}"] = take(f"{r}intermediate.dense.{p}")
            out[f"{t}mlp.linear_fc2.{p}"] = take(f"{r}output.dense.{p}")
            out[f"{t}mlp_bda.norm.{p}"] = take(f"{r}output.LayerNorm.{p}")
    for p in ("weight", "bias"):
        out[f"lm_head.dense.{p}"] = take(f"cls.predictions.transform.dense.{p}")
        out[f"lm_head.layer_norm.{p}"] = take(f"cls.predictions.transform.LayerNorm.{p}")
        if m.add_binary_head:
            out[f"pooler.dense.{p}"] = take(f"bert.pooler.dense.{p}")
            out[f"binary_head.{p}"] = take(f"cls.seq_relationship.{p}")
    # Hugging Face ties cls.predictions.decoder.bias to cls.predictions.bias and saves both.
    bias = ref.pop("cls.predictions.decoder.bias", None)
    if "cls.predictions.bias" not in ref and bias is not None:
        ref["cls.predictions.bias"] = bias
    # Padding rows the reference does not have: zero embeddings and a -10000 bias keep their logits out of the
    # softmax and the argmax, so the converted model predicts exactly as the reference (the bias gets no
    # gradient there, and no weight decay: it is 1-D).
    out["output_layer.bias"] = pad(take("cls.predictions.bias"), "cls.predictions.bias", -10000.0)
    if m.untie_embeddings:
        out["output_layer.weight"] = pad(take("cls.predictions.decoder.weight"), "cls.predictions.decoder.weight")
    else:
        ref.pop("cls.predictions.decoder.weight", None)  # the tied copy of the word embeddings
    if missing:
        raise CheckpointError(f"{len(missing)} tensors this model needs are not in the checkpoint, e.g. "
                              f"{', '.join(missing[:3])}")
    ref.pop("bert.embeddings.position_ids", None)  # a buffer, not a weight
    if ref:
        raise CheckpointError(f"{len(ref)} tensors in the checkpoint have no place in this model, e.g. "
                              f"{', '.join(sorted(ref)[:3])} (a different architecture?)")
    return out


def convert(bench: Benchmark, src: str | Path, dest: str | Path) -> dict:
    start = time.perf_counter()
    m = bench.model
    try:
        state, model = _converted(m, src)
    except CheckpointError as e:  # what SRC holds (a save's errors name DEST themselves)
        raise CheckpointError(f"{src}: {e}") from None
    save(dest, model, {"converted_from": str(src), "benchmark": bench.name})
    return {"tensors": len(state), "parameters": sum(v.numel() for v in state.values()),
            "seconds": round(time.perf_counter() - start, 2), "path": str(dest)}


def _converted(m: ModelSpec, src: str | Path) -> tuple[dict[str, torch.Tensor], torch.nn.Module]:
    """SRC's tensors in megatron-core's names, loaded into the model M describes."""
    ref = reference_state(src)
    one_process_world.init()  # first: megatron-core imported after it skips compiling its fused kernels
    from mlbench.train import model as model_lib

    config = model_lib.transformer_config(m, tp=1, pp=1, vp=1, cp=1, bf16=False)
    config.perform_initialization = False  # every weight is overwritten
    model = model_lib.build(m, config, backend="local")
    state = to_megatron(ref, m, model_lib.padded_vocab(m, tp=1))
    own = model.state_dict()
    wrong = [k for k, v in state.items() if k in own and own[k].shape != v.shape]
    if wrong:
        raise CheckpointError(f"{len(wrong)} tensors differ in shape from the model, e.g. {wrong[0]}: checkpoint "
                              f"{list(state[wrong[0]].shape)}, model {list(own[wrong[0]].shape)}")
    result = model.load_state_dict(state, strict=False)
    off = [k for k in result.missing_keys + result.unexpected_keys if not k.endswith("_extra_state")]
    if off:
        raise CheckpointError(f"converted names do not fit the model: {off[:3]}")
    return state, model


class SaveFailed(Exception):
    """The converted checkpoint could not be written (a full disk, say); nothing of it was left."""


def save(dest: str | Path, model, info: dict) -> None:
    """Saves MODEL to DEST (checkpoint.save); where that fails (a full disk fails inside torch's writer with 'unexpected
    pos 704 vs 598'), its staging folder `.NAME.partial-<this process>` is removed, and SaveFailed says why, with the
    room left on the disk."""
    from mlbench.errors import disk_free
    from mlbench.train.loop import failure_reason

    dest = Path(dest)
    try:
        checkpoint.save(dest, [SimpleNamespace(module=model)], None, info, what="DEST")
    except CheckpointError:
        raise
    except BaseException as e:  # torch's CheckpointException is no Exception: whatever it was, the partial save goes
        shutil.rmtree(dest.with_name(f"{partial_prefix(dest)}{owners.tag()}"), ignore_errors=True)
        if isinstance(e, KeyboardInterrupt | SystemExit):
            raise
        free = f" ({free})" if (free := disk_free(dest)) else ""
        raise SaveFailed(f"{dest} not saved: {failure_reason(e)}{free}; nothing of it was left") from None


def main(argv: list[str]) -> int:
    try:
        bench = benchmark_from_dict(json.loads(Path(argv[0]).read_text()))
        print(json.dumps(convert(bench, argv[1], argv[2])))
    except CheckpointError as e:
        print(str(e), file=sys.stderr)
        return 2
    except SaveFailed as e:  # not bad input: exit 1, its one line
        print(str(e), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
