"""Build a `RayPPOTrainer` from a config the verl way, then train: in this process (`run_ppo`) or inside a
Ray actor (`TaskRunner`, as verl's `main_ppo` runs it).

Order matters: the tokenizer, data and reward function are checked, and the trainer built, before any
worker starts (a missing column or a raising reward function fails in seconds, with one message);
`run_ppo` starts Ray only after that.
"""

from __future__ import annotations

import contextlib
import logging
import os

from typing import Any

from rlpost.config.schema import PPOTrainerConfig

logger = logging.getLogger(__name__)


class InputError(Exception):
    """A data file, tokenizer or reward function that cannot be used; raised before any worker starts."""


def run_ppo(config: Any) -> dict[str, float]:
    """Train with a `ppo_trainer` config in this process (the Ray driver); returns the last step's metrics.

    `config` is the typed config `main_ppo` validated, or a composed DictConfig (validated here, once)."""
    from rlpost.single_controller.ray.init import finish_ray, init_ray
    from rlpost.trainer.config import as_typed
    from rlpost.utils.run_lock import FolderInUse, run_lock

    from rlpost.trainer.ppo.checkpointing import already_complete, check_resume_inputs, finished_run
    from rlpost.trainer.ppo.interrupt import interrupted, sigterm_as_interrupt
    from rlpost.trainer.config.judge_rules import check_judge_devices
    from rlpost.trainer.ppo.preflight import check_devices, check_memory
    from rlpost.trainer.ppo.profiling import check_profiler_tools

    config = as_typed(config)
    try:
        check_devices(config)  # before Ray: it would wait for devices that do not exist, then time out
        check_judge_devices(config)
        check_memory(config)  # before Ray: a phase that cannot fit would die mid-run
        check_profiler_tools(config)
    except ValueError as err:
        raise InputError(str(err)) from err
    trainer_cfg = config.trainer
    run_dir = os.path.abspath(os.path.expanduser(trainer_cfg.default_local_dir))
    log_dir = os.path.join(run_dir, "logs")
    with contextlib.ExitStack() as held:
        config = held.enter_context(code_sandbox(config))
        trainer = build_trainer(config)
        done = finished_run(config, trainer.total_training_steps)  # a finished run needs no Ray at all
        if done is not None:
            print(already_complete(done, trainer.total_training_steps))
            return {}
        check_resume_inputs(config)  # an incompatible checkpoint stops here, not after the workers load them
        try:  # one run per folder: a second one stops here, before Ray
            held.enter_context(run_lock(run_dir))
        except FolderInUse as err:
            raise InputError(str(err)) from err
        init_ray(config.ray_init, log_dir=log_dir, verbose=trainer_cfg.verbose_engine_logs)
        if not trainer_cfg.verbose_engine_logs:
            print(f"[rlpost] engine and Ray logs of this run: {log_dir} (trainer.verbose_engine_logs=true shows "
                  "them here)")
        try:
            with sigterm_as_interrupt():
                trainer.init_workers()
                return trainer.fit()
        except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM: say where the run stopped and what resumes it
            raise interrupted(err, trainer_cfg.default_local_dir, trainer.global_steps,
                              trainer.total_training_steps) from None
        finally:
            finish_ray(config.ray_init)


class TaskRunner:
    """verl's driver task: `ray.get(ray.remote(num_cpus=1)(TaskRunner).remote().run.remote(config))`.

    It runs wherever Ray puts it (the driver process or any Ray worker); Ray must be started already,
    and is left running.
    """

    def run(self, config: Any) -> dict[str, float]:
        """Build the trainer, start the workers and train; returns the last step's metrics."""
        with code_sandbox(config) as config:
            trainer = build_trainer(config)
            trainer.init_workers()
            return trainer.fit()


@contextlib.contextmanager
def code_sandbox(config: Any):
    """The config to run with: for `reward_model.sandbox_fusion.url=local` rlpost's sandbox service is started
    (stopped on exit) and its address replaces `local`; a set URL must answer one program (else InputError)."""
    from rlpost.sandbox import LOCAL
    from rlpost.sandbox.client import SandboxUnreachable, check_reachable
    from rlpost.trainer.config import as_typed

    config = as_typed(config)

    sandbox = config.reward_model.sandbox_fusion
    if not sandbox.url:
        yield config
        return
    with contextlib.ExitStack() as held:
        if sandbox.url == LOCAL:
            from rlpost.sandbox.local import local_sandbox

            try:
                service = held.enter_context(local_sandbox(min(sandbox.max_concurrent, os.cpu_count() or 1)))
            except RuntimeError as err:
                raise InputError(str(err)) from err
            config = config.replace(**{"reward_model.sandbox_fusion.url": service.url})
            print(f"[rlpost] code sandbox: {service.url} (pid {service.pid}), stopped with the run")
        try:
            check_reachable(config.reward_model.sandbox_fusion.url)
        except SandboxUnreachable as err:
            raise InputError(str(err)) from err
        yield config


def build_trainer(config: Any):
    """Tokenizer, datasets, reward functions, roles and pools from `config` (typed, or a DictConfig validated
    here), then the `RayPPOTrainer`.

    Raises:
        InputError: the model folder, a data file or the reward function cannot be used.
    """
    from rlpost.data.rl_dataset import create_rl_dataset
    from rlpost.reward import RewardFunctionError
    from rlpost.single_controller.ray import ResourcePoolManager
    from rlpost.trainer.config import ConfigError, as_typed
    from rlpost.trainer.ppo.ray_trainer import RayPPOTrainer
    from rlpost.trainer.ppo.roles import default_role_worker_mapping, resource_pool_spec
    from rlpost.trainer.ppo.vision_checks import check_vision_inputs

    from rlpost.trainer.ppo.preflight import (check_context_length, check_engine_kwargs, check_lora_inputs,
                                              check_model_and_data_paths, check_model_families,
                                              check_optimizers, check_output_folder)

    config = as_typed(config)
    try:  # bad input fails here, in seconds and with one message, before the workers start
        check_model_and_data_paths(config)
        check_output_folder(config)
        check_lora_inputs(config)
        check_model_families(config)
        check_context_length(config)
        check_engine_kwargs(config)
        check_optimizers(config)
        processor = check_vision_inputs(config)  # None for a text model
        tokenizer = load_tokenizer(config)
        data_cfg = config.data
        train_ds = create_rl_dataset(data_cfg.train_files, data_cfg, tokenizer, processor)
        val_ds = (create_rl_dataset(data_cfg.val_files, data_cfg, tokenizer, processor, is_train=False)
                  if data_cfg.val_files else None)
        check_multi_turn_inputs(config, {"data.train_files": train_ds, "data.val_files": val_ds})
        reward_fn, val_reward_fn = build_reward_fns(config, tokenizer, train_ds, val_ds)
        role_worker_mapping, mapping = default_role_worker_mapping(config)
        pools = ResourcePoolManager(resource_pool_spec=resource_pool_spec(config), mapping=mapping)
        return RayPPOTrainer(config, tokenizer, role_worker_mapping, pools, processor=processor, reward_fn=reward_fn,
                             val_reward_fn=val_reward_fn, train_dataset=train_ds, val_dataset=val_ds)
    except ConfigError:
        raise
    except (OSError, ValueError, KeyError, RewardFunctionError) as err:
        # KeyError's str() is the repr of its message; the message itself reads better
        raise InputError(err.args[0] if isinstance(err, KeyError) and err.args else str(err)) from err


def check_multi_turn_inputs(config: PPOTrainerConfig, datasets: dict) -> None:
    """With multi_turn.enable: the tools, interaction and agent-loop YAMLs load, and every row's `agent_name`
    and `interaction_kwargs.name` is registered (checked over the whole data set before any worker starts).

    Raises:
        ValueError: a bad YAML entry (named) or an unknown name in a data set (lists the registered ones).
    """
    rollout = config.actor_rollout_ref.rollout
    if not rollout.multi_turn.enable:
        return
    from rlpost.agent import AgentLoopConfig, AgentResources, check_samples

    agent_config = AgentLoopConfig.from_rollout_config(rollout)
    resources = AgentResources.from_config(agent_config)
    for key, dataset in datasets.items():
        if dataset is None:
            continue
        rows = getattr(dataset, "rows", None)  # RLHFDataset: the parquet rows, without tokenizing them
        try:
            check_samples(rows if rows is not None else [dataset[i] for i in range(len(dataset))], agent_config,
                          resources)
        except ValueError as err:
            raise ValueError(f"{key}={config.data.get(key.split('.')[1])}: {err}") from err


def load_tokenizer(config: PPOTrainerConfig):
    """The policy tokenizer, left padding for generation.

    Its folder is `data.tokenizer`, else `actor_rollout_ref.model.tokenizer_path`, else the model path;
    `actor_rollout_ref.model.custom_chat_template` replaces its chat template when set.
    """
    from rlpost.utils.model_files import check_tokenizer_folder
    from rlpost.utils.tokenizer import hf_tokenizer

    model = config.actor_rollout_ref.model
    key, path = next((k, v) for k, v in (("data.tokenizer", config.data.tokenizer),
                                          ("actor_rollout_ref.model.tokenizer_path", model.tokenizer_path),
                                          ("actor_rollout_ref.model.path", model.path)) if v)
    path = os.path.expanduser(path)
    if not os.path.isdir(path):
        raise InputError(f"{key}={path!r} is not a local folder; no model hub is used at run time: point it at a "
                         f"HF model folder (config.json + tokenizer), e.g. one made by scripts/make_tiny_model.py")
    check_tokenizer_folder(key, path)
    tok = hf_tokenizer(path, trust_remote_code=config.data.trust_remote_code)
    tok.padding_side = "left"
    if model.custom_chat_template is not None:
        tok.chat_template = model.custom_chat_template
    return tok


def build_reward_fns(config: PPOTrainerConfig, tokenizer, train_dataset=None, val_dataset=None):
    """Reward managers for training and validation. A rule-based reward is first checked on a few training
    and validation rows, and every row must carry the ground truth it scores against."""
    from rlpost.reward import RewardFunctionError, check_reward_fn, load_reward_manager, reward_fn_spec
    from rlpost.reward.preflight import check_code_tests, check_ground_truth

    kwargs = dict(config.reward_model.reward_kwargs)
    reward_fn = load_reward_manager(config, tokenizer, num_examine=0, **kwargs)
    val_reward_fn = load_reward_manager(config, tokenizer, num_examine=1, **kwargs)
    if config.reward_model.enable:
        return reward_fn, val_reward_fn
    builtin = config.custom_reward_function.path is None
    for key, dataset in (("data.train_files", train_dataset), ("data.val_files", val_dataset)):
        if dataset is not None:
            check_ground_truth(dataset, key, required=builtin)
            if builtin:  # the built-in code scorer's test cases; a custom function may read its own format
                check_code_tests(dataset, key, config.data.reward_fn_key)
            try:
                check_reward_fn(reward_fn_spec(config).resolve(), dataset, n=8, reward_fn_key=config.data.reward_fn_key)
            except RewardFunctionError as err:  # the sample index is a row of this key's data
                raise ValueError(f"{key}={config.data[key.split('.')[1]]}: {err}") from err
    return reward_fn, val_reward_fn
