"""Ask a running server (examples/serve_v100.sh) the seeds' question, streaming the answer.

    API_KEY=... python examples/openai_client.py [--base-url http://127.0.0.1:8000/v1]
Needs `pip install openai`.
"""

from __future__ import annotations

import argparse
import os

QUESTION = "What is the KV cache and why does it matter for long contexts?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default=os.environ.get("API_KEY", "EMPTY"), help="the server's --api-key "
                        "(default: $API_KEY)")
    parser.add_argument("--max-tokens", type=int, default=512)
    args = parser.parse_args()

    from openai import OpenAI

    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    model = client.models.list().data[0].id  # the server serves one model; its id is the path it was started with
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": QUESTION}], max_tokens=args.max_tokens,
        temperature=0.7, stream=True)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
    print()


if __name__ == "__main__":
    main()
