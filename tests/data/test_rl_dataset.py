"""RLHFDataset: chat template (+ apply_chat_template_kwargs) and left padding, truncation modes, overlong
filter, max samples, custom class, errors for missing files/columns and unsupported columns, collate_fn.
The `data` group is composed from ppo_trainer.yaml (`data_cfg`)."""

from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from _compose import SMALL, compose_config
from rlpost import keys
from rlpost.data import RLHFDataset, collate_fn, create_rl_dataset


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def rows(questions, source="rlpost/arith"):
    return [{"data_source": source, "prompt": [{"role": "user", "content": q}],
             "reward_model": {"style": "rule", "ground_truth": str(i)},
             "extra_info": {"index": 100 + i, "split": "train"}} for i, q in enumerate(questions)]


def write(tmp_path, data, name="d.parquet"):
    path = tmp_path / name
    pd.DataFrame(data).to_parquet(path)
    return str(path)


def _show(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def data_cfg(*overrides: str, validate: bool = True, **values: Any):
    """The `data` group of the default config, max_prompt_length 32, with `data.<key>=<value>` for each of
    `values` (a dict value sets its children) and raw Hydra `overrides`."""
    dotted = []
    for key, value in values.items():
        items = value.items() if isinstance(value, dict) else [(None, value)]
        dotted += [f"data.{key}{'' if k is None else '.' + k}={_show(v)}" for k, v in items]
    return compose_config(*SMALL, "actor_rollout_ref.rollout.name=hf", "data.max_prompt_length=32", *dotted,
                          *overrides, validate=validate).data


def templated_ids(tokenizer, question):
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                         tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_item_left_padded_with_positions(tokenizer, tmp_path):
    ds = RLHFDataset(write(tmp_path, rows(["What is 1 + 2?"])), tokenizer, data_cfg(return_raw_chat=True,
                                                                                      return_full_prompt=True))
    item = ds[0]
    expected = templated_ids(tokenizer, "What is 1 + 2?")
    n, pad = len(expected), 32 - len(expected)
    assert item[keys.INPUT_IDS].shape == (32,)
    assert item[keys.INPUT_IDS][pad:].tolist() == expected
    assert (item[keys.INPUT_IDS][:pad] == tokenizer.pad_token_id).all()
    assert item[keys.ATTENTION_MASK].tolist() == [0] * pad + [1] * n
    assert item[keys.POSITION_IDS].tolist() == [0] * pad + list(range(n))
    assert item[keys.RAW_PROMPT_IDS] == expected
    assert item[keys.DATA_SOURCE] == "rlpost/arith" and item[keys.INDEX] == 100
    assert item[keys.REWARD_MODEL] == {"style": "rule", "ground_truth": "0"}
    assert item[keys.RAW_PROMPT] == [{"role": "user", "content": "What is 1 + 2?"}]
    assert item[keys.FULL_PROMPTS].endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("mode", ["left", "right", "middle"])
def test_truncation_modes(tokenizer, tmp_path, mode):
    question = "What is 1 + 2? " * 10
    full = templated_ids(tokenizer, question)
    ds = RLHFDataset(write(tmp_path, rows([question])), tokenizer, data_cfg(max_prompt_length=9, truncation=mode))
    ids = ds[0][keys.INPUT_IDS].tolist()
    expected = {"left": full[-9:], "right": full[:9], "middle": full[:4] + full[-5:]}[mode]
    assert ids == expected and ds[0][keys.ATTENTION_MASK].sum() == 9


def test_truncation_error_names_row_and_length(tokenizer, tmp_path):
    long_q = "What is 1 + 2? " * 10
    path = write(tmp_path, rows(["short", long_q]))
    n = len(templated_ids(tokenizer, long_q))
    with pytest.raises(ValueError, match=f"d.parquet row 1: prompt is {n} tokens.*max_prompt_length=16"):
        RLHFDataset(path, tokenizer, data_cfg(max_prompt_length=16))  # found at construction, not when drawn


def test_filter_overlong_prompts(tokenizer, tmp_path, caplog):
    data = rows(["short", "What is 1 + 2? " * 10, "also short"])
    limit = len(templated_ids(tokenizer, "also short"))  # the longest prompt kept: exactly at the limit
    ds = RLHFDataset(write(tmp_path, data), tokenizer,
                     data_cfg(max_prompt_length=limit, filter_overlong_prompts=True, filter_overlong_prompts_workers=2))
    assert len(ds) == 2 and [ds[i][keys.INDEX] for i in range(2)] == [100, 102]
    assert "filter_overlong_prompts: dropped 1 of 3 rows" in caplog.text
    assert f"data.max_prompt_length={limit} tokens" in caplog.text


def test_several_files_and_string_prompts(tokenizer, tmp_path):
    a = write(tmp_path, rows(["one"]), "a.parquet")
    b_rows = rows(["two", "three"])
    for r in b_rows:
        r["prompt"] = r["prompt"][0]["content"]  # plain strings are taken as one user message
    b = write(tmp_path, b_rows, "b.parquet")
    ds = RLHFDataset([a, b], tokenizer, data_cfg(return_raw_chat=True))
    assert len(ds) == 3 and ds[2][keys.RAW_PROMPT] == [{"role": "user", "content": "three"}]


def test_missing_file_and_column(tokenizer, tmp_path):
    with pytest.raises(FileNotFoundError, match="data file not found: /no/file.parquet"):
        RLHFDataset("/no/file.parquet", tokenizer, data_cfg())
    path = write(tmp_path, rows(["q"]))
    with pytest.raises(KeyError, match=r"data.prompt_key: column 'question' not found in .*d.parquet.*"
                                        r"available columns: \['data_source', 'prompt'"):
        RLHFDataset(path, tokenizer, data_cfg(prompt_key="question"))
    with pytest.raises(KeyError, match="data.reward_fn_key: column 'source'"):
        RLHFDataset(path, tokenizer, data_cfg(reward_fn_key="source"))


def test_image_column_for_a_text_only_model(tokenizer, tmp_path):
    data = rows(["q"])
    data[0]["images"] = ["img.png"]
    with pytest.raises(ValueError, match="holds images, but the model has no multimodal processor"):
        RLHFDataset(write(tmp_path, data), tokenizer, data_cfg())
    data[0]["images"] = None
    assert len(RLHFDataset(write(tmp_path, data), tokenizer, data_cfg())) == 1


def test_unknown_truncation(tokenizer, tmp_path):
    path = write(tmp_path, rows(["q"]))
    with pytest.raises(ValueError, match="data.truncation='cut'"):  # start-up refuses it too
        RLHFDataset(path, tokenizer, data_cfg(truncation="cut", validate=False))


# ChatML plus a switch like Qwen3's: with enable_thinking=false an empty think block closes the prompt.
THINKING_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and not enable_thinking %}{{ '<think>\n\n</think>\n\n' }}{% endif %}"
    "{% endif %}")


def test_apply_chat_template_kwargs_reach_the_template(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = THINKING_TEMPLATE
    path = write(tmp_path, rows(["What is 1 + 2?"]))
    plain = RLHFDataset(path, tok, data_cfg(return_full_prompt=True))
    assert plain.chat_template_kwargs == {} and plain[0][keys.FULL_PROMPTS].endswith("<|im_start|>assistant\n")
    off = RLHFDataset(path, tok, data_cfg("++data.apply_chat_template_kwargs.enable_thinking=false",
                                          return_full_prompt=True))
    text = off[0][keys.FULL_PROMPTS]
    assert text == plain[0][keys.FULL_PROMPTS] + "<think>\n\n</think>\n\n"
    assert off[0][keys.RAW_PROMPT_IDS] == tok(text, add_special_tokens=False)["input_ids"]  # what is generated from
    assert len(off[0][keys.RAW_PROMPT_IDS]) > len(plain[0][keys.RAW_PROMPT_IDS])


def test_max_samples_and_multi_modal_flag(tokenizer, tmp_path):
    path = write(tmp_path, rows(["a", "b", "c", "d"]))
    cfg = data_cfg(train_max_samples=3, val_max_samples=1, return_raw_chat=True)
    train, val = create_rl_dataset(path, cfg, tokenizer), create_rl_dataset(path, cfg, tokenizer, is_train=False)
    assert [train[i][keys.INDEX] for i in range(len(train))] == [100, 101, 102] and len(val) == 1
    assert len(create_rl_dataset(path, data_cfg(), tokenizer)) == 4  # -1: all rows
    text_only = RLHFDataset(path, tokenizer, data_cfg(return_multi_modal_inputs=False))[0]
    assert set(text_only) == set(RLHFDataset(path, tokenizer, data_cfg())[0])  # text rows: no effect


def test_collate_fn(tokenizer, tmp_path):
    ds = RLHFDataset(write(tmp_path, rows(["a", "bb b", "c"])), tokenizer, data_cfg(return_raw_chat=True))
    batch = collate_fn([ds[i] for i in range(3)])
    assert batch[keys.INPUT_IDS].shape == (3, 32) and batch[keys.INPUT_IDS].dtype == torch.long
    assert isinstance(batch[keys.RAW_PROMPT_IDS], np.ndarray) and batch[keys.RAW_PROMPT_IDS].shape == (3,)
    assert batch[keys.RAW_PROMPT].dtype == object and isinstance(batch[keys.RAW_PROMPT][0], list)
    assert batch[keys.DATA_SOURCE].tolist() == ["rlpost/arith"] * 3

    from rlpost.protocol import DataProto

    proto = DataProto.from_single_dict(batch)
    assert len(proto) == 3 and keys.REWARD_MODEL in proto.non_tensor_batch


def test_custom_cls(tokenizer, tmp_path):
    src = tmp_path / "my_ds.py"
    src.write_text(
        "from rlpost.data import RLHFDataset\n"
        "class TaggedDataset(RLHFDataset):\n"
        "    def __getitem__(self, i):\n"
        "        item = super().__getitem__(i)\n"
        "        item['tag'] = 'custom'\n"
        "        return item\n"
        "class NotADataset:\n"
        "    pass\n"
    )
    path = write(tmp_path, rows(["q"]))
    cfg = data_cfg(custom_cls={"path": str(src), "name": "TaggedDataset"})
    ds = create_rl_dataset(path, cfg, tokenizer)
    assert type(ds).__name__ == "TaggedDataset" and ds[0]["tag"] == "custom"
    with pytest.raises(TypeError, match="NotADataset .* must be a subclass"):
        create_rl_dataset(path, data_cfg(custom_cls={"path": str(src), "name": "NotADataset"}), tokenizer)
    with pytest.raises(ValueError, match="data.custom_cls.name: 'Missing' not found"):
        create_rl_dataset(path, data_cfg(custom_cls={"path": str(src), "name": "Missing"}), tokenizer)
    with pytest.raises(FileNotFoundError, match="data.custom_cls.path: file not found"):
        create_rl_dataset(path, data_cfg(custom_cls={"path": "/no/ds.py", "name": "X"}), tokenizer)


def test_tokenizer_override_and_raw_input_ids(tokenizer, tiny_model_dir, tmp_path):
    path = write(tmp_path, rows(["What is 1 + 2?"]))
    ds = create_rl_dataset(path, data_cfg(tokenizer=tiny_model_dir, return_raw_input_ids=True), None)
    assert ds.tokenizer is not None and ds.tokenizer.pad_token_id == tokenizer.pad_token_id
    assert ds[0]["raw_input_ids"] == tokenizer("What is 1 + 2?", add_special_tokens=False)["input_ids"]


CALCULATOR_YAML = "tools:\n  - class_name: rlpost.tools.calculator_tool.CalculatorTool\n    config: {type: native}\n"


def test_multi_turn_fields_and_tool_schemas_in_the_prompt(tokenizer, tmp_path):
    tools = tmp_path / "tools.yaml"
    tools.write_text(CALCULATOR_YAML)
    data = rows(["What is 1 + 2?", "What is 3 * 4?"])
    data[0]["extra_info"]["tools_kwargs"] = {"calculator": {"create_kwargs": {"x": 1}}}
    data[1]["extra_info"]["interaction_kwargs"] = {"name": "gsm8k", "ground_truth": "12"}
    for row, name in zip(data, ["tool_agent", "single_turn_agent"]):
        row["agent_name"] = name
    cfg = data_cfg(f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
                   "actor_rollout_ref.rollout.multi_turn.enable=true", max_prompt_length=512)
    assert cfg.tool_config_path == str(tools) and cfg.return_raw_chat  # both follow multi_turn
    ds = RLHFDataset(write(tmp_path, data), tokenizer, cfg)
    first, second = ds[0], ds[1]
    assert (first[keys.AGENT_NAME], second[keys.AGENT_NAME]) == ("tool_agent", "single_turn_agent")
    assert first[keys.TOOLS_KWARGS] == {"calculator": {"create_kwargs": {"x": 1}}} and second[keys.TOOLS_KWARGS] == {}
    assert first[keys.INTERACTION_KWARGS] == {} and second[keys.INTERACTION_KWARGS]["ground_truth"] == "12"
    from rlpost.tools.calculator_tool import CalculatorTool

    schema = CalculatorTool({}, None).tool_schema.model_dump()
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is 1 + 2?"}], tools=[schema],
                                         add_generation_prompt=True, tokenize=False)
    assert "# Tools" in text and first[keys.RAW_PROMPT_IDS] == tokenizer(text, add_special_tokens=False)["input_ids"]
    batch = collate_fn([first, second])
    assert list(batch[keys.AGENT_NAME]) == ["tool_agent", "single_turn_agent"]

    # overlong filtering counts the schema tokens; without the agent_name column rows carry no agent_name
    short = len(templated_ids(tokenizer, "What is 1 + 2?"))
    for row in data:
        del row["agent_name"]
    filtered = RLHFDataset(write(tmp_path, data, "plain.parquet"), tokenizer,
                           data_cfg(f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
                                    "actor_rollout_ref.rollout.multi_turn.enable=true", max_prompt_length=short + 2,
                                    filter_overlong_prompts=True))
    assert len(filtered) == 0
    plain = RLHFDataset(write(tmp_path, data, "plain.parquet"), tokenizer, data_cfg(max_prompt_length=256))
    assert keys.AGENT_NAME not in plain[0] and plain[1][keys.TOOLS_KWARGS] == {}


def test_response_caps_reach_the_batch_and_bad_caps_name_the_row(tokenizer, tmp_path):
    data = rows(["What is 1 + 2?", "And 3 + 4?"])
    for i, row in enumerate(data):
        row["extra_info"]["response_caps"] = [5 + i, 9]
    ds = RLHFDataset(write(tmp_path, data), tokenizer, data_cfg())
    assert ds[1][keys.RESPONSE_CAPS] == [6, 9]
    batch = collate_fn([ds[0], ds[1]])
    assert [list(c) for c in batch[keys.RESPONSE_CAPS]] == [[5, 9], [6, 9]]
    data[1]["extra_info"]["response_caps"] = [0]
    with pytest.raises(ValueError, match=r"d2.parquet: data row 1: extra_info.response_caps=.*positive ints"):
        RLHFDataset(write(tmp_path, data, "d2.parquet"), tokenizer, data_cfg())
    del data[1]["extra_info"]["response_caps"]
    with pytest.raises(ValueError, match=r"d3.parquet row 1: extra_info has no response_caps"):
        RLHFDataset(write(tmp_path, data, "d3.parquet"), tokenizer, data_cfg())
