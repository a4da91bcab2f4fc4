"""Everything a run builds before run_start (MLPerf's untimed initialisation), from the run plan: the process
groups, the model chunks wrapped in megatron-core's DistributedDataParallel, the optimizer and its schedule,
the starting checkpoint, the objective and the token source."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from mlbench import rcp_schedule
from mlbench.launch.ports import STORE
from mlbench.models import family
from mlbench.run_plan import RunPlan
from mlbench.spec import evaluate, resolved
from mlbench.train import cpu_compat


@dataclass
class Device:
    on_cpu: bool
    precision: str  # what the matmuls run in: fp32 on CPU, the layout's precision on a GPU
    info: dict  # the record's environment.device: type, name, per_node, precision, attention


def _digest(value: object) -> int:
    return int.from_bytes(hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).digest()[:7], "big")


# What may differ from node to node: how the layout was chosen, and where a node finds the files (its benchmark
# file, its mount of the data); the rest of the definition is what every rank trains.
_OWN = {"path", "sources", "notes"}
_OWN_DATA = {"path", "eval_path", "description"}


def trained_definition(plan: RunPlan) -> dict:
    """What every rank must train alike of the plan's benchmark: its definition resolved at the run's batch (a file
    writing max_steps as '150 * 2' trains what one writing 300 does: refused as another, it was), less `_OWN`."""
    bench = resolved(plan.benchmark, plan.layout["global_batch_size"])
    bench = {k: v for k, v in bench.items() if k not in _OWN}
    bench["data"] = {k: v for k, v in bench["data"].items() if k not in _OWN_DATA}
    return bench


def _same_run_as_rank0(plan: RunPlan, dev: torch.device) -> None:
    """Every rank trains rank 0's layout and benchmark definition, the ones logged: a node started with other
    layout flags (--tp, --gbs, ...) but the same world size, or other hyperparameters (--lr, --warmup-steps, an
    edited benchmark file: node 0 published a success logging its own lr while node 1 trained at another), is
    refused on every rank at once (a flag summed over all), not left to hang."""
    layout = {k: v for k, v in plan.layout.items() if k != "source"}
    mine = torch.tensor([_digest(layout), _digest(trained_definition(plan))], dtype=torch.int64, device=dev)
    theirs = mine.clone()
    dist.broadcast(theirs, src=0)
    differs = (theirs != mine).to(torch.int64)
    dist.all_reduce(differs)
    for n, what, give in zip(differs.tolist(), ("layout", "benchmark definition (hyperparameters)"),
                             ("layout flags (and benchmark file: it sets the layout's features)",
                              "hyperparameter flags (--lr, --warmup-steps) and benchmark file"),
                             strict=True):
        if n:
            raise RuntimeError(f"{n} rank(s) were started with another {what} than rank 0's: give every node the "
                               f"same {give}")


def collectives_device(on_cpu: bool) -> torch.device:
    """Where a tensor handed to a collective must live: NCCL takes only this rank's GPU ("No backend type
    associated with device type cpu"), gloo only the CPU."""
    return torch.device("cpu") if on_cpu else torch.device("cuda", torch.cuda.current_device())


def init_process_group(backend: str, timeout: timedelta = timedelta(seconds=120)) -> None:
    """torch's default process group, from the store this rank was given: one rank, a store in this process (no
    port to bind); under mlbench's agent (ports.STORE), rank 0 serves on the listening socket the agent held for it
    and the others join it (no other process could take the port in between); otherwise torchrun's env://."""
    world, how = int(os.environ.get("WORLD_SIZE", "1")), os.environ.pop(STORE, "")
    if world == 1:
        dist.init_process_group(backend, timeout=timeout, store=dist.HashStore(), rank=0, world_size=1)
    elif how:
        fd = int(how.removeprefix("serve:")) if how.startswith("serve:") else None
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                              is_master=fd is not None, timeout=timeout, master_listen_fd=fd)
        dist.init_process_group(backend, timeout=timeout, store=store, rank=int(os.environ["RANK"]), world_size=world)
    else:
        dist.init_process_group(backend, timeout=timeout)


def init_distributed(plan: RunPlan) -> Device:
    """The process group (gloo on CPU, NCCL on GPUs), every rank on rank 0's seed, and the device it trains on."""
    on_cpu = cpu_compat.enable()
    if not on_cpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    torch.set_num_threads(max(1, int(os.environ.get("MLBENCH_THREADS", "1"))))
    world, planned = int(os.environ.get("WORLD_SIZE", "1")), plan.layout["world_size"]
    if world != planned:  # nodes started with other --nodes / --nproc-per-node: trained a world nobody logged
        ly = plan.layout
        raise RuntimeError(f"torchrun formed {world} ranks, and this node's layout is {planned} ({ly['nodes']} nodes "
                           f"x {ly['nproc_per_node']}): give every node the same layout flags")
    init_process_group("gloo" if on_cpu else "nccl")
    dev = collectives_device(on_cpu)
    _same_run_as_rank0(plan, dev)
    # Every rank uses rank 0's seed (the one logged): nodes started separately may have drawn their own.
    seed_t = torch.tensor([plan.seed], dtype=torch.int64, device=dev)
    dist.broadcast(seed_t, src=0)
    plan.seed = int(seed_t.item())

    from mlbench.train.model import attention_backend

    precision = "fp32" if on_cpu else plan.layout.get("precision", plan.benchmark.train.precision)
    info = {"type": "cpu" if on_cpu else "cuda",
            "name": (platform.processor() or platform.machine()) if on_cpu else torch.cuda.get_device_name(),
            "per_node": int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
            # what ran, so a record says whether it took the GPU path (bf16, te or sdpa attention)
            "precision": precision, "attention": attention_backend()}
    return Device(on_cpu=on_cpu, precision=precision, info=info)


@dataclass
class Parts:
    """What the loop trains with."""

    model: list  # DistributedDataParallel chunks, one per virtual pipeline stage
    optimizer: Any  # megatron-core's MegatronOptimizer (Adam(W), or LAMB inside it)
    scheduler: Any
    config: Any  # megatron-core TransformerConfig
    objective: Any  # mlbench.train.objectives: batches, forward, loss, metric
    source: Any  # mlbench.train.data.TokenSource
    loaded: dict | None  # what the starting checkpoint held, if the run started from one


def build(plan: RunPlan, device: Device) -> Parts:
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, finalize_model_grads

    from mlbench.train import checkpoint
    from mlbench.train.data import build_source
    from mlbench.train.model import build as build_chunk
    from mlbench.train.model import transformer_config
    from mlbench.train.optim import lamb, schedule

    bench, layout = plan.benchmark, plan.layout
    tp, pp, vp, cp = layout["tp"], layout["pp"], layout["vp"], layout["cp"]
    ps.initialize_model_parallel(tp, pp, vp if vp > 1 else None, context_parallel_size=cp,
                                 expert_model_parallel_size=layout.get("ep", 1))
    seed_model_init(plan.seed)

    features = layout.get("features", {})
    bf16 = device.precision in ("bf16", "fp8")
    config = transformer_config(
        bench.model, tp=tp, pp=pp, vp=vp, cp=cp, bf16=bf16, features=features,
        account_for_embedding_in_pipeline_split=layout.get("account_for_embedding_in_pipeline_split", False),
        account_for_loss_in_pipeline_split=layout.get("account_for_loss_in_pipeline_split", False),
        ep=layout.get("ep", 1), fp8=device.precision == "fp8")
    chunks = [build_chunk(bench.model, config, vp_stage=i if vp > 1 else None) for i in range(vp)]
    if not device.on_cpu:
        # As megatron-LM places a model: megatron's parallel layers are built on the GPU, but torch norms and
        # embeddings (and mlbench's post-LN norms) on the CPU, so the whole chunk is moved; bf16 through
        # megatron's Float16Module, which casts the first stage's inputs and the last stage's outputs.
        from megatron.core.transformer.module import Float16Module

        chunks = [c.cuda(torch.cuda.current_device()) for c in chunks]
        if bf16:
            chunks = [Float16Module(config, c) for c in chunks]
    model = [DistributedDataParallel(config=config, ddp_config=ddp_config(features, device.precision == "fp8"),
                                     module=c) for c in chunks]
    optimizer = lamb.megatron_optimizer(optimizer_config(plan, config, features), model, bench.optimizer.name,
                                        bench.optimizer.decay_norms_and_biases)
    gbs = layout["global_batch_size"]
    scheduler = schedule.build(optimizer, bench.optimizer, gbs,
                               init_step=int(evaluate(bench.train.init_checkpoint_step, global_batch_size=gbs)))
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    sync_funcs(config, model, features)
    loaded = None
    if plan.init_checkpoint:  # untimed: MLPerf loads the starting checkpoint before run_start
        loaded = checkpoint.load(plan.init_checkpoint, model, optimizer, bench.model.vocab_size,
                                 bench.train.checkpoint_names, checked=plan.init_checkpoint_stamps)
    return Parts(model=model, optimizer=optimizer, scheduler=scheduler, config=config,
                 objective=family(bench.model.family).objective(bench), source=build_source(bench, plan),
                 loaded=loaded)


def seed_model_init(seed: int) -> None:
    """Seeds the generators this rank's model chunks draw their initial weights from (CPU, and the GPU's with
    megatron's tensor- and expert-parallel trackers) at SEED + 100 x its pipeline rank, as Megatron-LM's training
    does: with one seed on every stage, stages holding the same layers' shapes (all but the first and last, at
    --pp 3 or more) started from the same weights, llama31_8b's 32 layers at --pp 4 from 2 copies of 8. A pipeline
    layout therefore starts from other weights than one stage (docs/features.md); stage 0 keeps SEED's."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    stage_seed = seed + 100 * ps.get_pipeline_model_parallel_rank()
    torch.manual_seed(stage_seed)
    model_parallel_cuda_manual_seed(stage_seed)


def sync_funcs(config: Any, model: list, features: dict) -> None:
    """The schedules' communication hooks, as Megatron-LM's training.py sets them: with overlapped gradient
    reduction the schedule holds every chunk's reduce (no_sync) until its last micro-batch's backward and then
    starts it (grad_sync_func, Megatron-LM's default align_grad_reduce); with overlapped parameter gathering the
    interleaved schedule starts the next chunk's all-gather ahead of its forward (param_sync_func)."""

    def one_or_list(fns: list) -> Any:
        return fns[0] if len(fns) == 1 else fns

    if features.get("overlap_grad_reduce"):
        config.no_sync_func = one_or_list([c.no_sync for c in model])
        config.grad_sync_func = one_or_list([c.start_grad_sync for c in model])
    if features.get("overlap_param_gather"):
        config.param_sync_func = one_or_list([c.start_param_sync for c in model])


def ddp_config(features: dict, fp8: bool = False) -> Any:
    from megatron.core.distributed import DistributedDataParallelConfig

    return DistributedDataParallelConfig(
        grad_reduce_in_fp32=features.get("grad_reduce_in_fp32", True),
        overlap_grad_reduce=features.get("overlap_grad_reduce", False),
        overlap_param_gather=features.get("overlap_param_gather", False),
        use_distributed_optimizer=features.get("distributed_optimizer", False),
        fp8_param_gather=fp8 and features.get("fp8_param_gather", False))  # FP8 parameters exist only with FP8


def optimizer_config(plan: RunPlan, config: Any, features: dict) -> Any:
    from megatron.core.optimizer import OptimizerConfig

    o, gbs = plan.benchmark.optimizer, plan.global_batch_size
    sched = rcp_schedule.at(plan.benchmark, gbs)
    return OptimizerConfig(
        optimizer="adam", lr=sched.lr, min_lr=sched.min_lr,
        weight_decay=o.weight_decay, adam_beta1=o.beta1, adam_beta2=o.beta2, adam_eps=o.eps,
        clip_grad=o.clip_grad, bf16=config.bf16, params_dtype=config.params_dtype,
        use_distributed_optimizer=features.get("distributed_optimizer", False))
