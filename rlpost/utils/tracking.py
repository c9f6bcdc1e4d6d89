"""Experiment loggers (`trainer.logger`), validation-sample tables and the step progress bar.

`Tracking(project_name, experiment_name, default_backend=["console", "wandb"], config=cfg_dict,
log_dir=default_local_dir)` fans `log(data, step)` out to every backend:

- `console`: one compact line per step (score, pg_loss, kl, response length, step time, val-core/*);
  everything else goes only to the file backend.
- `file`: `<log_dir>/metrics.jsonl`, one JSON object per step, `{"step": N, ...metrics}`, flushed per line.
  Always on when `log_dir` is given. Non-finite floats are written as the strings "nan", "inf", "-inf"
  (JSON has no NaN; `float("nan")` reads them back). After a resume the same step may appear twice:
  readers keep the last line of a step (`rlpost.utils.plot` does).
- `wandb`: the real client (`WANDB_MODE=offline` works without network), files under `<log_dir>`.
- `tensorboard`: `SummaryWriter` event files under `$TENSORBOARD_DIR` or `<log_dir>/tensorboard`.
- `mlflow`: `$MLFLOW_TRACKING_URI`, else a local SQLite store `<log_dir>/mlruns/mlflow.db` with artifacts
  in `<log_dir>/mlruns/artifacts` (MLflow 3 refuses its old file store by default).
- `swanlab`, `trackio`: used when installed; otherwise start-up fails naming the pip command.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

METRICS_FILE = "metrics.jsonl"
SUPERSEDED_FILE = "metrics_superseded.jsonl"  # rows of steps a resumed run trains again
VAL_GENERATIONS_FILE = "val_generations.jsonl"
SUPPORTED_LOGGERS = ("console", "file", "wandb", "tensorboard", "mlflow", "swanlab", "trackio")

# Console line: (label, candidate metric names; the first present one is shown).
CONSOLE_KEYS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("score", ("critic/score/mean", "critic/rewards/mean")),
    ("pg_loss", ("actor/pg_loss",)),
    ("kl", ("actor/ppo_kl", "actor/kl_loss", "critic/kl")),
    ("resp_len", ("response_length/mean",)),
    ("step_s", ("timing_s/step",)),
    ("loss", ("train/loss",)),
    ("val_loss", ("val/loss",)),
    ("lr", ("train/lr",)),
)


def to_scalar(value: Any) -> Any:
    """Python float/int for numbers, 0-d/1-element tensors and numpy scalars; other values unchanged."""
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if hasattr(value, "item"):  # torch tensor / numpy array holding one element
        numel = value.numel() if hasattr(value, "numel") else getattr(value, "size", None)
        if numel == 1:
            return to_scalar(value.item())
    return value


def json_safe(value: Any) -> Any:
    """Value ready for `json.dumps(allow_nan=False)`: non-finite floats become "nan"/"inf"/"-inf"."""
    value = to_scalar(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "tolist"):
        return json_safe(value.tolist())
    if isinstance(value, (str, int, bool, type(None), float)):
        return value
    return str(value)


def numeric_items(data: Mapping[str, Any]) -> dict[str, float]:
    """The entries of `data` that are real numbers (bools excluded), as floats."""
    out = {}
    for key, value in data.items():
        value = to_scalar(value)
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            out[key] = float(value)
    return out


def format_console_line(data: Mapping[str, Any], step: int) -> str:
    """`step 3 | score 0.500 | pg_loss -0.0120 | ...` from the key metrics present in `data`."""
    nums = numeric_items(data)
    parts = [f"step {step}"]
    for label, candidates in CONSOLE_KEYS:
        key = next((k for k in candidates if k in nums), None)
        if key is not None:
            parts.append(f"{label} {nums[key]:.4g}")
    parts += [f"{k} {v:.4g}" for k, v in sorted(nums.items()) if k.startswith("val-core/")]
    return " | ".join(parts)


def _print(line: str) -> None:
    """Print through tqdm so an active progress bar is not torn."""
    from tqdm import tqdm

    tqdm.write(line, file=sys.stdout)


class _Console:
    def log(self, data: Mapping[str, Any], step: int) -> None:
        _print(format_console_line(data, step))

    def finish(self, exit_code: int = 0) -> None:
        """Nothing to flush: every line is printed as it is logged."""


class _File:
    def __init__(self, log_dir: str | Path):
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        self.path = Path(log_dir) / METRICS_FILE
        self._f = open(self.path, "a")

    def log(self, data: Mapping[str, Any], step: int) -> None:
        record = {"step": int(step), **json_safe(dict(data))}
        self._f.write(json.dumps(record, allow_nan=False) + "\n")
        self._f.flush()

    def resume_at(self, step: int) -> list[int]:
        """Move the rows of steps after `step` (trained again from the checkpoint of `step`) and a line torn by a
        crash to `metrics_superseded.jsonl` beside it; returns the steps moved."""
        self._f.close()
        keep, moved, steps = [], [], []
        for line in self.path.read_text().splitlines(keepends=True):
            try:
                row_step = int(json.loads(line)["step"])
            except (ValueError, KeyError, TypeError):
                row_step = None
            if row_step is not None and row_step <= step and line.endswith("\n"):
                keep.append(line)
            else:
                moved.append(line if line.endswith("\n") else line + "\n")
                steps += [] if row_step is None else [row_step]
        if moved:
            with open(self.path.parent / SUPERSEDED_FILE, "a") as f:
                f.writelines(moved)
            tmp = self.path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(keep))
            os.replace(tmp, self.path)
        self._f = open(self.path, "a")
        return steps

    def finish(self, exit_code: int = 0) -> None:
        self._f.close()


class _Wandb:
    def __init__(self, project: str, name: str, config: Mapping[str, Any] | None, log_dir: str | None):
        import wandb

        self._wandb = wandb
        if log_dir is not None:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project, name=name, config=dict(config or {}), dir=log_dir)

    def log(self, data: Mapping[str, Any], step: int) -> None:
        self.run.log({k: to_scalar(v) for k, v in data.items()}, step=step)

    def finish(self, exit_code: int = 0) -> None:
        self.run.finish(exit_code=exit_code)


class _Tensorboard:
    def __init__(self, log_dir: str | None):
        from torch.utils.tensorboard import SummaryWriter

        path = os.environ.get("TENSORBOARD_DIR") or os.path.join(log_dir or ".", "tensorboard")
        self.writer = SummaryWriter(log_dir=path)

    def log(self, data: Mapping[str, Any], step: int) -> None:
        for key, value in numeric_items(data).items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def finish(self, exit_code: int = 0) -> None:
        self.writer.close()


_MLFLOW_BAD_CHARS = re.compile(r"[^A-Za-z0-9_\-. /:]")


class _Mlflow:
    def __init__(self, project: str, name: str, config: Mapping[str, Any] | None, log_dir: str | None):
        from mlflow.tracking import MlflowClient

        root = Path(log_dir or ".").resolve() / "mlruns"
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            root.mkdir(parents=True, exist_ok=True)
            uri = f"sqlite:///{root / 'mlflow.db'}"
        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(project)
        if exp is not None:
            exp_id = exp.experiment_id
        else:
            exp_id = self.client.create_experiment(project, artifact_location=(root / "artifacts").as_uri())
        self.run_id = self.client.create_run(exp_id, run_name=name).info.run_id
        if config:
            self.client.log_dict(self.run_id, json_safe(dict(config)), "config.json")

    def log(self, data: Mapping[str, Any], step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        # MLflow rejects some characters in metric names (e.g. "@" in "pass@k"): replace them.
        metrics = [
            Metric(_MLFLOW_BAD_CHARS.sub("_", k.replace("@", "_at_")), v, now, int(step))
            for k, v in numeric_items(data).items()
        ]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def finish(self, exit_code: int = 0) -> None:
        self.client.set_terminated(self.run_id, status="FINISHED" if exit_code == 0 else "FAILED")


class _SimpleModule:
    """swanlab / trackio: both expose module-level init(...), log(data, step=...), finish()."""

    def __init__(self, module: Any, init: Callable[[], Any]):
        self.module = module
        init()

    def log(self, data: Mapping[str, Any], step: int) -> None:
        self.module.log(numeric_items(data), step=step)

    def finish(self, exit_code: int = 0) -> None:
        self.module.finish()


def _import_optional(name: str) -> Any:
    """Import an optional logger package or fail at start-up with the pip command."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ImportError(f"trainer.logger includes '{name}' but it is not installed: pip install {name}") from exc


class Tracking:
    """Fan-out of metrics to the backends listed in `trainer.logger`.

    Args:
        project_name: `trainer.project_name` (wandb/mlflow/swanlab/trackio project).
        experiment_name: `trainer.experiment_name` (run name).
        default_backend: one name or a list from `SUPPORTED_LOGGERS`.
        config: the resolved config as plain dict (logged by wandb/mlflow/swanlab/trackio).
        log_dir: run folder (`trainer.default_local_dir`); when given the file backend is always on.
    """

    def __init__(
        self,
        project_name: str,
        experiment_name: str,
        default_backend: str | Sequence[str] = "console",
        config: Mapping[str, Any] | None = None,
        log_dir: str | Path | None = None,
    ):
        names = [default_backend] if isinstance(default_backend, str) else list(default_backend)
        unknown = [n for n in names if n not in SUPPORTED_LOGGERS]
        if unknown:
            raise ValueError(f"trainer.logger={names}: unknown logger(s) {unknown}; supported: {SUPPORTED_LOGGERS}")
        self.log_dir = str(log_dir) if log_dir is not None else None
        if self.log_dir is not None and "file" not in names:
            names.append("file")
        if "file" in names and self.log_dir is None:
            raise ValueError("the 'file' logger needs log_dir (trainer.default_local_dir)")
        self.names = list(dict.fromkeys(names))
        self.backends: dict[str, Any] = {}
        for name in self.names:
            self.backends[name] = self._make(name, project_name, experiment_name, config)

    def _make(self, name: str, project: str, experiment: str, config: Mapping[str, Any] | None) -> Any:
        if name == "console":
            return _Console()
        if name == "file":
            return _File(self.log_dir)
        if name == "wandb":
            return _Wandb(project, experiment, config, self.log_dir)
        if name == "tensorboard":
            return _Tensorboard(self.log_dir)
        if name == "mlflow":
            return _Mlflow(project, experiment, config, self.log_dir)
        mod = _import_optional(name)
        if name == "swanlab":
            return _SimpleModule(mod, lambda: mod.init(project=project, experiment_name=experiment, config=config))
        return _SimpleModule(mod, lambda: mod.init(project=project, name=experiment, config=config))

    def log(self, data: Mapping[str, Any], step: int, backend: str | Sequence[str] | None = None) -> None:
        """Send one step's metrics (name -> number; other values go to file/wandb only) to every backend, or only
        to those named in `backend`."""
        chosen = None if backend is None else {backend} if isinstance(backend, str) else set(backend)
        for name, sink in self.backends.items():
            if chosen is None or name in chosen:
                sink.log(data, step)

    def resume_at(self, step: int) -> None:
        """The run continues after `step`: rows the file backend holds for later steps (a run that went on past
        the checkpoint it now resumes from, e.g. after a fallback from a damaged one) move aside, so
        `metrics.jsonl` holds each step once."""
        backend = self.backends.get("file")
        steps = backend.resume_at(step) if backend is not None else []
        if steps:
            print(f"[rlpost] {backend.path}: {len(steps)} row(s) of steps {min(steps)}-{max(steps)} are after the "
                  f"checkpoint this run resumes from (step {step}); they are trained again, so they moved to "
                  f"{backend.path.parent / SUPERSEDED_FILE}")

    def finish(self, exit_code: int = 0) -> None:
        """Flush and close every backend (call once at the end of training). A non-zero `exit_code` marks the
        run failed where the backend records that (wandb's exit code, MLflow's FAILED status)."""
        for backend in self.backends.values():
            backend.finish(exit_code=exit_code)
        self.backends = {}

    def __del__(self) -> None:  # a crashed trainer should still flush the file backend
        try:
            if "file" in getattr(self, "backends", {}):
                self.backends["file"].finish()
        except Exception:  # noqa: BLE001 - never raise from __del__
            pass


class ValidationGenerationsLogger:
    """Logs a table of (prompt, response, score) validation samples.

    `wandb` adds a `val/generations` table to the active run (started by `Tracking`); `file` appends one
    JSON object per sample `{"step", "prompt", "response", "score"}` to `<log_dir>/val_generations.jsonl`;
    `console` prints the first `max_console` samples, truncated. Other backends are skipped.
    """

    def __init__(self, log_dir: str | Path | None = None, max_console: int = 3, max_chars: int = 300):
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.max_console = max_console
        self.max_chars = max_chars

    def log(self, loggers: Iterable[str], samples: Sequence[tuple[str, str, float]], step: int) -> None:
        """Log `samples` (list of (prompt, response, score)) at `step` to the backends in `loggers`."""
        loggers = set(loggers)
        if self.log_dir is not None:
            loggers.add("file")
        if "file" in loggers and self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            with open(self.log_dir / VAL_GENERATIONS_FILE, "a") as f:
                for prompt, response, score in samples:
                    row = {"step": int(step), "prompt": prompt, "response": response, "score": json_safe(score)}
                    f.write(json.dumps(row, allow_nan=False) + "\n")
        if "console" in loggers:
            for prompt, response, score in list(samples)[: self.max_console]:
                _print(f"[val step {step}] score={to_scalar(score)} prompt={prompt[-self.max_chars:]!r} "
                       f"response={response[: self.max_chars]!r}")
        if "wandb" in loggers:
            import wandb

            if wandb.run is None:
                raise RuntimeError("ValidationGenerationsLogger: 'wandb' requested but no wandb run is active")
            rows = [[int(step), p, r, to_scalar(s)] for p, r, s in samples]
            table = wandb.Table(columns=["step", "prompt", "response", "score"], data=rows)
            wandb.run.log({"val/generations": table}, step=step)


class StepProgress:
    """Console progress bar over training steps with ETA (tqdm); the trainer calls `update()` per step.

    Only on a terminal: written to a file or a pipe (a captured log, a job's output) each redraw becomes a line
    among the per-step lines, which already say how far the run is.
    """

    def __init__(self, total_steps: int, initial_step: int = 0, file: Any = None, disable: bool = False):
        from tqdm import tqdm

        stream = file if file is not None else sys.stderr
        disable = disable or not (hasattr(stream, "isatty") and stream.isatty())
        self._n = initial_step
        self.bar = tqdm(
            total=total_steps, initial=initial_step, desc="Training", unit="step",
            dynamic_ncols=True, file=file, disable=disable,
        )

    def update(self, n: int = 1, metrics: Mapping[str, Any] | None = None) -> None:
        """Advance by `n` steps; `metrics` (optional) shows the score on the bar."""
        if metrics:
            nums = numeric_items(metrics)
            if "critic/score/mean" in nums:
                self.bar.set_postfix(score=f"{nums['critic/score/mean']:.3f}", refresh=False)
        self.bar.update(n)
        self._n += n

    @property
    def n(self) -> int:
        """Steps done so far (including `initial_step`)."""
        return self._n

    def close(self) -> None:
        """Close the bar (idempotent)."""
        self.bar.close()
