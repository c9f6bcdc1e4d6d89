"""Gsm8kInteraction (wrong -> retry message, right -> terminate) and the interaction YAML loader."""

import asyncio

import pytest

from rlpost.interactions.base import BaseInteraction
from rlpost.interactions.gsm8k_interaction import CORRECT, INCORRECT, Gsm8kInteraction
from rlpost.interactions.utils.interaction_registry import (
    default_interaction_name,
    initialize_interactions_from_config,
    interactions_by_name,
)
from rlpost.tools.utils.yaml_entries import ConfigEntryError


def test_wrong_then_right():
    interaction = Gsm8kInteraction({"name": "gsm8k"})

    async def go():
        iid = await interaction.start_interaction("r1", ground_truth="18", name="gsm8k")
        history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "I think #### 17"}]
        wrong = await interaction.generate_response(iid, history)
        history += [{"role": "user", "content": wrong[1]}, {"role": "assistant", "content": "#### 18"}]
        right = await interaction.generate_response(iid, history)
        score = await interaction.calculate_score(iid)
        await interaction.finalize_interaction(iid)
        return iid, wrong, right, score

    iid, wrong, right, score = asyncio.run(go())
    assert iid == "r1"
    assert wrong == (False, INCORRECT, 0.0, {})
    assert right == (True, CORRECT, 1.0, {})
    assert score == 1.0
    assert interaction._instances == {}


def test_no_assistant_message_scores_zero():
    interaction = Gsm8kInteraction({})

    async def go():
        iid = await interaction.start_interaction(ground_truth="3")
        return await interaction.generate_response(iid, [{"role": "user", "content": "3"}])

    assert asyncio.run(go()) == (False, INCORRECT, 0.0, {})
    assert interaction.name == "interaction_agent"


def test_default_name():
    assert default_interaction_name("pkg.mod.Gsm8kInteraction") == "gsm8k"
    assert default_interaction_name("pkg.mod.Judge") == "judge"


def test_loader(tmp_path):
    path = tmp_path / "interaction.yaml"
    path.write_text("""interaction:
  - name: grader
    class_name: rlpost.interactions.gsm8k_interaction.Gsm8kInteraction
    config: {hint: 1}
  - class_name: rlpost.interactions.base.BaseInteraction
    config: {}
""")
    interactions = initialize_interactions_from_config(path)
    assert sorted(interactions) == ["base", "grader"]
    assert isinstance(interactions["grader"], Gsm8kInteraction)
    assert interactions["grader"].config == {"hint": 1, "name": "grader"} and interactions["grader"].name == "grader"
    assert type(interactions["base"]) is BaseInteraction
    assert interactions_by_name(None) == {}


@pytest.mark.parametrize(
    "entries, fragments",
    [
        ("  - name: x\n    class_name: nope_pkg.Interaction\n", ["interaction[1]", "unknown interaction class"]),
        ("  - name: g\n    class_name: rlpost.interactions.base.BaseInteraction\n",
         ["interaction[1]", "duplicate interaction name 'g'"]),
        ("  - name: x\n    class_name: collections.OrderedDict\n", ["interaction[1]", "must subclass"]),
        ("  - name: x\n", ["interaction[1]", "missing 'class_name'"]),
    ],
)
def test_loader_errors_name_the_entry(tmp_path, entries, fragments):
    path = tmp_path / "interaction.yaml"
    path.write_text("interaction:\n  - name: g\n    class_name: rlpost.interactions.base.BaseInteraction\n" + entries)
    with pytest.raises(ConfigEntryError) as err:
        initialize_interactions_from_config(path)
    assert str(err.value).startswith(f"{path}: ")
    for fragment in fragments:
        assert fragment in str(err.value)
