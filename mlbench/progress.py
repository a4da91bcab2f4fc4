"""What the user sees while a run trains: a live panel on a terminal, one line per eval otherwise."""

from __future__ import annotations

import time

from rich.console import Console
from rich.live import Live
from rich.table import Table

from mlbench import terminal
from mlbench.quality import operator


def is_progress_line(line: str) -> bool:
    """A line Progress prints without a terminal (what its live panel shows on one)."""
    return line.startswith(("step ", "training on "))


class Progress:
    def __init__(self, title: str, console: Console | None = None, announce: bool = False):
        """ANNOUNCE: without a terminal, the title is printed first (a run of a set: which run, which seed; the
        live panel shows it on a terminal)."""
        self.console = console or terminal.console()
        self.title = title
        self.announce = announce
        self.state: dict = {}
        self.started = time.monotonic()
        self._live: Live | None = None

    def __enter__(self) -> Progress:
        if self.console.is_terminal:
            self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        elif self.announce:
            self.console.print(self.title, highlight=False, soft_wrap=True)
        return self

    def __exit__(self, *exc) -> None:
        if self._live:
            self._live.update(self._render())
            self._live.__exit__(*exc)

    def on_events(self, events: list[dict]) -> None:
        for e in events:
            kind = e.get("event")
            if kind == "start":
                self.state.update(budget=e["budget"], target=e["target"], metric=e["metric"],
                                  direction=e["direction"], mfu_note=e.get("mfu_note", ""))
                if d := e.get("device"):
                    self.state["device"] = f"{d['type']} {d['name']} ({d['precision']}, {d['attention']} attention)"
                    # the layout, so that a log of a multi-rank run says what ran
                    self.state["layout"] = e.get("layout", "")
                    if not self._live:
                        on = f", {self.state['layout']}" if self.state["layout"] else ""
                        self.console.print(f"training on {self.state['device']}{on}")
            elif kind == "step":
                self.state.update(step=e["step"], loss=e["loss"], tokens_per_s=e["tokens_per_s"],
                                  tflops=e["tflops_per_device"], mfu=e.get("mfu"))
            elif kind == "checkpoint_loaded":
                moments = ("with its optimizer state" if e["optimizer_state"]
                           else f"fresh optimizer state: {e.get('optimizer_note')}")
                resized = f", vocabulary padding resized in {len(e['vocab_padding_resized'])}" if e.get(
                    "vocab_padding_resized") else ""
                self.console.print(f"started from checkpoint {e['path']} ({e['tensors']} tensors, {moments}{resized}; "
                                   f"{e.get('seconds', 0):.1f} s, untimed)")
            elif kind in ("checkpoint_saved", "checkpoint_failed"):
                done = (f"saved in {e.get('seconds', 0):.1f} s to" if kind == "checkpoint_saved" else "NOT saved to")
                # rank 0 stopped for another's failure: its own words ('stopped by SIGTERM') are not the cause,
                # which the run's summary names once every rank has ended
                why = "another process of the run failed (named below)" if e.get("consequent") else e.get("reason")
                self.console.print(f"checkpoint {done} {e['path']}{': ' + why if why else ''}")
            elif kind == "eval":
                self.state.update(eval=e["value"], eval_step=e["step"])
                if not self._live:
                    self.console.print(self._line())
        if self._live:
            self._live.update(self._render())

    def _line(self) -> str:
        s = self.state
        return (f"step {s.get('step', 0)}/{s.get('budget', '?')}  loss {s.get('loss', float('nan')):.4f}  "
                f"{s.get('tokens_per_s', 0):,.0f} tokens/s  eval {s.get('metric', '')} "
                f"{s.get('eval', float('nan')):.4f} (target {operator(s.get('direction', 'min'))} "
                f"{s.get('target', float('nan'))})")

    def _render(self) -> Table:
        s = self.state
        t = Table(title=self.title, show_header=False, box=None)
        t.add_row("device", s.get("device", "?"))
        if s.get("layout"):
            t.add_row("layout", s["layout"])
        t.add_row("step", f"{s.get('step', 0)} / {s.get('budget', '?')}")
        t.add_row("train loss", f"{s.get('loss', float('nan')):.4f}")
        t.add_row("tokens/s", f"{s.get('tokens_per_s', 0):,.0f}")
        t.add_row("model TFLOP/s per device", f"{s.get('tflops', 0):.4f}")
        mfu = s.get("mfu")
        t.add_row("MFU", f"{100 * mfu:.1f} %" if mfu is not None else s.get("mfu_note") or "not defined")
        if "eval" in s:
            op = operator(s.get("direction", "min"))
            t.add_row(f"last eval ({s['metric']})",
                      f"{s['eval']:.4f} at step {s['eval_step']}  (target {op} {s['target']})")
        t.add_row("elapsed", f"{time.monotonic() - self.started:.1f} s")
        return t
