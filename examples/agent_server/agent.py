"""An agent that knows nothing of rlpost: it talks to "a model" through the `openai` client, as it would to any
OpenAI-compatible service, and grades its own answer.

    OPENAI_BASE_URL=... OPENAI_API_KEY=... python examples/agent_server/agent.py

It reads its task from the JSON file named by RLPOST_ROW_FILE (the row's chat `messages` and `reward_model`),
asks the model, then asks it once more to check its answer (a second turn whose user text the agent wrote:
rlpost trains on the model's turns only), and prints `{"reward": ...}` as its last line (1.0 when the final
answer holds the right number after ####, else 0.0).
"""

import json
import os
import re

from openai import OpenAI


def main() -> None:
    with open(os.environ["RLPOST_ROW_FILE"]) as f:
        row = json.load(f)
    client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    model = os.environ.get("OPENAI_MODEL", "gpt-4o-mini")
    messages = list(row["messages"])
    first = client.chat.completions.create(model=model, messages=messages, max_tokens=24)
    messages.append({"role": "assistant", "content": first.choices[0].message.content or ""})
    messages.append({"role": "user", "content": "Check it. Answer with #### followed by the number."})
    answer = ""
    for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=24, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            answer += chunk.choices[0].delta.content
    truth = str((row.get("reward_model") or {}).get("ground_truth", ""))
    found = re.findall(r"####\s*(-?\d+)", answer)
    print(json.dumps({"reward": 1.0 if found and found[-1] == truth else 0.0}))


if __name__ == "__main__":
    main()
