"""The end-to-end benchmark helpers (benchmarks/main_ppo_runs.py, benchmarks/bench_scale.py): launching a run, the
steady-state summary and the weak-scaling efficiency."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_scale  # noqa: E402
from main_ppo_runs import launch  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def _rows(steps: list[float], gen: float, peak: float) -> list[dict]:
    return [{"step": i + 1, "timing_s/step": s, "timing_s/gen": gen, "perf/throughput": 1000.0 / s,
             "perf/max_memory_allocated_gb": peak, "perf/max_memory_allocated_gb/update_actor": peak - 1}
            for i, s in enumerate(steps)]


def test_summary_leaves_out_the_warm_up_step_and_keeps_the_range():
    out = bench_scale.summarize(_rows([30.0, 10.0, 12.0, 11.0], gen=4.0, peak=50.0))
    assert out["steps_measured"] == 3
    assert out["s_per_step"] == 11.0 and out["s_per_step_range"] == [10.0, 12.0]
    assert out["phases_s"] == {"step": 11.0, "gen": 4.0}
    assert out["peak_allocated_gb"] == {"step": 50.0, "update_actor": 49.0}


def test_weak_scaling_efficiency_is_one_gpu_time_over_n_gpu_time_at_the_same_load_per_gpu():
    one = {"gpus": 1, "prompts": 64, "s_per_step": 10.0, "phases_s": {"gen": 4.0, "update_actor": 5.0, "adv": 0.01}}
    four = {"gpus": 4, "prompts": 256, "s_per_step": 12.5, "phases_s": {"gen": 4.0, "update_actor": 6.25, "adv": 0.02}}
    strong = {"gpus": 4, "prompts": 64, "s_per_step": 4.0, "phases_s": {"gen": 1.0}}
    failed = {"gpus": 2, "prompts": 128, "s_per_step": 9.0, "phases_s": {}, "error": "rc=1"}
    bench_scale.efficiency([one, four, strong, failed])
    assert four["weak_efficiency"] == pytest.approx(0.8)
    assert four["phase_efficiency"] == {"gen": 1.0, "update_actor": 0.8}  # phases under 0.05 s are noise
    assert "weak_efficiency" not in strong and "weak_efficiency" not in failed


def test_launch_sees_each_metrics_line_and_kills_a_run_past_its_time(tmp_path):
    run_dir = tmp_path / "run"
    writer = (f"mkdir -p {run_dir}; for i in 1 2 3; do sleep 0.3; "
              f"echo '{{\"step\": '$i', \"timing_s/step\": 0.2}}' >> {run_dir}/metrics.jsonl; done; echo done")
    run = launch(["bash", "-c", writer], {}, run_dir, tmp_path / "a.log", "t")
    assert run.rc == 0 and not run.timed_out
    assert [r["step"] for r in run.rows] == [1, 2, 3] and len(run.arrivals) == 3
    assert run.arrivals == sorted(run.arrivals) and run.startup_s is not None and run.startup_s < 5
    assert (tmp_path / "a.log").read_text().strip() == "done"

    slow = ["bash", "-c", f"mkdir -p {tmp_path}/s; echo '{json.dumps({'step': 1})}' > {tmp_path}/s/metrics.jsonl; "
                          "sleep 30 & wait"]
    run = launch(slow, {}, tmp_path / "s", tmp_path / "b.log", "t", timeout_s=2, stop_ray=False)
    assert run.timed_out and run.rc != 0 and run.rows == [{"step": 1}]
    assert run.wall_s < 15  # the background `sleep` of the killed group does not hold the launcher


def test_a_profiled_step_is_left_out_of_the_medians():
    out = bench_scale.summarize(_rows([30.0, 10.0, 40.0, 12.0, 11.0], gen=4.0, peak=50.0), profiled_step=3)
    assert out["steps_measured"] == 3 and out["s_per_step"] == 11.0 and out["s_per_step_range"] == [10.0, 12.0]


def test_profile_overrides_compose_and_pass_the_start_up_rules(tmp_path):
    from hydra import compose, initialize_config_dir

    from rlpost.trainer.config import CONFIG_DIR, typed_config, validate_config
    from rlpost.trainer.ppo.profiling import role_options

    assert bench_scale.profile_overrides(None, tmp_path) == []
    overrides = bench_scale.profile_overrides(4, tmp_path)
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        cfg = compose("ppo_trainer", overrides=[*overrides, "trainer.device=cpu", "trainer.n_gpus_per_node=4",
                                                  "actor_rollout_ref.rollout.tensor_model_parallel_size=1"])
    validate_config(cfg)
    c = typed_config(cfg)
    for role in ("actor", "ref", "rollout"):
        opts = role_options(c, role)
        assert (opts.tool, opts.ranks, opts.save_path) == ("torch", None, str(tmp_path / "profile"))


def test_summary_by_step_number_and_with_no_step_left():
    rows = _rows([30.0, 10.0, 40.0, 12.0], gen=4.0, peak=50.0)
    del rows[1]  # step 2's row is missing: step 3 (profiled) and 4 remain
    assert bench_scale.summarize(rows, profiled_step=3)["s_per_step"] == 12.0
    assert bench_scale.summarize(_rows([30.0, 40.0], gen=4.0, peak=50.0), profiled_step=2) == {"steps_measured": 0}


def test_realistic_workload_data_and_lengths_reach_the_dataset(tiny_model_dir, tmp_path):
    """`--workload realistic` (B6_realistic): the GSM8K-shaped file, in step order with per-sample caps, read by
    rlpost's own dataset under the run's length overrides; every prompt fits the prompt budget it is given."""
    from hydra import compose, initialize_config_dir
    from transformers import AutoTokenizer

    from benchmarks import workload
    from rlpost.data.rl_dataset import RLHFDataset
    from rlpost.trainer.config import CONFIG_DIR, typed_config, validate_config

    args = bench_scale.parse_args(["--arch", "0.5b", "--gpus", "1", "--prompts", "4", "--n", "4", "--steps", "2",
                                   "--workload", "realistic", "--cap", "256", "--seed", "3"])
    shutil.rmtree("/tmp/d_realistic_0.5b_4x4_cap256_s2_seed3", ignore_errors=True)  # built here, not reused
    data = bench_scale.realistic_data("0.5b", 4, args, tokenizer_dir=Path(tiny_model_dir))
    assert data == Path("/tmp/d_realistic_0.5b_4x4_cap256_s2_seed3")
    overrides = bench_scale.workload_overrides(args)
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        cfg = compose("ppo_trainer", overrides=[*overrides, "trainer.device=cpu",
                                                  f"data.train_files={data}/train.parquet",
                                                  f"actor_rollout_ref.model.path={tiny_model_dir}"])
    validate_config(cfg)
    c = typed_config(cfg)
    assert (c.data.max_prompt_length, c.data.max_response_length, c.data.shuffle) == (192, 256, False)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ds = RLHFDataset([str(data / "train.parquet")], tok, c.data)
    want = workload.gsm8k_shaped(8, 4, 256, 3)  # 2 steps of 4 prompts, the file's order
    assert len(ds) == 8
    for i in range(8):
        row = ds[i]
        assert list(row["extra_info"]["response_caps"]) == [int(v) for v in want.caps[i]]
        assert int(row["attention_mask"].sum()) <= 192
