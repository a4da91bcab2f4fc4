"""The planner's answers to issue 16's two questions: `python perf/planner_report.py`.

1. The best layouts it proposes for gpt3 and llama31_405b on 64 x 8 H100, beside the layout NVIDIA used there.
2. A predicted scaling curve for llama31_405b on GB200 NVL72 (4 GPUs a node) from 512 to 8,192 GPUs.

Features as NVIDIA's NeMo configs set them (distributed optimizer, sequence parallel, overlapped communication,
bf16 gradient reduction: `calibration.MODERN`), fp8, so the figures compare with the runs the model was fitted on.
"""

from __future__ import annotations

import dataclasses
import sys

from mlbench import registry
from mlbench.errors import UserError
from mlbench.layout import resolve
from mlbench.planner import calibration, devices
from mlbench.planner import plan as planner

FEATURES = {f.name: getattr(calibration.MODERN, f.name) for f in dataclasses.fields(calibration.MODERN)}
# NVIDIA's 64 x 8 H100 layouts: gpt3 v4.1 eos_n64 (tp4 pp8 vp6 mbs2 gbs2048, published-runs.csv row 11) and
# llama31_405b v5.0 eos-dfw_n64 (tp8 pp8 vp8 cp2 mbs1 gbs1152, row 14), with their measured step times.
NVIDIA = {"gpt3": ((4, 8, 6, 1, 2, 2048), 9.4963, 51.028), "llama31_405b": ((8, 8, 8, 2, 1, 1152), 55.143, 230.687)}


def _resolve(bench, nodes, per_node, tp, pp, vp, cp, mbs, gbs):
    return resolve(bench, nodes, per_node, tp, pp, vp, cp, mbs, gbs, features=FEATURES, precision="fp8")


def rough_memory_bytes(bench, r: dict) -> float:
    """A stand-in for the memory plan (mlbench.planner.memory) while it is not in the package, for this report
    only: per GPU, bf16 weights (2 B a parameter) and gradients (2 B), fp32 main weights and Adam moments (12 B)
    sharded over dp x cp by the distributed optimizer, and the first pipeline stage's activations with sequence
    parallelism and flash attention (34 s b h / (tp cp) bytes a layer, Korthikanti et al. 2022, table 2) for the
    pp micro-batches 1F1B keeps in flight (x (1 + (pp - 1) / (pp vp)) interleaved)."""
    from mlbench import flops

    ly, m = r["layout"], bench.model
    tp, pp, vp, cp, dp, mbs = ly["tp"], ly["pp"], ly["vp"], ly["cp"], ly["dp"], ly["micro_batch_size"]
    params = flops.param_count(m, tp) / (tp * pp)
    state = params * (2 + 2) + params * 12 / (dp * cp)
    per_layer = 34 * m.seq_length * mbs * m.hidden_size / (tp * cp)
    in_flight = pp * (1 + (pp - 1) / (pp * vp)) if vp > 1 else pp
    return state + per_layer * m.num_layers / pp * in_flight


def _line(r: dict) -> str:
    ly, t = r["layout"], r["step_terms_s"]
    comm = sum(t.get(k, 0.0) for k in ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm"))
    mem = (f"{r['memory']['total_bytes'] / 1e9:.0f} GB" if r["memory"] else
           f"~{r['rough_memory_bytes'] / 1e9:.0f} GB (stand-in)")
    return (f"tp{ly['tp']} pp{ly['pp']} vp{ly['vp']} cp{ly['cp']} dp{ly['dp']} mbs{ly['micro_batch_size']} "
            f"gbs{ly['global_batch_size']}: step {r['step_time_s']:.2f} s, TTT {r['time_to_train_min']:.1f} min, "
            f"MFU {r['mfu']:.1%}, bubble {t['pipeline_bubble'] / r['step_time_s']:.1%}, "
            f"comm {comm / r['step_time_s']:.1%}, {mem}")


def best_layouts() -> None:
    h100 = devices.get("h100")
    for name, (shape, step, ttt) in NVIDIA.items():
        bench = registry.load(name)
        nvidia = planner.evaluate(bench, _resolve(bench, 64, 8, *shape), h100)
        nvidia["rough_memory_bytes"] = rough_memory_bytes(bench, nvidia)
        print(f"\n{name} on 64 x 8 H100, fp8")
        print(f"  NVIDIA's layout   {_line(nvidia)}  (measured: step {step} s, TTT {ttt} min)")
        results, stats = planner.search(bench, h100, 64, 8, None,
                                         lambda tp, pp, vp, cp, mbs, gbs, ep, b=bench: _resolve(b, 64, 8, tp, pp,
                                                                                               vp, cp, mbs, gbs))
        for r in results:
            r["rough_memory_bytes"] = rough_memory_bytes(bench, r)
        fitting = [r for r in results if r["memory"] or r["rough_memory_bytes"] <= h100.memory_bytes]
        print(f"  searched {stats['candidates']} candidates ({stats['invalid']} do not divide, "
              f"{stats['does_not_fit']} do not fit the memory plan, {len(results) - len(fitting)} more over "
              f"80 GB by the stand-in estimate)")
        for i, r in enumerate(fitting[:5], 1):
            print(f"  #{i:<2} {_line(r)}")


def gb200_curve() -> None:
    """tp 4, pp 8, vp 8, cp 2 (NVIDIA's Blackwell layout for this model), the global batch the smallest at or
    above 1152 that the interleaved schedule takes at each data-parallel size."""
    gb200, bench = devices.get("gb200"), registry.load("llama31_405b")
    print("\nllama31_405b on GB200 NVL72, fp8, tp4 pp8 vp8 cp2 mbs1 (predicted)")
    points = []
    for gpus in (512, 1024, 2048, 4096, 8192):
        dp = gpus // 64
        gbs = -(-1152 // (8 * dp)) * 8 * dp
        try:
            points.append(planner.evaluate(bench, _resolve(bench, gpus // 4, 4, 4, 8, 8, 2, 1, gbs), gb200))
        except UserError as e:
            print(f"  {gpus}: {e}")
    for p, e in zip(points, planner.scaling_efficiencies(points), strict=True):
        t = p["step_terms_s"]
        print(f"  {e['devices']:>5} GPUs gbs {p['layout']['global_batch_size']:>5}: step {p['step_time_s']:6.2f} s, "
              f"{p['time_to_train']['steps']} steps, TTT {p['time_to_train_min']:6.1f} min, MFU {p['mfu']:.1%}, "
              f"dp_comm {t['dp_comm']:.2f} s, strong eff. {e['strong_efficiency']:.2f}, "
              f"weak eff. {e['weak_efficiency']:.2f}")


def gb200_published() -> None:
    """The published GB200 point: NVIDIA's MLPerf Training v5.0 llama31_405b on 2,496 GB200 GPUs (34 NVL72 racks),
    20.8 minutes (NVIDIA technical blog, "NVIDIA Blackwell delivers up to 2.6x higher performance in MLPerf Training
    v5.0", June 2025; its layout is not in this repository: 2,496 = 39 x 64, so tp x pp x cp = 64 as here at batch
    39 x 32 = 1248), with "90 % scaling efficiency from 512 to 2,496 GPUs" in NVIDIA's briefing (secondary press
    reports). pp 8 x vp 8 needs the asymmetric split layout.resolve takes only from a reference layout, so the
    prediction uses pp 6 x vp 3 (126 layers = 6 x 3 x 7)."""
    gb200, bench = devices.get("gb200"), registry.load("llama31_405b")
    r = planner.evaluate(bench, _resolve(bench, 624, 4, 4, 6, 3, 2, 1, 1248), gb200)
    print(f"  2,496 GPUs gbs 1248 (tp4 pp6 vp3 cp2): step {r['step_time_s']:.2f} s, {r['time_to_train']['steps']} "
          f"steps, TTT {r['time_to_train_min']:.1f} min, MFU {r['mfu']:.1%}; published (v5.0): 20.8 min")


def main() -> int:
    best_layouts()
    gb200_curve()
    gb200_published()
    return 0


if __name__ == "__main__":
    sys.exit(main())
