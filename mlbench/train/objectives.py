"""Training objectives: causal LM (GPT-3, Llama) and masked LM (BERT); each family chooses its own (mlbench.models).

Both compute losses from the vocabulary-parallel logits with megatron-core's tensor-parallel cross-entropy,
so they are correct under tensor parallelism without gathering the vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from megatron.core import parallel_state, tensor_parallel

from mlbench.train.data.bert_records import split_rows
from mlbench.train.data.source import PAD

Batch = dict[str, torch.Tensor]


def _tp_argmax(logits: torch.Tensor) -> torch.Tensor:
    """Argmax over a vocabulary split across the tensor-parallel group."""
    tp = parallel_state.get_tensor_model_parallel_world_size()
    val, idx = logits.max(dim=-1)
    if tp == 1:
        return idx
    rank = parallel_state.get_tensor_model_parallel_rank()
    idx = idx + rank * logits.shape[-1]
    group = parallel_state.get_tensor_model_parallel_group()
    vals = [torch.empty_like(val) for _ in range(tp)]
    idxs = [torch.empty_like(idx) for _ in range(tp)]
    torch.distributed.all_gather(vals, val.contiguous(), group=group)
    torch.distributed.all_gather(idxs, idx.contiguous(), group=group)
    best = torch.stack(vals).argmax(dim=0, keepdim=True)
    return torch.stack(idxs).gather(0, best).squeeze(0)


def _without_padding(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The logits with the padded vocabulary's columns (ids >= vocab_size, on the last tensor-parallel ranks)
    at -inf: no probability, never the argmax, and no gradient to the padding rows."""
    part = logits.shape[-1]
    start = parallel_state.get_tensor_model_parallel_rank() * part
    if start + part <= vocab_size:
        return logits
    return logits.masked_fill(torch.arange(start, start + part, device=logits.device) >= vocab_size, float("-inf"))


def _loss(mask: torch.Tensor, labels: torch.Tensor, want_correct: bool, output_vocab: int | None,
          logits: torch.Tensor):
    if output_vocab is not None:
        logits = _without_padding(logits, output_vocab)
    per_token = tensor_parallel.vocab_parallel_cross_entropy(logits.float().contiguous(), labels)
    mask = mask.float()
    loss_sum = (per_token * mask).sum()
    n = mask.sum().to(torch.int)
    # clone: the pipeline schedule divides the returned loss in place by tokens and micro-batches
    stats = {"loss_sum": loss_sum.detach().clone(), "tokens": mask.sum()}
    if want_correct:
        with torch.no_grad():
            stats["correct"] = ((_tp_argmax(logits) == labels).float() * mask).sum()
    return loss_sum, n, stats


@dataclass
class CausalLM:
    """Next-token prediction; the eval metric is log perplexity (mean cross-entropy in nats)."""

    output_vocab: int | None = None  # set: the padded vocabulary is left out of the loss (model.mask_padded_vocab)
    metric = "log_perplexity"

    def make_batch(self, tokens: np.ndarray, rng: np.random.Generator) -> Batch:
        t = torch.from_numpy(tokens)
        seq = t.shape[1] - 1
        labels = t[:, 1:]
        return {
            "tokens": t[:, :-1].clamp(min=0),  # PAD (-1): any id, its label never scored
            "labels": labels.clamp(min=0),
            "loss_mask": (labels != PAD).float(),
            "position_ids": torch.arange(seq).unsqueeze(0).expand(t.shape[0], seq).contiguous(),
        }

    def skip(self, rng: np.random.Generator, rows: int, row_width: int) -> None:
        """Draws nothing: make_batch draws nothing."""

    def weigh(self, batches: list[Batch], samples: int, total: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Nothing to weigh: every scored token weighs the same (the per-token loss, model/config.py)."""

    def forward(self, model: torch.nn.Module, b: Batch, eval_mode: bool):
        logits = model(b["tokens"], b["position_ids"], None)
        return logits, partial(_loss, b["loss_mask"], b["labels"], False, self.output_vocab)

    def value(self, totals: dict[str, float]) -> float:
        return totals["loss_sum"] / max(totals["tokens"], 1.0)


@dataclass
class MaskedLM:
    """BERT's masked-LM objective; the eval metric is masked-token accuracy."""

    vocab_size: int
    mask_prob: float
    num_tokentypes: int = 0  # a model with segment embeddings gets one segment (type 0) per sample
    output_vocab: int | None = None  # set: the padded vocabulary is left out of the loss (model.mask_padded_vocab)
    metric = "masked_lm_accuracy"

    @property
    def mask_id(self) -> int:
        return self.vocab_size  # one id past the source's vocabulary: never a real token

    def make_batch(self, tokens: np.ndarray, rng: np.random.Generator) -> Batch:
        t = torch.from_numpy(tokens[:, :-1].copy())
        masked = torch.from_numpy(rng.random(t.shape) < self.mask_prob)
        inputs = torch.where(masked, torch.full_like(t, self.mask_id), t)
        batch = {
            "tokens": inputs,
            "labels": t,
            "loss_mask": masked.float(),
            "attention_mask": torch.ones(t.shape, dtype=torch.bool),
        }
        if self.num_tokentypes:
            batch["tokentype_ids"] = torch.zeros_like(t)
        return batch

    def skip(self, rng: np.random.Generator, rows: int, row_width: int) -> None:
        """Draws from RNG what make_batch draws for ROWS rows of ROW_WIDTH tokens: the batch's rows before a
        data-parallel rank's own, so each row gets the mask it gets on one rank (rank 1 of 2 masked its rows as
        rank 0 masked its own, and the eval set's masks, so its metric, changed with the layout)."""
        rng.random((rows, row_width - 1))

    def weigh(self, batches: list[Batch], samples: int, total: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Nothing to weigh: every scored token weighs the same (the per-token loss, model/config.py)."""

    def forward(self, model: torch.nn.Module, b: Batch, eval_mode: bool):
        out = model(b["tokens"], b["attention_mask"], tokentype_ids=b.get("tokentype_ids"))
        logits = out[0] if isinstance(out, tuple) else out
        return logits, partial(_loss, b["loss_mask"], b["labels"], eval_mode, self.output_vocab)

    def value(self, totals: dict[str, float]) -> float:
        return totals["correct"] / max(totals["tokens"], 1.0)


@dataclass
class PreMaskedLM:
    """BERT's objective on the reference's pre-masked samples (mlbench/train/data/bert_records.py): masked LM over the
    positions with weight 1, plus next-sentence prediction when the model has the binary head, as the reference
    adds them (run_pretraining.py: mean masked-LM loss + mean next-sentence loss). The eval metric is the
    reference's masked_lm_accuracy: argmax equal to the masked id, weighted by masked_lm_weights."""

    seq_length: int
    predictions: int
    output_vocab: int | None = None  # set: the padded vocabulary is left out of the loss (model.mask_padded_vocab)
    metric = "masked_lm_accuracy"

    def make_batch(self, rows: np.ndarray, rng: np.random.Generator) -> Batch:
        f = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in
             split_rows(rows, self.seq_length, self.predictions).items()}
        weights = f["masked_lm_weights"].float()
        labels = torch.zeros_like(f["input_ids"])
        loss_mask = torch.zeros(labels.shape)
        # Only the real predictions: the padding ones (weight 0) point at position 0, which may be a real one.
        row, j = torch.nonzero(weights > 0, as_tuple=True)
        pos = f["masked_lm_positions"][row, j]
        labels[row, pos] = f["masked_lm_ids"][row, j]
        loss_mask[row, pos] = weights[row, j]
        return {"tokens": f["input_ids"], "labels": labels, "loss_mask": loss_mask,
                "attention_mask": f["input_mask"].bool(), "tokentype_ids": f["segment_ids"],
                "next_sentence_labels": f["next_sentence_labels"][:, 0]}

    def skip(self, rng: np.random.Generator, rows: int, row_width: int) -> None:
        """Draws nothing: the samples come masked."""

    def weigh(self, batches: list[Batch], samples: int, total: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Gives each of this rank's training micro-batches the step's masked tokens per sample ("nsp_scale"), so
        the next-sentence loss is the mean over the step's SAMPLES samples, as the reference adds it, while megatron
        divides the summed loss by the step's masked tokens (model/config.py); TOTAL sums over the data-parallel
        ranks. A micro-batch's own count (megatron's per micro-batch mean) weighed its samples by how many tokens
        it masked, so the loss changed with the micro-batch size."""
        tokens = total(sum(b["loss_mask"].sum() for b in batches).to(torch.float64))
        scale = (tokens / samples).float().cpu()
        for b in batches:
            b["nsp_scale"] = scale

    def forward(self, model: torch.nn.Module, b: Batch, eval_mode: bool):
        # The last pipeline stage returns (logits, next-sentence logits or None); earlier stages a hidden state.
        out = model(b["tokens"], b["attention_mask"], tokentype_ids=b["tokentype_ids"])
        # An eval step trains nothing: its next-sentence loss is left out of what it reports either way.
        return out, partial(_pre_masked_loss, b["loss_mask"], b["labels"], b["next_sentence_labels"],
                            b.get("nsp_scale", 1.0), eval_mode, self.output_vocab)

    def value(self, totals: dict[str, float]) -> float:
        return totals["correct"] / max(totals["tokens"], 1.0)


def _pre_masked_loss(mask, labels, nsp_labels, nsp_scale, want_correct: bool, output_vocab: int | None, outputs):
    logits, binary = outputs
    loss_sum, n, stats = _loss(mask, labels, want_correct, output_vocab, logits)
    if binary is not None:
        # megatron divides the step's summed loss by its masked tokens N: the next-sentence losses summed and
        # scaled by N / samples keep the reference's sum of the two means over the step (PreMaskedLM.weigh).
        nsp = torch.nn.functional.cross_entropy(binary.float(), nsp_labels, reduction="sum")
        loss_sum = loss_sum + nsp * nsp_scale
    return loss_sum, n, stats
