"""The MLPerf BERT reference model (mlcommons/training retired_benchmarks/bert/modeling.py, TF) written out in plain
PyTorch, independent of megatron-core, with the parameter names of its PyTorch conversions (NVIDIA's
convert_tf_checkpoint.py, Hugging Face BertForPreTraining): the yardstick the megatron-core BERT is checked
against. Post-LN, tanh GeLU, embedding LayerNorm, pooler on the first token, MLM head tied to the word
embeddings with its own bias, next-sentence head."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def gelu(x: torch.Tensor) -> torch.Tensor:  # modeling.py gelu(): the tanh approximation
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x.pow(3))))


class Layer(nn.Module):
    def __init__(self, h: int, heads: int, ffn: int, eps: float) -> None:
        super().__init__()
        self.heads = heads
        self.attention = nn.Module()
        self.attention.self = nn.Module()
        self.attention.self.query, self.attention.self.key, self.attention.self.value = (
            nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h))
        self.attention.output = nn.Module()
        self.attention.output.dense = nn.Linear(h, h)
        self.attention.output.LayerNorm = nn.LayerNorm(h, eps=eps)
        self.intermediate = nn.Module()
        self.intermediate.dense = nn.Linear(h, ffn)
        self.output = nn.Module()
        self.output.dense = nn.Linear(ffn, h)
        self.output.LayerNorm = nn.LayerNorm(h, eps=eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        a = self.attention.self

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, self.heads, h // self.heads).transpose(1, 2)

        scores = split(a.query(x)) @ split(a.key(x)).transpose(-1, -2) / math.sqrt(h // self.heads)
        scores = scores + (1.0 - mask[:, None, None, :].float()) * -10000.0  # modeling.py's additive mask
        ctx = (scores.softmax(-1) @ split(a.value(x))).transpose(1, 2).reshape(b, s, h)
        x = self.attention.output.LayerNorm(x + self.attention.output.dense(ctx))
        return self.output.LayerNorm(x + self.output.dense(gelu(self.intermediate.dense(x))))


class BertForPreTraining(nn.Module):
    def __init__(self, vocab: int, h: int, layers: int, heads: int, ffn: int, max_pos: int, types: int,
                 eps: float = 1e-12) -> None:
        super().__init__()
        self.bert = nn.Module()
        e = self.bert.embeddings = nn.Module()
        e.word_embeddings = nn.Embedding(vocab, h)
        e.position_embeddings = nn.Embedding(max_pos, h)
        e.token_type_embeddings = nn.Embedding(types, h)
        e.LayerNorm = nn.LayerNorm(h, eps=eps)
        self.bert.encoder = nn.Module()
        self.bert.encoder.layer = nn.ModuleList(Layer(h, heads, ffn, eps) for _ in range(layers))
        self.bert.pooler = nn.Module()
        self.bert.pooler.dense = nn.Linear(h, h)
        self.cls = nn.Module()
        self.cls.predictions = nn.Module()
        self.cls.predictions.transform = nn.Module()
        self.cls.predictions.transform.dense = nn.Linear(h, h)
        self.cls.predictions.transform.LayerNorm = nn.LayerNorm(h, eps=eps)
        self.cls.predictions.bias = nn.Parameter(torch.zeros(vocab))
        self.cls.seq_relationship = nn.Linear(h, 2)
        for p in self.parameters():  # non-trivial values everywhere, LayerNorms included
            nn.init.normal_(p, mean=1.0 if p.dim() == 1 and p.shape[0] == h else 0.0, std=0.05)

    def forward(self, ids: torch.Tensor, types: torch.Tensor, mask: torch.Tensor):
        e = self.bert.embeddings
        pos = torch.arange(ids.shape[1])
        x = e.LayerNorm(e.word_embeddings(ids) + e.token_type_embeddings(types) + e.position_embeddings(pos))
        for layer in self.bert.encoder.layer:
            x = layer(x, mask)
        t = self.cls.predictions.transform
        mlm = F.linear(t.LayerNorm(gelu(t.dense(x))), e.word_embeddings.weight, self.cls.predictions.bias)
        nsp = self.cls.seq_relationship(torch.tanh(self.bert.pooler.dense(x[:, 0])))
        return mlm, nsp
