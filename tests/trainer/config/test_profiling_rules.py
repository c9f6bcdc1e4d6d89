"""Start-up rules of the profiling keys and the machine check of the chosen tool."""

import pytest

from rlpost.trainer.config import ConfigError, ConfigWarning, typed_config, validate_config
from rlpost.trainer.ppo.profiling import check_profiler_tools, nsight_runtime_env, role_options

pytestmark = pytest.mark.timeout(60)
ACTOR = "actor_rollout_ref.actor.profiler"


@pytest.mark.parametrize("values, parts", [
    ({"global_profiler.tool": "torch_memory", "global_profiler.steps": [1], f"{ACTOR}.enable": True},
     ["global_profiler.tool=torch_memory, trainer.device=cpu", "use global_profiler.tool=torch"]),
    ({"global_profiler.tool": "npu"}, ["not supported yet: global_profiler.tool=npu", "use global_profiler.tool=torch"]),
    ({"global_profiler.tool": "perf"}, ["global_profiler.tool=perf", "must be one of torch, torch_memory, nsys"]),
    ({"global_profiler.tool": "torch", "global_profiler.steps": [0]}, ["global_profiler.steps=[0]", "steps=[1]"]),
    ({"global_profiler.tool": "torch", "global_profiler.steps": [1], f"{ACTOR}.enable": True, f"{ACTOR}.ranks": [5]},
     [f"{ACTOR}.ranks=[5]", "ranks must be in [0, 2)"]),
    ({"trainer.device_memory_gb": 0}, ["trainer.device_memory_gb=0", "trainer.device_memory_gb=80"]),
])
def test_profiling_rule_messages(small_cfg, values, parts):
    with pytest.raises(ConfigError) as err:
        validate_config(small_cfg(values))
    assert [p for p in parts if p not in str(err.value)] == [], str(err.value)


def test_nothing_enabled_warns(small_cfg):
    with pytest.warns(ConfigWarning, match="no role has profiler.enable=true"):
        validate_config(small_cfg({"global_profiler.tool": "torch", "global_profiler.steps": [2]}))


def test_resolved_options_and_legacy_profile_steps(small_cfg, monkeypatch):
    c = typed_config(small_cfg({"global_profiler.tool": "torch", "global_profiler.steps": [2],
                                f"{ACTOR}.enable": True, f"{ACTOR}.ranks": [1],
                                f"{ACTOR}.tool_config.torch.contents": ["cpu", "memory"]}))
    actor = role_options(c, "actor")
    assert (actor.tool, actor.ranks, actor.contents, actor.save_path) == ("torch", (1,), ("cpu", "memory"),
                                                                          "outputs/profile")
    assert role_options(c, "rollout").ranks == (1,)  # the rollout follows the actor's switches
    assert role_options(c, "ref") is None and role_options(c, "critic") is None
    # verl's older trainer.profile_steps means nsys on those steps; the workers then start under nsys
    legacy = small_cfg({"trainer.profile_steps": [1], f"{ACTOR}.enable": True, "trainer.device": "cuda"})
    c = typed_config(legacy)
    assert role_options(c, "actor").tool == "nsys"
    env = nsight_runtime_env(c, {"runtime_env": {"env_vars": {"A": "1"}}})["runtime_env"]
    assert env["nsight"]["capture-range"] == "cudaProfilerApi" and env["env_vars"] == {"A": "1"}
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(ValueError, match="`nsys` is not on PATH.*global_profiler.tool=torch"):
        check_profiler_tools(c)


def test_verl_newer_nsys_keys_under_global_tool_config(small_cfg):
    """verl's `global_profiler.global_tool_config.nsys.*`: `discrete` makes every profiled role capture per phase;
    an entry of its worker options set away from the default wins over `trainer.worker_nsight_options`."""
    nsys = "global_profiler.global_tool_config.nsys"
    c = typed_config(small_cfg({"global_profiler.tool": "nsys", "global_profiler.steps": [1], f"{ACTOR}.enable": True,
                                "actor_rollout_ref.ref.profiler.enable": True, "trainer.device": "cuda",
                                f"{nsys}.discrete": True, f"{nsys}.worker_nsight_options.trace": "cuda,nvtx",
                                "trainer.worker_nsight_options.kill": "sigkill"}))
    assert role_options(c, "actor").discrete and role_options(c, "ref").discrete
    assert role_options(c, "rollout").discrete  # in the actor's process: it follows the actor
    env = nsight_runtime_env(c, {})["runtime_env"]["nsight"]
    assert (env["trace"], env["kill"], env["capture-range"]) == ("cuda,nvtx", "sigkill", "cudaProfilerApi")
    # without the global switch only a role's own profiler.discrete counts
    c = typed_config(small_cfg({"global_profiler.tool": "nsys", "global_profiler.steps": [1], f"{ACTOR}.enable": True,
                                "trainer.device": "cuda"}))
    assert not role_options(c, "actor").discrete and not role_options(c, "rollout").discrete
    c = typed_config(small_cfg({"global_profiler.tool": "torch", "global_profiler.steps": [1], f"{ACTOR}.enable": True,
                                f"{ACTOR}.discrete": True}))
    assert role_options(c, "actor").discrete and role_options(c, "rollout").discrete
    # both spellings of one worker option set to different values: one message naming both
    with pytest.raises(ConfigError, match=rf"{nsys}.worker_nsight_options.trace=cuda,nvtx, "
                                          r"trainer.worker_nsight_options.trace=cuda: two spellings"):
        typed_config(small_cfg({f"{nsys}.worker_nsight_options.trace": "cuda,nvtx",
                                "trainer.worker_nsight_options.trace": "cuda"}))
    c = typed_config(small_cfg({"global_profiler.tool": "nsys", "global_profiler.steps": [1], f"{ACTOR}.enable": True,
                                f"{nsys}.worker_nsight_options.trace": "cuda,nvtx",
                                "trainer.worker_nsight_options.trace": "cuda,nvtx", "trainer.device": "cuda"}))
    assert nsight_runtime_env(c, {})["runtime_env"]["nsight"]["trace"] == "cuda,nvtx"  # the same value twice: fine
    typed_config(small_cfg({f"{nsys}.worker_nsight_options.cuda-memory-usage": True,  # Hydra's bool for `=true`
                            "trainer.worker_nsight_options.cuda-memory-usage": "true"}))
    # nsys is handed `false`, the form its command line takes, for Hydra's bool False
    c = typed_config(small_cfg({"global_profiler.tool": "nsys", "global_profiler.steps": [1], f"{ACTOR}.enable": True,
                                "trainer.device": "cuda", f"{nsys}.worker_nsight_options.cuda-memory-usage": False}))
    assert nsight_runtime_env(c, {})["runtime_env"]["nsight"]["cuda-memory-usage"] == "false"
