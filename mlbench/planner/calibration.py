"""Published runs as planner inputs: each row of published-runs.csv with a full layout and a step time becomes
(model, layout, device, measured step time[, measured time-to-train]).

Rows are used when the source states the parallel layout and a step time, or a figure the step time follows
from exactly (tokens/s; Megatron-LM 2021 TFLOP/s in its own stated FLOP formula). The models are the MLPerf
benchmarks' own definitions, or their shapes changed to the row's model (Llama 3 8B/70B from Meta's configs;
Megatron-LM's GPT family: hidden, layers from the row, 4h MLP, 51,200 vocabulary, 2,048 tokens). Features
follow each source's stated setup (the `FEATURES` below).
"""

from __future__ import annotations

import csv
import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from mlbench import registry
from mlbench.layout import Layout
from mlbench.planner import devices
from mlbench.spec import FeaturesSpec, ModelSpec

# NeMo / Megatron-Bridge recipes as NVIDIA's MLPerf configs and performance summaries run them: distributed
# optimizer with gradients reduced in bf16, sequence parallel, communication overlapped, no recompute.
MODERN = FeaturesSpec(distributed_optimizer=True, sequence_parallel=True, overlap_grad_reduce=True,
                      overlap_param_gather=True, grad_reduce_in_fp32=False)


@dataclass(frozen=True)
class Features2021(FeaturesSpec):
    """Megatron-LM 2021's features: megatron-core's, plus the pipeline's scatter/gather (Narayanan et al. 2021,
    sec. 5.1: "we use the interleaved pipeline schedule with the scatter/gather optimization enabled"): each
    tensor-parallel rank sends 1/tp of the activations to the next stage, the rest all-gathered over NVLink there
    (DeepSpeed's pipeline engine, MT-NLG's, partitions them likewise: `pipe_partitioned`). megatron-core has no
    such option: without sequence parallelism every rank sends the whole tensor."""

    pipeline_scatter_gather: bool = True


# Megatron-LM 2021 (Narayanan et al.; MT-NLG's DeepSpeed-Megatron): full activation recompute, gradients
# all-reduced after the backward pass, no sequence parallelism, the pipeline's scatter/gather.
MEGATRON_2021 = Features2021(recompute="full")


@dataclass(frozen=True)
class Row:
    index: int  # 0-based row of published-runs.csv
    label: str
    model: ModelSpec
    layout: Layout
    device: str
    step_time_s: float
    time_to_train_min: float | None
    benchmark: str | None  # the mlbench benchmark, for MLPerf rows
    source: str = ""  # the row's `source` column


def _device(gpu_type: str) -> str:
    for frag, name in (("GB300", "gb300"), ("GB200", "gb200"), ("B200", "b200"), ("H200", "h200"), ("H100", "h100"),
                       ("A100", "a100")):
        if frag in gpu_type:
            return name
    raise ValueError(f"no device for {gpu_type!r}")


def _precision(text: str) -> str:
    return "nvfp4" if "nvfp4" in text else "fp8" if "fp8" in text else "bf16"


def _llama(base: ModelSpec, seq: int, name: str) -> ModelSpec:
    shapes = {  # Meta's Llama 3 / 3.1 configs (config.json on Hugging Face), vocabulary 128,256
        "Llama 3 8B": dict(num_layers=32, hidden_size=4096, num_attention_heads=32, num_query_groups=8,
                           ffn_hidden_size=14336),
        "Llama 3 70B": dict(num_layers=80, hidden_size=8192, num_attention_heads=64, num_query_groups=8,
                            ffn_hidden_size=28672),
        "Llama 3.1 405B": {},
    }[name]
    return dataclasses.replace(base, vocab_size=128256, seq_length=seq, **shapes)


def _gpt(base: ModelSpec, hidden: int, layers: int, seq: int) -> ModelSpec:
    return dataclasses.replace(base, hidden_size=hidden, num_layers=layers, num_attention_heads=hidden // 128,
                               num_query_groups=None, ffn_hidden_size=4 * hidden, vocab_size=51200, seq_length=seq)


def _megatron_2021_step(m: ModelSpec, gbs: int, gpus: int, tflops: float) -> float:
    """Megatron-LM 2021's stated FLOPs per step (recompute counted): 96 B s l h^2 (1 + s/6h + V/16lh)."""
    b, s, ly, h, v = gbs, m.seq_length, m.num_layers, m.hidden_size, m.vocab_size
    return 96 * b * s * ly * h * h * (1 + s / (6 * h) + v / (16 * ly * h)) / (tflops * 1e12 * gpus)


def load(path: Path) -> list[Row]:
    gpt3, llama = (registry.load(n, directory=registry.SHIPPED_DIR).model for n in ("gpt3", "llama31_405b"))
    rows = []
    for i, r in enumerate(csv.DictReader(path.open())):
        model_name, gpus = r["model"], int(r["num_gpus"])
        if not (r["tp"] and r["pp"] and r["global_batch"]):
            continue
        tp, pp, gbs = int(r["tp"]), int(r["pp"]), int(r["global_batch"])
        cp, vp, mbs = int(r["cp"] or 1), int(r["vp"] or 1), int(r["micro_batch"] or 1)
        seq = int(r["seq_len"] or 2048)
        bench = None
        features = MODERN
        if "MLPerf gpt3" in model_name:
            m, bench = gpt3, "gpt3"
        elif "MLPerf llama31_405b" in model_name:
            m, bench = llama, "llama31_405b"
        elif "Megatron-Bridge" in r["source"] and model_name in ("Llama 3 8B", "Llama 3 70B", "Llama 3.1 405B"):
            m = _llama(llama, seq, model_name)
        elif (g := re.match(r"GPT ([\d.]+)B \(hidden (\d+), (\d+) la", model_name)) and "A100" in r["gpu_type"]:
            m, features = _gpt(gpt3, int(g.group(2)), int(g.group(3)), seq), MEGATRON_2021
        elif model_name == "GPT-3 175B" and "A100" in r["gpu_type"]:
            m, features = _gpt(gpt3, 12288, 96, seq), MEGATRON_2021
        elif model_name == "MT-NLG 530B":
            m, features = _gpt(gpt3, 20480, 105, seq), dataclasses.replace(MEGATRON_2021, distributed_optimizer=True)
        else:
            continue
        if r["step_time_s"]:
            step = float(r["step_time_s"])
        elif r["tokens_per_sec"]:
            step = gbs * seq / float(r["tokens_per_sec"])
        elif r["tflops_per_gpu"] and features is MEGATRON_2021:
            step = _megatron_2021_step(m, gbs, gpus, float(r["tflops_per_gpu"]))
        else:
            continue
        world = tp * pp * cp
        dp = gpus // world
        per_node = 4 if _device(r["gpu_type"]) in ("gb200", "gb300") else 8
        layout = Layout(nodes=gpus // per_node, nproc_per_node=per_node, tp=tp, pp=pp, vp=vp, cp=cp, dp=dp,
                        micro_batch_size=mbs, global_batch_size=gbs, source=f"published-runs.csv row {i}",
                        features=features, precision=_precision(r["precision"]))
        label = f"{model_name.split(' (')[0]} {r['gpu_type'].split(' (')[0]} x{gpus} {layout.precision} gbs{gbs}"
        ttt = float(r["time_to_train_min"]) if r["time_to_train_min"] else None
        rows.append(Row(index=i, label=label, model=m, layout=layout, device=_device(r["gpu_type"]),
                        step_time_s=step, time_to_train_min=ttt, benchmark=bench, source=r["source"]))
    return rows


def device(row: Row) -> devices.Device:
    return devices.get(row.device)
